"""The runtime: a nursery of agents, their registry, supervision, checkpoints and events."""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import socket
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal, Unpack

import attrs
import trio

from .._check import choice, is_int, optional_integer, optional_seconds, text
from .._trio import reraise
from ..compaction import Compactor
from ..compaction.breaker import SummarizerBreaker
from ..compaction.summary import ExtractiveSummarizer, Summarizer
from ..errors import AgentNotFound, AgentStopped, CmdcError, ConfigError
from ..events import DEACTIVATED, Event
from ..message import Message
from ..plugins import Plugin
from ..providers.base import Provider
from ..recall import MIN_BUDGET, recall_tool
from ..state import ConfigSource, State, config_keys, validate_agent_id
from ..store import Checkpoints, FileCheckpoints, Leases, Store, open_store
from ..tools import Tool, ToolSet, ToolSource
from ..tracing import Tracer
from .agent import Agent
from .bus import EventBus, Subscription
from .delegation import NO_GRANTS, Delegation, Grant, Grants, delegate_tool, patterns
from .leases import DEFAULT_LEASE_TTL, NameLeases
from .options import AgentOptions, SpawnOptions, agent_options
from .ref import AgentRef
from .virtual import NO_PENDING, Slot, VirtualAgents

UI_SERVER: Any = None
"""How `Runtime.serve_ui` starts the web page: set by `cmdc/__init__.py` (the faces layer owns
the page, `cmdc.ui`, extra `ui`; this layer only calls it)."""

DEFAULT_RECALL_BUDGET = 2_000
"""Tokens a `recall` answer may take with a large (or unknown) window."""


class Runtime(VirtualAgents, NameLeases, Delegation):
    """Owns the agents of one `open_runtime()` block. Use `spawn`, `whereis`, `subscribe`.

    With virtual agents (`open_runtime(deactivate_after=..., max_resident=...)`) an agent is
    addressable from its spawn until it is stopped, while its task is in memory ("resident")
    only when it is in use: an idle one is deactivated (its state saved to the checkpoint
    store, its task ended) and activated again from the store by the next call on its name or
    `AgentRef`. Within a runtime a name is resident at most once at a time.
    """

    def __init__(
        self,
        nursery: trio.Nursery,
        bus: EventBus,
        checkpoints: Checkpoints | None,
        *,
        deactivate_after: float | None = None,
        max_resident: int | None = None,
        store: Store | None = None,
        tracing: Tracer | None = None,
        lease_ttl: float | None = None,
        lease_owner: str | None = None,
    ) -> None:
        self._nursery = nursery
        self.tracing = tracing  # every agent's tracer (None: no tracing)
        self.bus = bus
        self.checkpoints = checkpoints
        self.store = store  # where journals and checkpoints go; None: files, per agent config
        self.deactivate_after = deactivate_after
        self.max_resident = max_resident
        self._virtual = deactivate_after is not None or max_resident is not None
        self._agents: dict[str, Agent] = {}  # the resident agents, least recently active first
        self._slots: dict[str, Slot] = {}  # every addressable agent
        self._children = itertools.count(1)
        self._child_token = secrets.token_hex(6)  # in every child's name: unique across runtimes
        self._live_children: dict[str, int] = {}  # agent -> its temporary children running now
        self._waits: dict[str, list[str]] = {}  # the wait-for graph: agent -> agents it waits on
        self._closed = False
        self._activations = 0
        self._deactivations = 0
        self._leaving: set[str] = set()  # asked to deactivate, not refused yet
        # Name leases (open_runtime(lease_ttl=...)): the store's lease on every resident name.
        self.lease_ttl = lease_ttl
        self.lease_owner = lease_owner
        self.lease_takeover: set[str] = set()  # owners known dead: their leases may be taken over
        self._leases: Leases | None = store if lease_ttl is not None and isinstance(store, Leases) else None
        self._leased: dict[str, int] = {}  # resident name -> its lease's fencing token
        self._sources: dict[ToolSource, ToolSet] = {}  # started tool sources (MCP servers), by source
        self._sources_lock = trio.Lock()
        self.ui: Any = None  # the web page's server, with open_runtime(ui=...)

    @property
    def agents(self) -> list[str]:
        """Names of the running agents (with virtual agents: resident or not)."""
        return list(self._slots)

    @property
    def resident(self) -> list[str]:
        """Names of the agents whose task is in memory, least recently active first."""
        return list(self._agents)

    @property
    def stats(self) -> dict[str, int]:
        """Counters: agents addressable and resident, activations and deactivations so far."""
        return {
            "agents": len(self._slots),
            "resident": len(self._agents),
            "activations": self._activations,
            "deactivations": self._deactivations,
        }

    def whereis(self, name: str) -> AgentRef | None:
        """The running agent called `name`, or None."""
        slot = self._slots.get(name)
        return None if slot is None else slot.ref

    def get(self, name: str) -> AgentRef:
        """The running agent called `name`; raise `AgentNotFound` if there is none."""
        ref = self.whereis(name)
        if ref is None:
            raise AgentNotFound(f"no running agent is called {name!r}")
        return ref

    def observe(self, name: str) -> Agent | None:
        """The resident agent task called `name`, for observers that only read it (the web
        page): never activates a deactivated agent, never waits."""
        return self._agents.get(name)

    async def serve_ui(self, port: int = 0, *, host: str = "127.0.0.1", writable: bool = False) -> Any:
        """Serve the local web page of this runtime's agents (extra `ui`) until the runtime
        closes; return its server, whose `url` (with its token) opens it. `port` 0: a free
        one. `writable`: also offer actions (compact now); read-only by default."""
        if UI_SERVER is None:
            raise ConfigError("the web page needs cmdc's faces layer: import cmdc")
        return await UI_SERVER(self, self._nursery, port=port, host=host, writable=writable)

    def subscribe(self, agent: str | None = None, *, buffer: int = 256) -> Subscription:
        """Events of one agent (or of all): `with rt.subscribe("a1") as sub: async for e in sub`."""
        return self.bus.subscribe(agent, buffer=buffer)

    async def spawn(
        self,
        name: str,
        provider: Provider,
        *,
        instructions: str | None = None,
        tools: Iterable[Tool | ToolSource | ToolSet] = (),
        plugins: Iterable[Plugin] = (),
        config: Mapping[str, Any] | ConfigSource | None = None,
        summarizer: Summarizer | None = None,
        resume: bool | Literal["require"] = False,
        delegation: Grant = False,
        accepts: Grant = False,
        recall: bool = False,
        options: AgentOptions | None = None,
        **option_values: Unpack[SpawnOptions],
    ) -> AgentRef:
        """Start an agent and return its handle once it is ready: its mailbox takes requests,
        and its `on_start` plugins have run (then through `nursery.start`).

        `instructions`: the system prompt, the conversation's first message (pinned: never
        compacted away). A system message sent once the conversation has begun is refused
        (`InvalidMessage`).
        `config`: `state.config` keys, or a `CompactConfig` (taken as its keys).
        `summarizer` None: the agent's own provider summarizes. `resume` (needs
        `open_runtime(checkpoint_dir=...)`): `True` starts from the checkpoint of an agent of
        this name when there is one and fresh when there is none; `"require"` raises
        `AgentNotFound` when there is none. On a resumed state, a given `config` is merged over
        the checkpoint's (the keys given win, the others are kept) and given `instructions`
        replace its system prompt.
        `delegation`: give it the built-in `delegate` tool: True lets it hand tasks to temporary
        children of its own; agent names or `fnmatch` patterns (`["critic", "worker-*"]`) also
        let it reach those running agents, if they accept. `accepts`: whether this agent takes
        delegated tasks, and from whom: False (the default: from no agent), True (from any agent
        granted to reach it), or names and patterns of the agents it accepts. `recall`: give it
        the built-in `recall` tool, which reads evicted history back from its own offload
        journal (and no other). Agent options
        (`max_steps`, `tool_timeout`, `restart`, ...) come as `options=AgentOptions(...)`, as
        keywords (typed: `SpawnOptions`), or both (the keywords win).
        """
        if self._closed:
            raise AgentStopped("the runtime is closed")
        validate_agent_id(name)
        options = agent_options(options, option_values)
        config = config_keys(config)  # a CompactConfig as its keys
        if not hasattr(provider, "complete"):
            raise ConfigError(f"provider must have an async complete(request) method, got {provider!r:.80}")
        if name in self._slots:
            raise ConfigError(f"an agent called {name!r} is already running")
        choice(resume, "resume", (False, True, "require"))
        if instructions is not None:
            text(instructions, "instructions (the system prompt)", blank=False)
        targets = patterns("delegation", delegation)
        grants = Grants(
            children=targets is not None,
            targets=None if delegation is True else targets,
            accepts=patterns("accepts", accepts),
        )
        if grants == NO_GRANTS:
            grants = NO_GRANTS  # one for every agent that has the defaults
        await self._lease(name)
        try:
            return await self._spawn_leased(
                name, provider, instructions, tools, plugins, config, summarizer, resume, grants, options, recall
            )
        except BaseException:
            if self.whereis(name) is None:
                self._unlease(name)
            raise

    async def _spawn_leased(
        self,
        name: str,
        provider: Provider,
        instructions: str | None,
        tools: Iterable[Tool | ToolSource | ToolSet],
        plugins: Iterable[Plugin],
        config: Mapping[str, Any] | None,
        summarizer: Summarizer | None,
        resume: bool | Literal["require"],
        grants: Grants,
        options: AgentOptions,
        recall: bool,
    ) -> AgentRef:
        plugins = tuple(plugins)
        state = State(agent_id=name, config=config)
        fresh: State | None = state  # a state as good as saved
        saved: State | None = None  # the checkpoint a resumed agent goes on from
        if resume:
            if self.checkpoints is None:
                raise ConfigError(f"resume={resume!r} needs open_runtime(checkpoint_dir=...)")
            saved = await self.checkpoints.load(name)
            if saved is not None:
                state = saved if config is None else saved.evolve(config={**saved.config, **config})
                fresh = saved if config is None else None
            elif resume == "require":
                raise AgentNotFound(f"resume='require': no checkpoint of an agent called {name!r}")
        if instructions is not None:
            instructed = with_instructions(state, instructions)
            if instructed is not state:  # not what a new State is: activation must load it
                state, fresh = instructed, None
        window = getattr(provider, "context_window", None)
        wants_window = uses_fraction(state.config) or "compact_trigger" not in state.config
        if "context_window" not in state.config and wants_window and is_int(window) and window > 0:
            # A `fraction` needs the model's window, and so does the default trigger (0.85 of
            # it): the provider knows it (written into the config, so a checkpoint keeps it).
            state, fresh = state.evolve(config={**state.config, "context_window": window}), None
        compactor = self._compactor(summarizer if summarizer is not None else provider, plugins, options)
        settings = compactor.compact_config(state)  # a malformed config fails the spawn, not the first turn
        if self.store is None:  # journals go to the config's directory: unusable fails the spawn too
            await compactor.start_store(settings)
        given = await self._live_tools(tools)
        if recall:
            if any(isinstance(t, Tool) and t.name == "recall" for t in given):
                raise ConfigError("recall=True adds a tool named 'recall', but one of the given tools has that name")
            budget = recall_budget(settings.context_window or getattr(provider, "context_window", None))
            given += (recall_tool(compactor.store_for(settings), name, budget_tokens=budget),)
        if grants.children:
            given = (*given, delegate_tool(self, name, grants.targets))
        slot = Slot(provider, given, plugins, config, summarizer, options, grants)
        # A new State is what it had (activation rebuilds it) only when none was loaded: a
        # resumed state is as good as saved, but activation must read it back.
        slot.fresh = fresh is state and saved is None
        agent = self._make_agent(name, slot, state, compactor, saved=fresh)
        if resume:  # the resumed state's compactions are committed in its journal too
            await agent.commit_journal(state)
        if name in self._slots:  # spawned meanwhile, while a checkpoint was read
            raise ConfigError(f"an agent called {name!r} is already running")
        self._slots[name] = slot
        self._agents[name] = agent
        slot.ref = agent.ref
        if not any(p.implements("on_start") for p in plugins):
            # Ready by construction: the mailbox exists and the task is scheduled, so requests
            # queue at once and are served in order. No need for start()'s round trip.
            self._nursery.start_soon(agent.main, name=name)
            self._make_room()
            return agent.ref
        try:  # on_start plugins run before the agent counts as ready
            ref: AgentRef = await self._nursery.start(agent.main, name=name)
        except BaseException:
            self._agents.pop(name, None)
            self._slots.pop(name, None)
            raise
        self._make_room()
        return ref

    async def _live_tools(self, tools: Iterable[Tool | ToolSource | ToolSet]) -> tuple[Tool | ToolSet, ...]:
        """`Tool` values as they are, tool sources (MCP servers) as the `ToolSet` they serve:
        each source is started once, in the runtime's nursery, at the first spawn that names it,
        and stops with the runtime. Two tools of one name (a server's tool named like another
        tool) are a `ConfigError`."""
        out: list[Tool | ToolSet] = []
        for t in tools:
            if isinstance(t, (Tool, ToolSet)):
                out.append(t)
            elif isinstance(t, ToolSource):
                async with self._sources_lock:
                    if self._closed:
                        raise AgentStopped("the runtime is closed")
                    live = self._sources.get(t)
                    if live is None:
                        live = await self._nursery.start(t.serve)
                        self._sources[t] = live
                out.append(live)
            else:
                raise ConfigError(f"tools must be cmdc Tool values (use @cmdc.tool) or tool sources, got {t!r:.80}")
        seen: dict[str, str] = {}
        for item in out:
            for name in item.tools if isinstance(item, ToolSet) else (item.name,):
                where = f"tool set {item.name!r}" if isinstance(item, ToolSet) else "the tools given"
                if name in seen:
                    raise ConfigError(
                        f"two tools are named {name!r} (in {seen[name]} and in {where}); "
                        "give an MCP server a prefix (cmdc.mcp.stdio(..., prefix='x_'))"
                    )
                seen[name] = where
        return tuple(out)

    def _compactor(self, summarizer: Summarizer, plugins: tuple[Plugin, ...], options: AgentOptions) -> Compactor:
        """An agent's compactor. When both attempts of a model summarizer (a provider) fail (an
        error, a summary cut off or without its sections; the retry reads smaller chunks, and
        the provider retries its own HTTP failures), the offline `ExtractiveSummarizer` writes
        the summary (a `summarizer_fallback` event says so): a weak model never stops
        compaction. A model that gave up in two compactions in a row is suspended (not asked)
        for the next 4, then 8, 16, ... up to 64 compactions while it keeps failing (a
        `summarizer_suspended` event; `SummarizerBreaker`). A summarizer given as a callable is
        the caller's own code: retried as `Compactor` does by default, no fallback."""
        model = not callable(summarizer)
        last_resort = (ExtractiveSummarizer(),) if model else ()
        return Compactor(
            summarizer,
            plugins=plugins,
            fallbacks=last_resort,
            retries=1 if model else 3,
            breaker=SummarizerBreaker() if model else None,
            on_event=self.bus.publish if self.tracing is None else self._publish_traced,
            store=self.store,
            commit_journal=False,  # the agent commits the journal after it commits its state
            summarizer_timeout=options.summarizer_timeout,
        )

    def _publish_traced(self, event: Event) -> None:
        """A compactor's event, to the bus and to the tracer (its current span notes it)."""
        self.bus.publish(event)
        if self.tracing is not None:
            self.tracing.event(event)

    def _make_agent(
        self, name: str, slot: Slot, state: State, compactor: Compactor | None = None, saved: State | None = None
    ) -> Agent:
        if compactor is None:
            summarizer = slot.summarizer if slot.summarizer is not None else slot.provider
            compactor = self._compactor(summarizer, slot.plugins, slot.options)
        agent = Agent(
            name=name,
            state=state,
            provider=slot.provider,
            compactor=compactor,
            tools=slot.tools,
            plugins=slot.plugins,
            options=slot.options,
            bus=self.bus,
            checkpoints=self.checkpoints,
            on_exit=self._forget,
            ref=slot.ref,
            activated=slot.ref is not None,
            saved=saved,
            on_active=self._touch if self._virtual else None,
            tracer=self.tracing,
            host=self,
        )
        return agent

    def _forget(self, agent: Agent) -> None:
        if self._agents.get(agent.name) is agent:
            del self._agents[agent.name]
            self._unlease(agent.name)
        slot = self._slots.get(agent.name)
        if slot is None or slot.ref is not agent.ref:
            return
        if agent.deactivating and not self._closed:
            # Deactivated: keep what it takes to activate it again, free the rest.
            slot.plugins = agent.plugins
            slot.pending = agent.pending or NO_PENDING
            slot.fresh = slot.fresh and not agent.checkpointed
            agent.ref.unbind()
            self._deactivations += 1
            self._emit(agent.name, DEACTIVATED)
        else:
            del self._slots[agent.name]
            agent.ref.mark_stopped()

    async def run_child(self, parent: str, task: str) -> str:
        """Run `task` on a new temporary child of the resident agent `parent` (its provider,
        tools, config, summarizer and options; children of its own; it accepts its parent's
        tasks only) and return the child's final answer. The child is stopped, and its
        checkpoint deleted, when this returns or is cancelled (its journal stays)."""
        me = self._agents.get(parent)
        if me is None:
            raise AgentStopped(f"agent {parent!r} is not running")
        with self.child_slot(parent, me.options.max_children):
            name = self.child_name(parent)
            child = await self.spawn(
                name,
                me.provider,
                tools=[*(t for t in me.own_tools.values() if t.name not in ("delegate", "recall")), *me.toolsets],
                config=me.state.config,
                summarizer=me.compactor.options.summarizer,
                options=attrs.evolve(me.options, restart="temporary"),
                delegation=True,  # children of its own, and no named agent
                accepts=(parent,),  # its parent's tasks only
            )
            try:
                with self.waiting(parent, name):
                    return (await child.prompt(task)).text
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(10):
                    await child.stop()
                    if self.checkpoints is not None:  # a temporary child leaves no checkpoint behind
                        with contextlib.suppress(CmdcError):
                            await self.checkpoints.delete(name)

    def _emit(self, name: str, kind: str, **data: Any) -> None:
        if self.bus.listening(name):
            self.bus.publish(Event(kind, name, data, trio.current_time()))


def uses_fraction(config: Mapping[str, Any]) -> bool:
    """Whether `compact_trigger` or `compact_keep` has a `("fraction", f)` form."""
    for key in ("compact_trigger", "compact_keep"):
        value: Any = config.get(key)
        several = isinstance(value, (list, tuple)) and bool(value) and isinstance(value[0], (list, tuple))
        forms: tuple[Any, ...] = tuple(value) if several else (value,)
        if any(isinstance(f, (list, tuple)) and len(f) == 2 and f[0] == "fraction" for f in forms):
            return True
    return False


def with_instructions(state: State, instructions: str) -> State:
    """`state` with `instructions` as its system prompt: its leading system messages are
    replaced by one (kept as they are when the text is the same)."""
    lead = 0
    while lead < len(state.messages) and state.messages[lead].role == "system":
        lead += 1
    if lead == 1 and state.messages[0].text == instructions:
        return state
    messages = (Message.system(instructions), *state.messages[lead:])
    # A usage reported before counted the old prompt: re-estimate until the next reply.
    return state.evolve(messages=messages, usage_floor=len(messages) if state.messages else 0)


def recall_budget(window: object) -> int:
    """The recall tool's output budget: 2,000 tokens, or a sixteenth of a smaller model's
    window (at least `MIN_BUDGET`), so that reading history back never crowds out the context."""
    if not is_int(window) or window < 1:
        return DEFAULT_RECALL_BUDGET
    return max(MIN_BUDGET, min(DEFAULT_RECALL_BUDGET, window // 16))


@asynccontextmanager
async def open_runtime(
    *,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    log_events: bool = True,
    deactivate_after: float | None = None,
    max_resident: int | None = None,
    store: str | os.PathLike[str] | Store | None = None,
    tracing: Tracer | None = None,
    lease_ttl: float | None = None,
    lease_owner: str | None = None,
    ui: bool | int | None = None,
) -> AsyncIterator[Runtime]:
    """A runtime owning a nursery of agents; leaving the block stops every agent, and any
    caller still waiting on one gets `AgentStopped`.

    `store`: where everything durable goes, for every agent: a directory (the file store:
    `<dir>/<agent>.jsonl` journals and `<dir>/<agent>.state.json` checkpoints), a
    `postgresql://` URL (extra `postgres`), or a store object (see `cmdc.store`; the runtime
    starts it, and closes it only if it made it from a string). Each agent's state is saved
    there at every commit, and `spawn(..., resume=True)` picks it up. Without a store, journals
    go to each agent's `compact_offload_dir` and `checkpoint_dir`, if given, holds checkpoints.
    `log_events`: every event also goes to logging, one line each, where the application
    configured it (structlog if configured, else the stdlib logger `cmdc`); silent otherwise.

    Virtual agents (they need a checkpoint store): `deactivate_after` seconds without a
    request deactivate an agent; beyond `max_resident` agents in memory, the least recently
    active idle ones are deactivated (a soft bound: busy agents are never deactivated). The
    next call on a deactivated agent's name or `AgentRef` activates it again from its checkpoint.

    `tracing`: a tracer for every agent's turns, model requests, tool calls and compactions,
    such as `cmdc.otel.Tracing()` (OpenTelemetry, extra `otel`); None (the default): no tracing.

    Name leases (`lease_ttl` seconds; they need a store with leases, as both shipped stores
    are): every name this runtime makes resident is leased to it in the store first, so that
    among all the runtimes (processes, machines) sharing the store, a name is active in at most
    one. Activating a name another runtime holds raises `NameLeased`; leases are renewed every
    `lease_ttl / 3` seconds, released when the agent leaves memory, and expire `lease_ttl`
    seconds after their owner died (the file store's flock ends with its process instead). A
    runtime whose lease was taken over cannot write for that agent any more (`LeaseLost`; the
    agent leaves memory). `lease_owner`: this runtime's name in the leases (default: host, pid
    and a random part).

    With a store many processes share (a `postgresql://` store: its class says `shared`), name
    leases are on by default, with a ttl of `DEFAULT_LEASE_TTL` (30) seconds: two runtimes on
    one database never run one agent name at once (the second gets `NameLeased`), whether or
    not the user knew to ask. A directory store is unchanged: its journals' flocks, and lease
    flocks when `lease_ttl` is given.

    `ui`: serve the local web page of the agents (extra `ui`; see `Runtime.serve_ui`): True on
    a free port, or a port number; its server is `rt.ui` (`rt.ui.url` opens it).
    """
    if ui is not None and ui is not False and (ui is not True and (not is_int(ui) or not 0 <= ui <= 65535)):
        raise ConfigError(f"ui must be True or a port number (0-65535), got {ui!r:.80}")
    deactivate_after = optional_seconds(deactivate_after, "deactivate_after")
    max_resident = optional_integer(max_resident, "max_resident")
    if (deactivate_after is not None or max_resident is not None) and checkpoint_dir is None and store is None:
        raise ConfigError(
            "virtual agents (deactivate_after, max_resident) need a store for their state: "
            "store=... or checkpoint_dir=..."
        )
    if tracing is not None and not all(
        callable(getattr(tracing, m, None)) for m in ("turn", "request", "tool", "compaction", "event")
    ):
        raise ConfigError(f"tracing must be a tracer such as cmdc.otel.Tracing(), got {tracing!r:.80}")
    if store is not None and checkpoint_dir is not None:
        raise ConfigError("give store=... or checkpoint_dir=..., not both (a store holds the checkpoints too)")
    lease_ttl = optional_seconds(lease_ttl, "lease_ttl")
    if lease_owner is not None and (not isinstance(lease_owner, str) or not 1 <= len(lease_owner) <= 200):
        raise ConfigError(f"lease_owner must be a string of 1 to 200 characters, got {lease_owner!r:.80}")
    if lease_ttl is not None and store is None:
        raise ConfigError("name leases (lease_ttl) need a store=... that has them (a directory or a postgresql:// URL)")
    bus = EventBus(log=log_events)
    chosen = None if store is None else open_store(store)
    checkpoints: Checkpoints | None = None if checkpoint_dir is None else FileCheckpoints(checkpoint_dir)
    if lease_ttl is None and chosen is not None and chosen.shared:
        lease_ttl = DEFAULT_LEASE_TTL  # a database many processes share: one activation per name, by default
    if lease_ttl is not None and not isinstance(chosen, Leases):
        raise ConfigError(f"name leases (lease_ttl) need a store with leases; {chosen!r:.80} has none")
    if lease_ttl is not None and lease_owner is None:
        lease_owner = f"{socket.gethostname()[:100]}:{os.getpid()}:{secrets.token_hex(4)}"
    if chosen is not None:
        await chosen.start()  # the file store probes its directory, PostgreSQL connects
        checkpoints = chosen.checkpoints
    elif isinstance(checkpoints, FileCheckpoints):
        await checkpoints.check_usable()
    runtime: Runtime | None = None
    try:
        async with trio.open_nursery() as nursery:
            runtime = Runtime(
                nursery,
                bus,
                checkpoints,
                deactivate_after=deactivate_after,
                max_resident=max_resident,
                store=chosen,
                tracing=tracing,
                lease_ttl=lease_ttl,
                lease_owner=lease_owner,
            )
            if deactivate_after is not None:
                nursery.start_soon(runtime._reap_idle, deactivate_after)
            if runtime._leases is not None:
                nursery.start_soon(runtime._renew_leases)
            if ui is not None and ui is not False:
                runtime.ui = await runtime.serve_ui(0 if ui is True else int(ui))
            try:
                yield runtime
            finally:
                runtime._closed = True
                nursery.cancel_scope.cancel()
                bus.close()
    except BaseExceptionGroup as group:
        # The agents' tasks never raise, so a group holds what left the block: one exception
        # comes out as itself (as trio's own context managers do), more stay a group.
        if len(group.exceptions) != 1:
            raise
        reraise(group.exceptions[0])
    finally:
        if runtime is not None and runtime._leases is not None:  # every agent has ended: give the names up
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await runtime._release_all()
        if chosen is not None and chosen is not store:  # made here from a string: closed here
            with trio.CancelScope(shield=True):
                await chosen.aclose()


__all__ = ["Runtime", "open_runtime"]
