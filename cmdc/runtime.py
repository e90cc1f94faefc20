"""The runtime: a nursery of agents, their registry, supervision, checkpoints and events."""

from __future__ import annotations

import fnmatch
import itertools
import os
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import attrs
import trio

from .agent import Agent, AgentOptions, AgentRef, current_chain
from .bus import EventBus, Subscription
from .checkpoint import CheckpointStore
from .compaction import Compactor
from .compaction.compactor import shared_store
from .compaction.summary import Summarizer
from .errors import AgentNotFound, AgentStopped, ConfigError, DelegationRefused
from .plugins import Plugin
from .providers.base import Provider
from .recall import recall_tool
from .state import State, validate_agent_id
from .tools import Tool, tool

_OPTION_NAMES = frozenset(f.name for f in attrs.fields(AgentOptions))
_DEFAULT_OPTIONS = AgentOptions()

Grant = bool | str | Iterable[str]
"""Who an agent may delegate to, or accept delegated tasks from: False (nobody), True (anyone
allowed by the other side), or agent names and `fnmatch` patterns (`"worker-*"`)."""


def _patterns(what: str, value: object) -> tuple[str, ...] | None:
    """None for False; ("*",) for True; the patterns of a name, pattern or list of them."""
    if value is False or value is None:
        return None
    if value is True:
        return ("*",)
    names = (value,) if isinstance(value, str) else value
    if not isinstance(names, Iterable):
        raise ConfigError(f"{what} must be a bool, an agent name or pattern, or a list of them, got {value!r:.80}")
    out = tuple(names)
    for p in out:
        if not isinstance(p, str) or not p or len(p) > 256:
            raise ConfigError(f"{what}: every entry must be an agent name or pattern (a string), got {p!r:.80}")
    return out


def _matches(name: str, patterns: tuple[str, ...] | None) -> bool:
    return patterns is not None and any(fnmatch.fnmatchcase(name, p) for p in patterns)


@attrs.frozen
class _Grants:
    """Who an agent may reach with `delegate` (`children`: temporary children of its own;
    `targets`: running agents by name or pattern), and whose delegated tasks it accepts."""

    children: bool
    targets: tuple[str, ...] | None
    accepts: tuple[str, ...] | None


class Runtime:
    """Owns the agents of one `open_runtime()` block. Use `spawn`, `whereis`, `subscribe`."""

    def __init__(self, nursery: trio.Nursery, bus: EventBus, checkpoints: CheckpointStore | None) -> None:
        self._nursery = nursery
        self.bus = bus
        self.checkpoints = checkpoints
        self._agents: dict[str, Agent] = {}
        self._grants: dict[str, _Grants] = {}
        self._children = itertools.count(1)
        self._live_children: dict[str, int] = {}  # agent -> its temporary children running now
        self._waits: dict[str, list[str]] = {}  # the wait-for graph: agent -> agents it waits on
        self._closed = False

    @property
    def agents(self) -> list[str]:
        """Names of the running agents."""
        return list(self._agents)

    def whereis(self, name: str) -> AgentRef | None:
        """The running agent called `name`, or None."""
        agent = self._agents.get(name)
        return None if agent is None else agent.ref

    def get(self, name: str) -> AgentRef:
        """The running agent called `name`; raise `AgentNotFound` if there is none."""
        ref = self.whereis(name)
        if ref is None:
            raise AgentNotFound(f"no running agent is called {name!r}")
        return ref

    def subscribe(self, agent: str | None = None, *, buffer: int = 256) -> Subscription:
        """Events of one agent (or of all): `with rt.subscribe("a1") as sub: async for e in sub`."""
        return self.bus.subscribe(agent, buffer=buffer)

    async def spawn(
        self,
        name: str,
        provider: Provider,
        *,
        tools: Iterable[Tool] = (),
        plugins: Iterable[Plugin] = (),
        config: Mapping[str, Any] | None = None,
        summarizer: Summarizer | None = None,
        resume: bool = False,
        delegation: Grant = False,
        accepts: Grant = False,
        recall: bool = False,
        options: AgentOptions | None = None,
        **option_values: Any,
    ) -> AgentRef:
        """Start an agent and return its handle once it is ready: its mailbox takes requests,
        and its `on_start` plugins have run (then through `nursery.start`).

        `summarizer` None: the agent's own provider summarizes. `resume`: start from the
        checkpoint of an agent of this name (needs `open_runtime(checkpoint_dir=...)`).
        `delegation`: give it the built-in `delegate` tool: True lets it hand tasks to temporary
        children of its own; agent names or `fnmatch` patterns (`["critic", "worker-*"]`) also
        let it reach those running agents, if they accept. `accepts`: whether this agent takes
        delegated tasks, and from whom: False (the default: from no agent), True (from any agent
        granted to reach it), or names and patterns of the agents it accepts. `recall`: give it
        the built-in `recall` tool, which reads evicted history back from its own offload
        journal (and no other). Agent options
        (`max_steps`, `tool_timeout`, `restart`, ...) come as `options=AgentOptions(...)` or as
        keywords.
        """
        if self._closed:
            raise AgentStopped("the runtime is closed")
        validate_agent_id(name)
        unknown = set(option_values) - _OPTION_NAMES
        if unknown:
            raise ConfigError(f"unknown spawn option(s) {sorted(unknown)}; agent options are {sorted(_OPTION_NAMES)}")
        if options is None:
            options = AgentOptions(**option_values) if option_values else _DEFAULT_OPTIONS
        elif option_values:
            options = attrs.evolve(options, **option_values)
        if not hasattr(provider, "complete"):
            raise ConfigError(f"provider must have an async complete(request) method, got {provider!r:.80}")
        if name in self._agents:
            raise ConfigError(f"an agent called {name!r} is already running")
        targets = _patterns("delegation", delegation)
        grants = _Grants(
            children=targets is not None,
            targets=None if delegation is True else targets,
            accepts=_patterns("accepts", accepts),
        )
        plugins = tuple(plugins)
        state = State(agent_id=name, config=config)
        if resume:
            if self.checkpoints is None:
                raise ConfigError("resume=True needs open_runtime(checkpoint_dir=...)")
            saved = await self.checkpoints.load(name)
            if saved is not None:
                state = saved if config is None else saved.evolve(config=config)
        compactor = Compactor(
            summarizer if summarizer is not None else provider, plugins=plugins, on_event=self.bus.publish
        )
        compactor.compact_config(state)  # a malformed config fails the spawn, not the first turn
        tools = tuple(tools)
        if recall:
            if any(isinstance(t, Tool) and t.name == "recall" for t in tools):
                raise ConfigError("recall=True adds a tool named 'recall', but one of the given tools has that name")
            tools += (recall_tool(shared_store(compactor.compact_config(state).offload_dir), name),)
        agent = Agent(
            name=name,
            state=state,
            provider=provider,
            compactor=compactor,
            tools=(*tools, _delegate_tool(self, name)) if grants.children else tools,
            plugins=plugins,
            options=options,
            bus=self.bus,
            checkpoints=self.checkpoints,
            on_exit=self._forget,
        )
        if name in self._agents:  # spawned meanwhile, while a checkpoint was read
            raise ConfigError(f"an agent called {name!r} is already running")
        self._agents[name] = agent
        self._grants[name] = grants
        if not any(p.implements("on_start") for p in plugins):
            # Ready by construction: the mailbox exists and the task is scheduled, so requests
            # queue at once and are served in order. No need for start()'s round trip.
            self._nursery.start_soon(agent.main, name=name)
            return agent.ref
        try:  # on_start plugins run before the agent counts as ready
            ref: AgentRef = await self._nursery.start(agent.main, name=name)
        except BaseException:
            self._agents.pop(name, None)
            self._grants.pop(name, None)
            raise
        return ref

    def _forget(self, agent: Agent) -> None:
        if self._agents.get(agent.name) is agent:
            del self._agents[agent.name]
            self._grants.pop(agent.name, None)

    def child_name(self, parent: str) -> str:
        return f"{parent[:100]}.child{next(self._children)}"

    # -- who may talk to whom ----------------------------------------------------------------
    def check_delegation(self, sender: str, target: str) -> AgentRef:
        """The running agent `target`, if `sender` may hand it a task: `sender` was granted
        it (by name or pattern) and `target` accepts tasks from `sender`. Otherwise
        `DelegationRefused`, saying which side refused."""
        mine = self._grants.get(sender)
        if mine is None or not _matches(target, mine.targets):
            allowed = ", ".join(mine.targets) if mine is not None and mine.targets else "none"
            raise DelegationRefused(
                f"agent {sender!r} may not delegate to {target!r}: it may delegate to its own temporary "
                f"children (leave out 'agent') and to these agents: {allowed}"
            )
        ref = self.whereis(target)
        theirs = self._grants.get(target)
        if ref is None or theirs is None:
            raise DelegationRefused(f"no running agent is called {target!r}")
        if not _matches(sender, theirs.accepts):
            raise DelegationRefused(f"agent {target!r} does not accept delegated tasks from {sender!r}")
        return ref

    def wait_path(self, start: str, goal: str) -> list[str] | None:
        """A path start -> ... -> goal in the wait-for graph (each agent waits on the next),
        or None."""
        if start == goal:
            return [start]
        parents: dict[str, str] = {start: start}
        frontier = [start]
        while frontier:
            node = frontier.pop()
            for nxt in self._waits.get(node, ()):
                if nxt in parents:
                    continue
                parents[nxt] = node
                if nxt == goal:
                    path = [goal]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return path[::-1]
                frontier.append(nxt)
        return None

    @contextmanager
    def waiting(self, waiter: str, target: str) -> Iterator[None]:
        """Record that `waiter` waits on `target` for as long as the block runs; refuse with
        `DelegationRefused` if `target` already waits (directly or through others) on
        `waiter`: the two would wait on each other for ever."""
        path = self.wait_path(target, waiter)
        if path is not None:
            cycle = " -> ".join([waiter, *path])
            raise DelegationRefused(
                f"delegation refused: {target!r} is already waiting on {waiter!r} ({cycle}); "
                "handing it this task would deadlock both. Do the task yourself or answer without it."
            )
        edges = self._waits.setdefault(waiter, [])
        edges.append(target)
        try:
            yield
        finally:
            edges.remove(target)
            if not edges:
                del self._waits[waiter]

    @contextmanager
    def child_slot(self, parent: str, limit: int) -> Iterator[None]:
        """Count a temporary child of `parent` while the block runs; `DelegationRefused` past `limit`."""
        live = self._live_children.get(parent, 0)
        if live >= limit:
            raise DelegationRefused(
                f"agent {parent!r} already has {live} temporary children at work (max_children={limit}); "
                "wait for their answers, then delegate again, or do this task yourself"
            )
        self._live_children[parent] = live + 1
        try:
            yield
        finally:
            left = self._live_children[parent] - 1
            if left:
                self._live_children[parent] = left
            else:
                del self._live_children[parent]


def _delegate_tool(runtime: Runtime, parent: str) -> Tool:
    async def delegate(task: str, agent: str | None = None) -> str:
        """Hand a task to another agent and return its final answer.

        Args:
            task: What the other agent should do, with everything it needs to know.
            agent: The name of a running agent you were allowed to delegate to; leave it out to have
                a temporary child agent do it.
        """
        chain = current_chain.get()
        me = runtime._agents.get(parent)
        if me is None:
            raise AgentStopped(f"agent {parent!r} is not running")
        depth = me.options.max_delegation_depth
        if len(chain) >= depth:
            raise DelegationRefused(f"delegation depth limit ({depth}) reached: {' -> '.join(chain)}")
        if agent is not None:
            target = runtime.check_delegation(parent, agent)
            with runtime.waiting(parent, agent):
                return (await target.prompt(task)).text
        with runtime.child_slot(parent, me.options.max_children):
            name = runtime.child_name(parent)
            child = await runtime.spawn(
                name,
                me.provider,
                tools=[t for t in me.tools.values() if t.name not in ("delegate", "recall")],
                config=me.state.config,
                summarizer=me.compactor.summarizer,
                options=attrs.evolve(me.options, restart="temporary"),
                delegation=True,  # children of its own, and no named agent
                accepts=(parent,),  # its parent's tasks only
            )
            try:
                with runtime.waiting(parent, name):
                    return (await child.prompt(task)).text
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(10):
                    await child.stop()

    return tool(delegate, name="delegate")


@asynccontextmanager
async def open_runtime(
    *, checkpoint_dir: str | os.PathLike[str] | None = None, log_events: bool = True
) -> AsyncIterator[Runtime]:
    """A runtime owning a nursery of agents; leaving the block stops every agent, and any
    caller still waiting on one gets `AgentStopped`. `checkpoint_dir`: each agent's state is
    saved there atomically at every commit, and `spawn(..., resume=True)` picks it up.
    `log_events`: every event also goes to structlog, one line each."""
    bus = EventBus(log=log_events)
    checkpoints = None if checkpoint_dir is None else CheckpointStore(checkpoint_dir)
    async with trio.open_nursery() as nursery:
        runtime = Runtime(nursery, bus, checkpoints)
        try:
            yield runtime
        finally:
            runtime._closed = True
            nursery.cancel_scope.cancel()
            bus.close()


__all__ = ["Runtime", "open_runtime"]
