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

The bridge between Ray and trio is in this package alone (`bridge`, `node`): Ray calls into a
node's trio thread through `trio.from_thread.run`, and trio code awaits an `ObjectRef` through
its future's done-callback (`trio_token.run_sync_soon`), never blocking the trio thread. The
caller's calls to a node are batched (`Bridge`): the calls made while one batch travels go in
the next, and one long poll brings back every answer ready, so no turn holds a Ray thread and a
turn costs a fraction of a Ray call. The spawn specs (provider, tools, plugins, ...; `Spec`)
travel to every node through Ray's object store and are kept in each node's memory and in the
caller's: the registry of names lives in the process that opened the cluster.

Modules: `bridge` (awaiting Ray from trio, batched calls), `placement` (`place`, `Spec`), `node`
(the node actor and its runtime), and this one (the caller's side: `ClusterRuntime`, its agent
handles, subscriptions, `open_cluster`). `cmdc.ray` is this module.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal, Unpack

import attrs
import ray
import trio

from .._check import optional_integer, optional_seconds
from ..compaction import Compacted, Skipped
from ..compaction.summary import Summarizer
from ..errors import AgentNotFound, AgentStopped, CmdcError, ConfigError, NodeLost, TurnAborted
from ..events import Event
from ..message import Message
from ..plugins import Plugin
from ..providers.base import Provider
from ..runtime.delegation import patterns
from ..runtime.mailbox import as_messages
from ..runtime.options import AgentOptions, SpawnOptions, agent_options
from ..state import ConfigSource, State, config_keys, validate_agent_id
from ..store import Leases, Store, open_store
from ..tools import Tool
from .bridge import DEAD, Bridge, NodeRef, _NodeDied, await_ref, unwrap
from .node import Node, close_node, start_node
from .placement import Spec, place

# Retried on another node after a node died: reads, and what is done anyway once a node is gone.
_RETRIED = frozenset({"state", "ping", "queued", "spawn", "stop", "abort"})


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

    async def _poll_node(self, node: NodeRef, nodes: int | None) -> None:
        self._polling += 1
        try:
            await self._poll_one(node, nodes)
        finally:
            self._polling -= 1

    async def _poll_one(self, node: NodeRef, nodes: int | None) -> None:
        try:
            buffer = self._receive.statistics().max_buffer_size
            await await_ref(node.handle.subscribe.remote(self._id, self.agent, buffer))
        except DEAD:
            pass
        finally:
            if nodes is not None:
                self._registered += 1
                if self._registered == nodes:
                    self._ready.set()
        with contextlib.suppress(*DEAD):
            try:
                while True:
                    try:
                        events = unwrap(await await_ref(node.handle.poll.remote(self._id, 1.0)))
                    except DEAD:
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
        started: list[NodeRef],
    ) -> None:
        self._nursery = nursery
        self.store = store
        self._store_spec = store_spec
        self._options = options
        self._concurrency = concurrency
        self._started = started  # every node actor started, live or not (closed at the end)
        self._nodes: dict[str, NodeRef] = {n.key: n for n in started}
        self._specs: dict[str, Spec] = {}  # the spawn specs of the running agents
        self._joining = trio.Lock()
        self._settling: dict[str, trio.Event] = {}  # dead node -> set once its queues are moved
        self._bridges: dict[str, Bridge] = {}
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
        return place(name, self._live(), self._gen() if spec is None else spec.gen)

    def _bridge(self, node: NodeRef) -> None:
        bridge = self._bridges[node.key] = Bridge(node)
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
                node = start_node(node_id, self._store_spec, self._options, self._concurrency)
                node.seq = max((n.seq for n in self._started), default=-1) + 1
                self._started.append(node)
                try:
                    node.key, node.owner = await await_ref(node.handle.info.remote())
                    self._bridge(node)
                    self._nodes[node.key] = node  # spawns from now on register with it too ...
                    await await_ref(node.handle.set_nodes.remote(self._node_table(), dict(self._dead)))
                    await await_ref(node.handle.register_many.remote(dict(self._specs)))  # ... and these before
                except DEAD:
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
        config: Mapping[str, Any] | ConfigSource | None = None,
        summarizer: Summarizer | None = None,
        resume: bool | Literal["require"] = False,
        delegation: bool | str | Iterable[str] = False,
        accepts: bool | str | Iterable[str] = False,
        recall: bool = False,
        options: AgentOptions | None = None,
        **option_values: Unpack[SpawnOptions],
    ) -> ClusterAgentRef:
        """Start an agent on its node (as `Runtime.spawn`); it is ready when this returns.
        `delegation` as on one machine: `True` gives it temporary children of its own (they
        run on its node, within its turn); agent names or patterns also let it hand tasks to
        those agents of the cluster (on any node) that `accepts` it."""
        if self._closed:
            raise AgentStopped("the cluster runtime is closed")
        validate_agent_id(name)
        config = config_keys(config)  # a CompactConfig as its keys
        if name in self._refs:
            raise ConfigError(f"an agent called {name!r} is already running")
        if resume not in (False, True, "require"):
            raise ConfigError(f"resume must be False, True or 'require', got {resume!r}")
        options = agent_options(options, option_values)
        if resume == "require" and await self.store.checkpoints.load(name) is None:
            raise AgentNotFound(f"resume='require': no checkpoint of an agent called {name!r}")
        spec = Spec(
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

    async def _each_node(self, call: Callable[[NodeRef], Any]) -> None:
        async def one(node: NodeRef) -> None:
            try:
                answer = await await_ref(call(node))
            except DEAD:
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

    async def _node_died(self, node: NodeRef) -> None:
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

    async def _take_out(self, node: NodeRef) -> None:
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
            with contextlib.suppress(*DEAD):
                out[key] = await await_ref(node.handle.stats.remote())
        return out


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
    actors: list[NodeRef] = []
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
            actors.append(start_node(n["NodeID"], spec, options, concurrency or 256))
            actors[-1].seq = seq
        for node in actors:
            node.key, node.owner = await await_ref(node.handle.info.remote())
        table = {n.key: (n.handle, n.seq) for n in actors}
        for node in actors:
            await await_ref(node.handle.set_nodes.remote(table, {}))
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
                        nursery.start_soon(close_node, node)
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
