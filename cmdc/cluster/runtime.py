"""cmdc agents on a Ray cluster (extra `ray`): `async with cmdc.ray.open_cluster(...) as rt`.

The cluster runtime has the face of `open_runtime`'s (`spawn`, `get`/`whereis`, `agents`,
`subscribe`; handles with `prompt`, `send`, `state`, `compact`, `ping`, `abort`, `stop`,
`queued`, `clear_queued`), and its agents live in Ray actors:

- **Nodes.** One node actor per Ray node (pinned to it), each hosting an ordinary cmdc runtime
  (`open_runtime` on trio, in a thread of its own) with virtual agents and name leases on the
  shared store. Ray is the engine: placement of the node actors, their calls, failure detection.
- **Placement by name.** An agent lives on the node that rendezvous hashing picks for its name
  among the live nodes that had joined when it was spawned; the node activates it from the
  store on its first call (`spawn` with `resume=True` in its runtime). When a node dies only its
  own agents move; a node that joins later (found every `discover_every` seconds) takes a share
  of the agents spawned after it joined, and no live agent moves.
- **Temporary children** (`delegate` without an agent) run on their parent's node, within its
  turn; named agents are reached on whatever node they live on.
- **One place at a time.** Every resident name is leased in the store to its node's runtime
  (`open_runtime(lease_ttl=...)`): a second activation elsewhere gets `NameLeased` (it waits
  out the lease, then takes it), and a node whose lease was broken cannot write any more
  (`LeaseLost`, by the lease's fencing token).
- **Failure.** A call that finds its node dead (`RayActorError`) marks the node dead, kills its
  actor and breaks its leases in the store (after which nothing it still does can commit), and
  drops it from the placement: the next call activates its agents on another node from their
  last commit. A read (`state`, `ping`, `queued`) is retried there at once. A turn that was in
  flight is settled from the store: if its user message is in the agent's committed state, the
  caller gets the committed reply (the turn finished before the crash); otherwise it gets
  `NodeLost`, and the turn never will commit (fencing), so retrying it is the caller's call (it
  is not retried here: its tools may have acted). A message `send` acknowledged is held by the
  caller's handle until a turn commits it: if the node dies first, it is queued again on the
  agent's new node (unless its checkpoint or journal has it). An acknowledged turn (its reply
  returned) is committed in the store before the reply leaves the node: never lost.

The bridge between Ray and trio is here alone: Ray calls into a node's trio thread through
`trio.from_thread.run`, and trio code awaits an `ObjectRef` through its future's done-callback
(`trio_token.run_sync_soon`), never blocking the trio thread. The caller's calls to a node are
batched (`_Bridge`): the calls made while one batch travels go in the next, and one long poll
brings back every answer ready, so no turn holds a Ray thread and a turn costs a fraction of a
Ray call. The spawn specs (provider, tools,
plugins, ...) travel to every node through Ray's object store and are kept in each node's
memory and in the caller's: the registry of names lives in the process that opened the cluster.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import os
import pickle
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import attrs
import ray
import ray.exceptions
import trio
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .._check import optional_integer, optional_seconds
from ..compaction import Compacted, Skipped
from ..compaction.summary import Summarizer
from ..errors import (
    AgentNotFound,
    AgentStopped,
    CmdcError,
    ConfigError,
    DelegationRefused,
    NameLeased,
    NodeLost,
    TurnAborted,
)
from ..events import Event
from ..message import Message
from ..plugins import Plugin
from ..providers.base import Provider
from ..runtime.delegation import matches, naming_targets, patterns
from ..runtime.mailbox import as_messages, current_chain
from ..runtime.options import AgentOptions
from ..runtime.runtime import Runtime, open_runtime
from ..state import State, validate_agent_id
from ..store import Leases, Store, open_store
from ..tools import Tool, tool

_DEAD = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
# Retried on another node after a node died: reads, and what is done anyway once a node is gone.
_RETRIED = frozenset({"state", "ping", "queued", "spawn", "stop", "abort"})


# -- the bridge --------------------------------------------------------------------------------
async def _await_ref(ref: Any) -> Any:
    """The value of a Ray `ObjectRef`, awaited from trio without blocking its thread: Ray's
    future wakes the trio task through the run's token. Cancelling the wait does not cancel the
    remote call (the caller decides what to do about it)."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_future: object) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    future = ref.future()
    future.add_done_callback(wake)
    await done.wait()
    return future.result()


def _portable(exc: Exception) -> Exception:
    """`exc`, or a `CmdcError` saying what it was if it cannot be pickled (one such error
    must not spoil a batch of answers)."""
    try:
        pickle.dumps(exc)
    except Exception:
        return CmdcError(f"{type(exc).__name__}: {exc}")
    return exc


class _NodeDied(Exception):
    """The node actor of a bridge is dead (raised to the callers waiting on it)."""


@attrs.define
class _Pending:
    done: trio.Event = attrs.Factory(trio.Event)
    answer: tuple[bool, Any] = (False, None)
    dead: bool = False


class _Bridge:
    """The caller's calls to one node, batched: the calls made while a batch is on its way go
    together in the next `submit`, and one long-polled `results` call brings back every answer
    ready. Per turn, this costs a fraction of a Ray call on each side (one Ray call per turn,
    each holding a node thread for the whole turn, cost the node more CPU than the turn)."""

    def __init__(self, node: _NodeRef) -> None:
        self.node = node
        self._ids = itertools.count()
        self._waiting: dict[int, _Pending] = {}
        self._outbox: list[tuple[int, str, str, tuple[Any, ...]]] = []
        self._work = trio.Event()
        self.dead = False

    async def call(self, name: str, op: str, args: tuple[Any, ...]) -> Any:
        if self.dead:
            raise _NodeDied(self.node.key)
        call_id = next(self._ids)
        pending = self._waiting[call_id] = _Pending()
        self._outbox.append((call_id, name, op, args))
        self._work.set()
        try:
            await pending.done.wait()
        finally:
            self._waiting.pop(call_id, None)
        if pending.dead:
            raise _NodeDied(self.node.key)
        return _unwrap(pending.answer)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._send)
            nursery.start_soon(self._receive)

    async def _send(self) -> None:
        while not self.dead:
            await self._work.wait()
            self._work = trio.Event()
            batch, self._outbox = self._outbox, []
            await self._submit(batch)

    async def _submit(self, batch: list[tuple[int, str, str, tuple[Any, ...]]]) -> None:
        try:
            await _await_ref(self.node.handle.submit.remote(batch))
        except _DEAD:
            self._die()
        except Exception as exc:  # something Ray could not carry: try each call alone
            if len(batch) > 1:
                for one in batch:
                    await self._submit([one])
                return
            pending = self._waiting.get(batch[0][0])
            if pending is not None:
                pending.answer = (False, exc)
                pending.done.set()

    async def _receive(self) -> None:
        while not self.dead:
            try:
                ok, answers = await _await_ref(self.node.handle.results.remote(1.0))
            except _DEAD:
                self._die()
                return
            if not ok:  # the node's runtime is gone (closing): do not spin
                await trio.sleep(0.1)
                continue
            for call_id, good, value in answers:
                pending = self._waiting.get(call_id)
                if pending is not None:
                    pending.answer = (good, value)
                    pending.done.set()

    def _die(self) -> None:
        self.dead = True
        for pending in self._waiting.values():
            pending.dead = True
            pending.done.set()


def _unwrap(answer: tuple[bool, Any]) -> Any:
    ok, value = answer
    if not ok:
        raise value
    return value


@attrs.frozen
class _Spec:
    """What it takes to start an agent on any node."""

    provider: Provider
    instructions: str | None
    tools: tuple[Tool, ...]
    plugins: tuple[Plugin, ...]
    config: Mapping[str, Any] | None
    summarizer: Summarizer | None
    options: AgentOptions
    recall: bool
    targets: tuple[str, ...] | None  # agents it may delegate to besides its children (None: no delegate)
    accepts: tuple[str, ...] | None  # whose delegated tasks it takes (None: nobody's)
    gen: int = 0  # the newest node (by join number) when it was spawned: see _place


def _place(name: str, nodes: Mapping[str, int], gen: int) -> str:
    """The node of an agent: rendezvous hashing of its name over the live nodes (key -> join
    number) that had joined when it was spawned (join number <= `gen`), or over all live nodes
    if none of those is left. So a node's death moves only its own agents, and a node that joins
    later takes a share of the agents spawned after it joined and moves none of the others (an
    agent moving between two live nodes would wait out its lease and strand its queue)."""
    if not nodes:
        raise NodeLost("no cluster node is alive")
    eligible = [k for k, seq in nodes.items() if seq <= gen] or list(nodes)
    return max(eligible, key=lambda n: hashlib.blake2b(f"{n}\x00{name}".encode(), digest_size=8).digest())


# -- the node actor: a cmdc runtime on trio in a thread of a Ray actor ------------------------
class _Host:
    """What a node actor holds: a cmdc runtime on trio in a thread of its own. The actor's
    methods (called by Ray in its threads) run coroutines here on that trio thread."""

    def __init__(self, key: str, store: str, options: dict[str, Any]) -> None:
        self.key = key
        self.owner = f"ray:{key}:{os.getpid()}:{secrets.token_hex(4)}"
        self._store_spec = store
        self._options = options
        self._specs: dict[str, _Spec] = {}
        self._nodes: dict[str, Any] = {}  # key -> actor handle (the live nodes, as last told)
        self._seqs: dict[str, int] = {}  # key -> join number, of the live nodes
        self._dead: set[str] = set()
        self._starting: dict[str, trio.Event] = {}
        self._subs: dict[str, Any] = {}
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self.rt: Runtime | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._closing: trio.Event | None = None
        self._tid = 0
        # The caller's batched calls (submit / results): answers waiting to be collected.
        self._calls: trio.Nursery | None = None
        self._done: list[tuple[int, bool, Any]] = []
        self._wake: trio.Event | None = None
        self._thread = threading.Thread(target=self._thread_main, name=f"cmdc-node-{key}", daemon=True)
        self._thread.start()
        self._ready.wait(120)
        if self._failed is not None:
            raise self._failed
        if self._token is None:
            raise CmdcError(f"cluster node {key}: its runtime did not start within 120 s")

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            self._failed = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        async with (
            open_runtime(
                store=self._store_spec,
                lease_ttl=self._options["lease_ttl"],
                lease_owner=self.owner,
                max_resident=self._options["max_resident"],
                deactivate_after=self._options["deactivate_after"],
                log_events=False,
            ) as rt,
            trio.open_nursery() as calls,
        ):
            self.rt = rt
            self._calls = calls
            self._wake = trio.Event()
            self._closing = trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            self._tid = threading.get_native_id()
            self._ready.set()
            await self._closing.wait()
            calls.cancel_scope.cancel()

    def _run(self, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        try:
            return True, trio.from_thread.run(fn, *args, trio_token=self._token)
        except BaseException as exc:  # goes back to the caller as itself
            return False, exc

    # -- what the caller (or another node) asks --------------------------------------------------
    def info(self) -> tuple[str, str]:
        return self.key, self.owner

    def set_nodes(self, nodes: dict[str, tuple[Any, int]], dead: dict[str, str]) -> None:
        """The live nodes (key -> handle, join number) and the owners of dead ones (key ->
        owner): their leases may be taken over without waiting for them to expire."""
        self._nodes = {k: h for k, (h, _) in nodes.items()}
        self._seqs = {k: seq for k, (_, seq) in nodes.items()}
        self._dead |= set(dead)
        if self.rt is not None:
            self.rt.lease_takeover |= set(dead.values())

    def register(self, name: str, spec: _Spec) -> None:
        self._specs[name] = spec

    def register_many(self, specs: dict[str, _Spec]) -> None:
        self._specs.update(specs)

    def forget(self, name: str) -> tuple[bool, Any]:
        self._specs.pop(name, None)
        return self._run(self._forget, name)

    def call(
        self, name: str, op: str, args: tuple[Any, ...], chain: tuple[str, ...], sender: str | None
    ) -> tuple[bool, Any]:
        return self._run(self._call, name, op, args, chain, sender)

    def submit(self, batch: list[tuple[int, str, str, tuple[Any, ...]]]) -> None:
        """Start the caller's calls `(id, agent, op, args)` on the trio thread; their answers
        are collected by `results`. One Ray call for many calls, none holding a Ray thread."""
        trio.from_thread.run_sync(self._start, batch, trio_token=self._token)

    def results(self, wait: float) -> tuple[bool, Any]:
        """The answers `(id, ok, value)` of submitted calls finished since the last look; waits
        up to `wait` seconds for one."""
        return self._run(self._collect, wait)

    def subscribe(self, sub: str, agent: str | None, buffer: int) -> None:
        assert self.rt is not None and self._token is not None
        rt = self.rt
        self._subs[sub] = trio.from_thread.run_sync(lambda: rt.subscribe(agent, buffer=buffer), trio_token=self._token)

    def poll(self, sub: str, wait: float) -> tuple[bool, Any]:
        return self._run(self._poll, sub, wait)

    def unsubscribe(self, sub: str) -> None:
        s = self._subs.pop(sub, None)
        if s is not None and self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(s.close, trio_token=self._token)

    def stats(self) -> dict[str, int]:
        if self.rt is None:
            return {}
        cpu_ms = int(time.process_time() * 1000)  # the node process's CPU so far (all its threads)
        return {
            **self.rt.stats,
            "specs": len(self._specs),
            "pid": os.getpid(),
            "cpu_ms": cpu_ms,
            "trio_tid": self._tid,  # the trio thread's native id (/proc/PID/task/TID)
        }

    def close(self) -> None:
        token, closing = self._token, self._closing
        if token is not None and closing is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(closing.set, trio_token=token)
        self._thread.join(30)

    # -- on the trio thread ----------------------------------------------------------------------
    def _start(self, batch: list[tuple[int, str, str, tuple[Any, ...]]]) -> None:
        assert self._calls is not None
        for call_id, name, op, args in batch:
            self._calls.start_soon(self._serve, call_id, name, op, args)

    async def _serve(self, call_id: int, name: str, op: str, args: tuple[Any, ...]) -> None:
        try:
            item: tuple[int, bool, Any] = (call_id, True, await self._call(name, op, args, (), None))
        except Exception as exc:
            item = (call_id, False, _portable(exc))
        self._done.append(item)
        assert self._wake is not None
        self._wake.set()

    async def _collect(self, wait: float) -> list[tuple[int, bool, Any]]:
        assert self._wake is not None
        if not self._done:
            with trio.move_on_after(wait):
                await self._wake.wait()
        done, self._done = self._done, []
        self._wake = trio.Event()
        return done

    async def _poll(self, sub: str, wait: float) -> list[Event] | None:
        s = self._subs.get(sub)
        if s is None:
            return None
        out: list[Event] = []
        with trio.move_on_after(wait):
            try:
                out.append(await s.receive())
            except trio.EndOfChannel:
                return None
        while True:  # and whatever else is buffered
            try:
                out.append(s.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                return out

    async def _forget(self, name: str) -> None:
        assert self.rt is not None
        ref = self.rt.whereis(name)
        if ref is not None:
            await ref.stop()

    async def _local(self, name: str, fresh: bool = False) -> Any:
        """The agent in this node's runtime, spawned (activated from the store) if need be."""
        assert self.rt is not None
        while True:
            ref = self.rt.whereis(name)
            if ref is not None:
                return ref
            starting = self._starting.get(name)
            if starting is not None:
                await starting.wait()
                continue
            spec = self._specs.get(name)
            if spec is None:
                raise AgentNotFound(f"no agent of the cluster is called {name!r}")
            self._starting[name] = trio.Event()
            try:
                if fresh and self.rt.checkpoints is not None:
                    await self.rt.checkpoints.delete(name)  # a new agent: no earlier life's state
                tools = spec.tools
                if spec.targets is not None:
                    tools = (*tools, _cluster_delegate(self, name, spec.targets, spec.options.max_delegation_depth))
                return await self.rt.spawn(
                    name,
                    spec.provider,
                    instructions=spec.instructions,
                    tools=tools,
                    plugins=spec.plugins,
                    config=spec.config,
                    summarizer=spec.summarizer,
                    options=spec.options,
                    recall=spec.recall,
                    resume=not fresh,
                )
            finally:
                self._starting.pop(name).set()

    async def _call(self, name: str, op: str, args: tuple[Any, ...], chain: tuple[str, ...], sender: str | None) -> Any:
        if sender is not None:  # a delegated task: the target must accept it
            spec = self._specs.get(name)
            if spec is None:
                raise DelegationRefused(f"no agent of the cluster is called {name!r}")
            if not matches(sender, spec.accepts):
                raise DelegationRefused(f"agent {name!r} does not accept delegated tasks from {sender!r}")
        ttl = self._options["lease_ttl"]
        with trio.fail_after(ttl * 2 + 30):  # a lease held elsewhere expires within ttl
            while True:
                try:
                    return await self._op(name, op, args, chain)
                except NameLeased:
                    # Another node holds the name: it is being moved (a dead node's lease
                    # not yet broken, or expiring). Nothing ran here: wait and try again.
                    await trio.sleep(0.2)

    async def _op(self, name: str, op: str, args: tuple[Any, ...], chain: tuple[str, ...]) -> Any:
        if op == "spawn":
            await self._local(name, fresh=bool(args[0]))
            return None
        if op in ("stop", "abort") and self.rt is not None and self.rt.whereis(name) is None:
            return None  # not here: nothing to stop or abort
        ref = await self._local(name)
        token = current_chain.set(chain)
        try:
            if op == "prompt":
                return await ref.prompt(args[0])
            if op == "send":
                return await ref.send(args[0])
            if op == "state":
                return await ref.state()
            if op == "compact":
                return await ref.compact(args[0])
            if op == "ping":
                return await ref.ping()
            if op == "queued":
                return ref.queued()
            if op == "clear_queued":
                return ref.clear_queued()
            if op == "abort":
                return ref.abort()
            if op == "stop":
                return await ref.stop()
        finally:
            current_chain.reset(token)
        raise ConfigError(f"unknown cluster operation {op!r}")

    async def call_agent(self, name: str, op: str, args: tuple[Any, ...], chain: tuple[str, ...], sender: str) -> Any:
        """A call from one of this node's agents to an agent of the cluster (delegation)."""
        live = {k: seq for k, seq in self._seqs.items() if k in self._nodes and k not in self._dead}
        spec = self._specs.get(name)
        key = _place(name, live, max(live.values(), default=0) if spec is None else spec.gen)
        if key == self.key:
            return await self._call(name, op, args, chain, sender)
        try:
            answer = await _await_ref(self._nodes[key].call.remote(name, op, args, chain, sender))
        except _DEAD:
            self._dead.add(key)
            raise NodeLost(f"cluster node {key} died while agent {name!r} worked on a delegated task") from None
        return _unwrap(answer)


class Node:
    """One node of the cluster (a Ray actor, pinned to a Ray node, threaded: `max_concurrency`
    calls at once). Its methods are all synchronous (an `async def` would make Ray run the actor
    on asyncio): each runs a coroutine on the node's trio thread and returns `(ok, value)`."""

    def __init__(self, key: str, store: str, options: dict[str, Any]) -> None:
        self._host = _Host(key, store, options)

    def info(self) -> tuple[str, str]:
        return self._host.info()

    def set_nodes(self, nodes: dict[str, tuple[Any, int]], dead: dict[str, str]) -> None:
        self._host.set_nodes(nodes, dead)

    def register(self, name: str, spec: _Spec) -> None:
        self._host.register(name, spec)

    def register_many(self, specs: dict[str, _Spec]) -> None:
        self._host.register_many(specs)

    def forget(self, name: str) -> tuple[bool, Any]:
        return self._host.forget(name)

    def call(
        self, name: str, op: str, args: tuple[Any, ...], chain: tuple[str, ...], sender: str | None
    ) -> tuple[bool, Any]:
        return self._host.call(name, op, args, chain, sender)

    def submit(self, batch: list[tuple[int, str, str, tuple[Any, ...]]]) -> None:
        self._host.submit(batch)

    def results(self, wait: float) -> tuple[bool, Any]:
        return self._host.results(wait)

    def subscribe(self, sub: str, agent: str | None, buffer: int) -> None:
        self._host.subscribe(sub, agent, buffer)

    def poll(self, sub: str, wait: float) -> tuple[bool, Any]:
        return self._host.poll(sub, wait)

    def unsubscribe(self, sub: str) -> None:
        self._host.unsubscribe(sub)

    def stats(self) -> dict[str, int]:
        return self._host.stats()

    def close(self) -> None:
        self._host.close()


def _cluster_delegate(node: _Host, parent: str, targets: tuple[str, ...], depth: int) -> Tool:
    async def delegate(task: str, agent: str | None = None) -> str:
        """Hand a task to another agent and return its final answer.

        Args:
            task: What the other agent should do, with everything it needs to know.
            agent: The name of an agent of the cluster you were allowed to delegate to; leave it
                out to have a temporary child agent do it.
        """
        chain = current_chain.get()
        if len(chain) >= depth:
            raise DelegationRefused(f"delegation depth limit ({depth}) reached: {' -> '.join(chain)}")
        if agent is None:
            # A temporary child lives and ends within its parent's turn: on the parent's node,
            # in that node's runtime (leased and journaled in the shared store like any agent).
            if node.rt is None:
                raise AgentStopped(f"agent {parent!r}: its cluster node is closing")
            return await node.rt.run_child(parent, task)
        if not matches(agent, targets):
            allowed = ", ".join(targets) if targets else "none"
            raise DelegationRefused(
                f"agent {parent!r} may not delegate to {agent!r}: it may delegate to its own temporary "
                f"children (leave out 'agent') and to these agents: {allowed}"
            )
        if agent in chain:
            raise DelegationRefused(
                f"delegation refused: {agent!r} is already waiting on this task ({' -> '.join(chain)}); "
                "handing it this task would deadlock both. Do the task yourself."
            )
        reply: Message = await node.call_agent(agent, "prompt", (task,), chain, parent)
        return reply.text

    return naming_targets(tool(delegate, name="delegate"), targets or None)


# -- the caller's side -----------------------------------------------------------------------
@attrs.define
class _NodeRef:
    key: str
    owner: str
    handle: Any
    seq: int = 0  # join number: 0, 1, ... in the order nodes joined the cluster runtime
    node_id: str = ""  # the Ray node it is pinned to


class ClusterAgentRef:
    """The handle of an agent of the cluster: the methods of `AgentRef`, over Ray."""

    __slots__ = ("_acked", "_cluster", "_held", "_stopped", "_where", "name")

    def __init__(self, cluster: ClusterRuntime, name: str) -> None:
        self._cluster = cluster
        self.name = name
        self._stopped = False
        # Messages sent to the agent and not known to be committed (id -> message), and which
        # of them `send` acknowledged: if the agent's node dies they are queued on its new node.
        self._held: dict[str, Message] = {}
        self._where: dict[str, str] = {}  # id -> the node it was queued on
        self._acked: set[str] = set()

    def __repr__(self) -> str:
        return f"<ClusterAgentRef {self.name!r}>"

    async def _op(self, op: str, *args: Any) -> Any:
        if self._stopped:
            raise AgentStopped(f"agent {self.name!r} has stopped")
        return await self._cluster._invoke(self.name, op, args)

    async def prompt(self, content: str | Message | Sequence[Message]) -> Message:
        """Run a turn on the agent's node; return the final reply (committed in the store).
        `NodeLost` if the node died during the turn and the turn did not commit."""
        messages = as_messages(content)
        taken = [mid for mid in self._held if mid in self._acked]  # queued before this turn: it takes them
        try:
            reply: Message = await self._op("prompt", messages)
        except NodeLost:
            settled = await self._cluster._settle(self.name, messages)
            if settled is None:
                raise
            self._release(taken)
            return settled
        except (TurnAborted, trio.Cancelled):  # an aborted or cancelled turn leaves them queued
            raise
        except CmdcError:  # a failed turn dropped them (its error says so), as on one machine
            self._release(taken)
            raise
        self._release(taken)
        return reply

    def _release(self, ids: Iterable[str]) -> None:
        for mid in ids:
            self._held.pop(mid, None)
            self._where.pop(mid, None)
            self._acked.discard(mid)

    async def send(self, content: str | Message | Sequence[Message]) -> None:
        """Queue user message(s) for the agent's next turn. When this returns they are queued on
        the agent's node, and this handle holds them until a turn commits them: if the node
        dies first, they are queued again on the agent's new node (those in neither its
        checkpoint nor its journal), in order, before any later call on it is served."""
        messages = as_messages(content)
        ids = [m.id for m in messages]
        if len(set(ids)) != len(ids) or any(mid in self._held for mid in ids):
            raise ConfigError(f"agent {self.name!r}: these messages are queued already (a message id is sent once)")
        if self._stopped:
            raise AgentStopped(f"agent {self.name!r} has stopped")
        key = self._cluster.node_of(self.name)  # where _invoke sends them (no wait in between)
        self._held.update((m.id, m) for m in messages)
        self._where.update((mid, key) for mid in ids)
        try:
            await self._op("send", messages)
        except BaseException:
            self._release(ids)
            raise
        self._acked.update(ids)

    async def state(self) -> State:
        state: State = await self._op("state")
        return state

    async def compact(self, instruction: str | None = None) -> Compacted | Skipped:
        outcome: Compacted | Skipped = await self._op("compact", instruction)
        return outcome

    async def ping(self) -> None:
        await self._op("ping")

    async def queued(self) -> tuple[Message, ...]:
        queued: tuple[Message, ...] = await self._op("queued")
        return queued

    async def clear_queued(self) -> tuple[Message, ...]:
        dropped: tuple[Message, ...] = await self._op("clear_queued")
        self._release(m.id for m in dropped)
        return dropped

    async def abort(self) -> None:
        """Cancel the running turn, if any (its caller gets `TurnAborted`)."""
        await self._op("abort")

    async def stop(self) -> None:
        """Stop the agent for good (its checkpoint and journal stay in the store)."""
        if not self._stopped:
            await self._cluster._stop(self)

    @property
    def running(self) -> bool:
        return not self._stopped


class ClusterSubscription:
    """Events of one agent (or all) from every node: `async with rt.subscribe(...) as sub:
    async for e in sub` (`async with` returns once every node has registered it, so no event
    after that is missed; a plain `with` starts receiving a few milliseconds later)."""

    def __init__(self, cluster: ClusterRuntime, agent: str | None, buffer: int) -> None:
        self.agent = agent
        self._cluster = cluster
        self._id = secrets.token_hex(8)
        self._send, self._receive = trio.open_memory_channel[Event](buffer)
        self._scope = trio.CancelScope()
        self.dropped = 0
        self._registered = 0
        self._polling = 0  # nodes being polled
        self._ready = trio.Event()
        cluster._nursery.start_soon(self._pump)

    async def started(self) -> None:
        """Wait until every live node has registered the subscription."""
        await self._ready.wait()

    async def _pump(self) -> None:
        with self._scope, self._send:
            async with trio.open_nursery() as nursery:
                polled = set(self._cluster._nodes)
                for node in list(self._cluster._nodes.values()):
                    nursery.start_soon(self._poll_node, node, len(polled))
                while self._polling or not self._ready.is_set():  # and nodes that join later
                    await trio.sleep(1.0)
                    for key, node in list(self._cluster._nodes.items()):
                        if key not in polled:
                            polled.add(key)
                            nursery.start_soon(self._poll_node, node, None)

    async def _poll_node(self, node: _NodeRef, nodes: int | None) -> None:
        self._polling += 1
        try:
            await self._poll_one(node, nodes)
        finally:
            self._polling -= 1

    async def _poll_one(self, node: _NodeRef, nodes: int | None) -> None:
        try:
            buffer = self._receive.statistics().max_buffer_size
            await _await_ref(node.handle.subscribe.remote(self._id, self.agent, buffer))
        except _DEAD:
            pass
        finally:
            if nodes is not None:
                self._registered += 1
                if self._registered == nodes:
                    self._ready.set()
        with contextlib.suppress(*_DEAD):
            try:
                while True:
                    try:
                        events = _unwrap(await _await_ref(node.handle.poll.remote(self._id, 1.0)))
                    except _DEAD:
                        raise
                    except Exception:  # a batch Ray could not carry (an event it cannot pickle)
                        self.dropped += 1
                        continue
                    if events is None:
                        return
                    for e in events:
                        try:
                            self._send.send_nowait(e)
                        except trio.WouldBlock:
                            self.dropped += 1
            finally:
                node.handle.unsubscribe.remote(self._id)

    async def receive(self) -> Event:
        return await self._receive.receive()

    def __aiter__(self) -> ClusterSubscription:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None

    def close(self) -> None:
        self._scope.cancel()
        self._receive.close()

    def __enter__(self) -> ClusterSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> ClusterSubscription:
        await self.started()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class ClusterRuntime:
    """The runtime `open_cluster` gives: the face of `open_runtime`'s, agents on Ray nodes."""

    def __init__(
        self,
        nursery: trio.Nursery,
        store: Store,
        store_spec: str,
        options: dict[str, Any],
        concurrency: int,
        started: list[_NodeRef],
    ) -> None:
        self._nursery = nursery
        self.store = store
        self._store_spec = store_spec
        self._options = options
        self._concurrency = concurrency
        self._started = started  # every node actor started, live or not (closed at the end)
        self._nodes: dict[str, _NodeRef] = {n.key: n for n in started}
        self._specs: dict[str, _Spec] = {}  # the spawn specs of the running agents
        self._joining = trio.Lock()
        self._settling: dict[str, trio.Event] = {}  # dead node -> set once its queues are moved
        self._bridges: dict[str, _Bridge] = {}
        for node in started:
            self._bridge(node)
        self._dead: dict[str, str] = {}  # key -> owner of the nodes known dead
        self._refs: dict[str, ClusterAgentRef] = {}
        self._closed = False
        self.node_deaths = 0

    @property
    def nodes(self) -> list[str]:
        """The live nodes' keys."""
        return list(self._nodes)

    @property
    def agents(self) -> list[str]:
        return list(self._refs)

    def whereis(self, name: str) -> ClusterAgentRef | None:
        return self._refs.get(name)

    def get(self, name: str) -> ClusterAgentRef:
        ref = self._refs.get(name)
        if ref is None:
            raise AgentNotFound(f"no running agent is called {name!r}")
        return ref

    def node_of(self, name: str) -> str:
        """The key of the node the agent is placed on now."""
        spec = self._specs.get(name)
        return _place(name, self._live(), self._gen() if spec is None else spec.gen)

    def _bridge(self, node: _NodeRef) -> None:
        bridge = self._bridges[node.key] = _Bridge(node)
        self._nursery.start_soon(bridge.run)

    def _live(self) -> dict[str, int]:
        return {k: n.seq for k, n in self._nodes.items()}

    def _gen(self) -> int:
        return max((n.seq for n in self._nodes.values()), default=0)

    def _node_table(self) -> dict[str, tuple[Any, int]]:
        return {k: (n.handle, n.seq) for k, n in self._nodes.items()}

    async def add_nodes(self) -> list[str]:
        """Start a node actor on every alive Ray node that has none yet (a node that joined the
        Ray cluster after `open_cluster`); return their keys. Agents spawned from now on are
        placed over them too; agents already placed stay where they are. `open_cluster` does
        this every `discover_every` seconds unless it was given `nodes=`."""
        async with self._joining:
            if self._closed:
                return []
            known = {n.node_id for n in self._started}
            alive = [n for n in await trio.to_thread.run_sync(ray.nodes) if n.get("Alive")]
            fresh = sorted(n["NodeID"] for n in alive if n["NodeID"] not in known)
            added: list[str] = []
            for node_id in fresh:
                node = _start_node(node_id, self._store_spec, self._options, self._concurrency)
                node.seq = max((n.seq for n in self._started), default=-1) + 1
                self._started.append(node)
                try:
                    node.key, node.owner = await _await_ref(node.handle.info.remote())
                    self._bridge(node)
                    self._nodes[node.key] = node  # spawns from now on register with it too ...
                    await _await_ref(node.handle.set_nodes.remote(self._node_table(), dict(self._dead)))
                    await _await_ref(node.handle.register_many.remote(dict(self._specs)))  # ... and these before
                except _DEAD:
                    await self._node_died(node)
                    continue
                added.append(node.key)
            if added:
                table, dead = self._node_table(), dict(self._dead)
                for node in list(self._nodes.values()):
                    node.handle.set_nodes.remote(table, dead)
            return added

    async def _discover(self, every: float) -> None:
        while True:
            await trio.sleep(every)
            with contextlib.suppress(Exception):  # a GCS hiccup: try again next time
                await self.add_nodes()

    def subscribe(self, agent: str | None = None, *, buffer: int = 256) -> ClusterSubscription:
        return ClusterSubscription(self, agent, buffer)

    async def spawn(
        self,
        name: str,
        provider: Provider,
        *,
        instructions: str | None = None,
        tools: Iterable[Tool] = (),
        plugins: Iterable[Plugin] = (),
        config: Mapping[str, Any] | None = None,
        summarizer: Summarizer | None = None,
        resume: bool | Literal["require"] = False,
        delegation: bool | str | Iterable[str] = False,
        accepts: bool | str | Iterable[str] = False,
        recall: bool = False,
        options: AgentOptions | None = None,
        **option_values: Any,
    ) -> ClusterAgentRef:
        """Start an agent on its node (as `Runtime.spawn`); it is ready when this returns.
        `delegation` as on one machine: `True` gives it temporary children of its own (they
        run on its node, within its turn); agent names or patterns also let it hand tasks to
        those agents of the cluster (on any node) that `accepts` it."""
        if self._closed:
            raise AgentStopped("the cluster runtime is closed")
        validate_agent_id(name)
        if name in self._refs:
            raise ConfigError(f"an agent called {name!r} is already running")
        if resume not in (False, True, "require"):
            raise ConfigError(f"resume must be False, True or 'require', got {resume!r}")
        if options is None:
            options = AgentOptions(**option_values)
        elif option_values:
            options = attrs.evolve(options, **option_values)
        if resume == "require" and await self.store.checkpoints.load(name) is None:
            raise AgentNotFound(f"resume='require': no checkpoint of an agent called {name!r}")
        spec = _Spec(
            provider,
            instructions,
            tuple(tools),
            tuple(plugins),
            config,
            summarizer,
            options,
            recall,
            () if delegation is True else patterns("delegation", delegation),
            patterns("accepts", accepts),
        )
        spec = attrs.evolve(spec, gen=self._gen())
        ref = ClusterAgentRef(self, name)
        self._refs[name] = ref
        self._specs[name] = spec
        try:
            stored = ray.put(spec)
            await self._each_node(lambda node: node.handle.register.remote(name, stored))
            await self._invoke(name, "spawn", (not resume,))
        except BaseException:
            self._refs.pop(name, None)
            self._specs.pop(name, None)
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await self._each_node(lambda node: node.handle.forget.remote(name))
            raise
        return ref

    async def _each_node(self, call: Callable[[_NodeRef], Any]) -> None:
        async def one(node: _NodeRef) -> None:
            try:
                answer = await _await_ref(call(node))
            except _DEAD:
                await self._node_died(node)
                return
            if isinstance(answer, tuple) and len(answer) == 2 and answer[0] is False:
                raise answer[1]

        async with trio.open_nursery() as nursery:
            for node in list(self._nodes.values()):
                nursery.start_soon(one, node)

    async def _invoke(self, name: str, op: str, args: tuple[Any, ...]) -> Any:
        while True:
            key = self.node_of(name)
            node = self._nodes[key]
            try:
                return await self._bridges[key].call(name, op, args)
            except trio.Cancelled:
                if op in ("prompt", "compact"):  # cancelling the call cancels the turn, as on one machine
                    node.handle.call.remote(name, "abort", (), (), None)
                raise
            except _NodeDied:
                await self._node_died(node)
                if op in _RETRIED:
                    continue
                if op == "send":  # its messages are held by the caller's handle: queued again
                    ref = self._refs.get(name)
                    if ref is not None:
                        await self._requeue(ref)
                    return None
                raise NodeLost(f"cluster node {key} died while it served {op} for agent {name!r}") from None

    async def _node_died(self, node: _NodeRef) -> None:
        """Take a dead node out: kill its actor, break its leases (nothing it still does can
        commit after this), tell the other nodes, and queue again on their new nodes the
        messages sent to its agents that no committed turn took. Returns once that is done
        (also to a caller that found the node dead after another one did)."""
        if node.key not in self._nodes:
            settling = self._settling.get(node.key)
            if settling is not None:
                await settling.wait()
            return
        self._settling[node.key] = settling = trio.Event()
        affected = [r for r in self._refs.values() if node.key in r._where.values()]
        try:
            self._nodes.pop(node.key)
            await self._take_out(node)
            with trio.CancelScope(shield=True):
                async with trio.open_nursery() as nursery:
                    for ref in affected:
                        nursery.start_soon(self._requeue, ref)
        finally:
            settling.set()

    async def _requeue(self, ref: ClusterAgentRef) -> None:
        """Queue again, on the agent's new node, the messages sent to it on nodes now dead that
        are in neither its checkpoint nor its journal (a dead node's leases are broken before
        this: nothing can commit there any more). Each message is marked with its new node
        before any wait, so two of these never queue one message twice."""
        if not [mid for mid, key in ref._where.items() if key not in self._nodes]:
            return
        try:
            state = await self.store.checkpoints.load(ref.name)
            committed = {m.id for m in (state.messages if state is not None else ())}
            committed |= {m.id for m in await self.store.read(ref.name)}
        except CmdcError:
            committed = set()  # the store is down: better twice than never (ids tell them apart)
        stale = [mid for mid, key in ref._where.items() if key not in self._nodes]  # again: after the wait
        ref._release(mid for mid in stale if mid in committed)
        missing = tuple(ref._held[mid] for mid in stale if mid in ref._held)
        if not missing or ref._stopped:
            return
        key = self.node_of(ref.name)
        for m in missing:
            ref._where[m.id] = key
        with contextlib.suppress(CmdcError):  # e.g. every node gone: the handle keeps them
            await self._invoke(ref.name, "send", (missing,))

    async def _take_out(self, node: _NodeRef) -> None:
        self.node_deaths += 1
        self._dead[node.key] = node.owner
        with contextlib.suppress(Exception):
            ray.kill(node.handle, no_restart=True)
        with trio.CancelScope(shield=True):
            assert isinstance(self.store, Leases)
            await self.store.break_leases(node.owner)
            table = self._node_table()
            for other in list(self._nodes.values()):
                other.handle.set_nodes.remote(table, dict(self._dead))

    async def _settle(self, name: str, messages: tuple[Message, ...]) -> Message | None:
        """After `NodeLost` on a turn: its committed reply if the turn committed before the node
        died (its user message is in the checkpoint), else None. The dead node's leases are
        broken by now, so a turn not committed yet never will be."""
        state = await self.store.checkpoints.load(name)
        if state is None:
            return None
        ids = {m.id for m in messages}
        at = next((i for i, m in enumerate(state.messages) if m.id in ids), None)
        if at is None:
            return None
        reply = None
        for m in state.messages[at + 1 :]:
            if m.role == "user" and m.id not in ids:
                break
            if m.role == "assistant":
                reply = m
        return reply

    async def _stop(self, ref: ClusterAgentRef) -> None:
        await self._invoke(ref.name, "stop", ())
        ref._stopped = True
        ref._release(list(ref._held))
        self._refs.pop(ref.name, None)
        self._specs.pop(ref.name, None)
        await self._each_node(lambda node: node.handle.forget.remote(ref.name))

    async def stats(self) -> dict[str, dict[str, int]]:
        """Each live node's runtime counters (agents, resident, activations, ...; `pid` and
        `cpu_ms`, the node process's CPU time so far; `trio_tid`, its trio thread's id)."""
        out: dict[str, dict[str, int]] = {}
        for key, node in list(self._nodes.items()):
            with contextlib.suppress(*_DEAD):
                out[key] = await _await_ref(node.handle.stats.remote())
        return out


def _start_node(node_id: str, store: str, options: dict[str, Any], concurrency: int) -> _NodeRef:
    """A node actor pinned to the Ray node `node_id` (its key and owner come from `info`)."""
    handle = (
        ray.remote(Node)
        .options(
            num_cpus=0,
            max_concurrency=concurrency,
            max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        )
        .remote(node_id[:12], store, options)
    )
    return _NodeRef(node_id[:12], "", handle, node_id=node_id)


async def _close_node(node: _NodeRef) -> None:
    with contextlib.suppress(Exception):
        await _await_ref(node.handle.close.remote())


@asynccontextmanager
async def open_cluster(
    address: str | None = None,
    *,
    store: str | os.PathLike[str],
    nodes: int | None = None,
    lease_ttl: float = 10.0,
    max_resident: int | None = 10_000,
    deactivate_after: float | None = None,
    max_concurrency: int = 256,
    discover_every: float | None = 5.0,
) -> AsyncIterator[ClusterRuntime]:
    """A cluster runtime over Ray (see the module docstring).

    `address`: as `ray.init` takes it (None starts a local Ray unless one is connected already;
    `"auto"` or `"ray://..."`/`"host:port"` joins a cluster). `store`: where every journal and
    checkpoint goes, shared by all nodes: a `postgresql://` URL (or, on one machine only, a
    directory). `nodes`: how many Ray nodes to use (default: all alive when opening), one node
    actor each. `lease_ttl`: seconds a node's lease on a name outlives the node if nobody breaks
    it. `max_resident`/`deactivate_after`: each node's virtual-agent bounds. `max_concurrency`:
    calls a node serves at once (each holds one of its Ray threads). `discover_every`: seconds
    between looks for Ray nodes that joined later (each gets a node actor and a share of the
    agents spawned after it joined; `rt.add_nodes()` looks at once); None, or `nodes=` given:
    the nodes of the start only.
    Leaving the block stops every agent (their state is in the store) and the node actors;
    a Ray started here is shut down.
    """
    lease = optional_seconds(lease_ttl, "lease_ttl")
    if lease is None:
        raise ConfigError("lease_ttl must be a positive number of seconds")
    count = optional_integer(nodes, "nodes")
    concurrency = optional_integer(max_concurrency, "max_concurrency")
    discover = optional_seconds(discover_every, "discover_every")
    options = {
        "lease_ttl": lease,
        "max_resident": optional_integer(max_resident, "max_resident"),
        "deactivate_after": optional_seconds(deactivate_after, "deactivate_after"),
    }
    if not isinstance(store, (str, os.PathLike)):
        raise ConfigError(f"store must be a postgresql:// URL or a directory every node can reach, got {store!r:.80}")
    spec = os.fspath(store)
    if "://" not in spec:
        spec = await trio.to_thread.run_sync(os.path.abspath, spec)
    made = open_store(spec)
    await made.start()
    started = False
    ray_level = logging.getLogger("ray").level  # put back when the Ray started here shuts down
    actors: list[_NodeRef] = []
    try:
        if not ray.is_initialized():
            started = True
            await trio.to_thread.run_sync(_start_ray, address)
        alive = [n for n in await trio.to_thread.run_sync(ray.nodes) if n.get("Alive")]
        alive.sort(key=lambda n: n["NodeID"])
        if count is not None:
            if count > len(alive):
                raise ConfigError(f"nodes={count}, but the Ray cluster has {len(alive)} alive")
            alive = alive[:count]
        for seq, n in enumerate(alive):
            actors.append(_start_node(n["NodeID"], spec, options, concurrency or 256))
            actors[-1].seq = seq
        for node in actors:
            node.key, node.owner = await _await_ref(node.handle.info.remote())
        table = {n.key: (n.handle, n.seq) for n in actors}
        for node in actors:
            await _await_ref(node.handle.set_nodes.remote(table, {}))
        async with trio.open_nursery() as nursery:
            rt = ClusterRuntime(nursery, made, spec, options, concurrency or 256, actors)
            if discover is not None and count is None:
                nursery.start_soon(rt._discover, discover)
            try:
                yield rt
            finally:
                rt._closed = True
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            with trio.move_on_after(60):  # a node that does not answer is killed below
                async with trio.open_nursery() as nursery:
                    for node in actors:
                        nursery.start_soon(_close_node, node)
            for node in actors:
                with contextlib.suppress(Exception):
                    ray.kill(node.handle, no_restart=True)
            if started:
                await trio.to_thread.run_sync(ray.shutdown)
                logging.getLogger("ray").setLevel(ray_level)
            await made.aclose()


def _start_ray(address: str | None) -> None:
    """Start (or join) Ray for `open_cluster`, quietly: a library prints nothing. Ray's driver
    logger (its own stderr handler) is set to ERROR while the Ray started here runs: its notices
    at start (a SIGTERM handler not set from a worker thread, token authentication, "Started a
    local Ray instance") are not printed; errors still are."""
    ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)


__all__ = ["ClusterAgentRef", "ClusterRuntime", "ClusterSubscription", "Node", "open_cluster"]
