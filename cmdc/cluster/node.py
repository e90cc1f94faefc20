"""A node of the cluster: a Ray actor (`Node`, pinned to a Ray node) hosting an ordinary cmdc
runtime on trio in a thread of its own (`NodeHost`); Ray calls run coroutines on that thread."""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import ray
import trio
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ..errors import AgentNotFound, AgentStopped, CmdcError, ConfigError, DelegationRefused, NameLeased, NodeLost
from ..events import Event
from ..message import Message
from ..runtime.delegation import matches, naming_targets
from ..runtime.mailbox import current_chain
from ..runtime.runtime import Runtime, open_runtime
from ..tools import Tool, tool
from .bridge import DEAD, NodeRef, await_ref, portable, unwrap
from .placement import Spec, place


class NodeHost:
    """What a node actor holds: a cmdc runtime on trio in a thread of its own. The actor's
    methods (called by Ray in its threads) run coroutines here on that trio thread."""

    def __init__(self, key: str, store: str, options: dict[str, Any]) -> None:
        self.key = key
        self.owner = f"ray:{key}:{os.getpid()}:{secrets.token_hex(4)}"
        self._store_spec = store
        self._options = options
        self._specs: dict[str, Spec] = {}
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

    def register(self, name: str, spec: Spec) -> None:
        self._specs[name] = spec

    def register_many(self, specs: dict[str, Spec]) -> None:
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
            item = (call_id, False, portable(exc))
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
                    tools = (*tools, cluster_delegate(self, name, spec.targets, spec.options.max_delegation_depth))
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
        key = place(name, live, max(live.values(), default=0) if spec is None else spec.gen)
        if key == self.key:
            return await self._call(name, op, args, chain, sender)
        try:
            answer = await await_ref(self._nodes[key].call.remote(name, op, args, chain, sender))
        except DEAD:
            self._dead.add(key)
            raise NodeLost(f"cluster node {key} died while agent {name!r} worked on a delegated task") from None
        return unwrap(answer)


class Node:
    """One node of the cluster (a Ray actor, pinned to a Ray node, threaded: `max_concurrency`
    calls at once). Its methods are all synchronous (an `async def` would make Ray run the actor
    on asyncio): each runs a coroutine on the node's trio thread and returns `(ok, value)`."""

    def __init__(self, key: str, store: str, options: dict[str, Any]) -> None:
        self._host = NodeHost(key, store, options)

    def info(self) -> tuple[str, str]:
        return self._host.info()

    def set_nodes(self, nodes: dict[str, tuple[Any, int]], dead: dict[str, str]) -> None:
        self._host.set_nodes(nodes, dead)

    def register(self, name: str, spec: Spec) -> None:
        self._host.register(name, spec)

    def register_many(self, specs: dict[str, Spec]) -> None:
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


def cluster_delegate(node: NodeHost, parent: str, targets: tuple[str, ...], depth: int) -> Tool:
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


def start_node(node_id: str, store: str, options: dict[str, Any], concurrency: int) -> NodeRef:
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
    return NodeRef(node_id[:12], "", handle, node_id=node_id)


async def close_node(node: NodeRef) -> None:
    with contextlib.suppress(Exception):
        await await_ref(node.handle.close.remote())


__all__ = ["Node", "NodeHost", "close_node", "cluster_delegate", "start_node"]
