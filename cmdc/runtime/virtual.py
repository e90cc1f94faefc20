"""Virtual agents: an agent is addressable from its spawn until it is stopped (a `Slot`), and
resident (its task in memory) only while in use. An idle one is deactivated (its state saved to
the checkpoint store, its task ended) and activated again from the store by the next call on
its name or `AgentRef`; beyond `max_resident` the least recently active idle ones make room."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import trio

from ..compaction.summary import Summarizer
from ..errors import AgentStopped, CheckpointError, CmdcError, ConfigError, MailboxFull
from ..events import ACTIVATED, STOPPED
from ..message import Message
from ..plugins import Plugin
from ..providers.base import Provider
from ..state import State
from ..tools import Tool, ToolSet
from .delegation import NO_GRANTS, Grants
from .mailbox import Deactivate, Reply
from .options import AgentOptions

if TYPE_CHECKING:
    from ..compaction import Compactor
    from ..store import Checkpoints, Leases
    from .agent import Agent
    from .bus import EventBus
    from .ref import AgentRef

NO_PENDING: list[Message] = []
"""What a slot with nothing queued holds (shared, never appended to): a million deactivated
agents do not keep a million empty lists."""


class Slot:
    """An addressable agent: what it takes to (re)start it, whether or not it is resident."""

    __slots__ = (
        "activating",
        "config",
        "fresh",
        "grants",
        "options",
        "pending",
        "plugins",
        "provider",
        "ref",
        "summarizer",
        "tools",
    )

    def __init__(
        self,
        provider: Provider,
        tools: tuple[Tool | ToolSet, ...],
        plugins: tuple[Plugin, ...],
        config: Mapping[str, Any] | None,
        summarizer: Summarizer | None,
        options: AgentOptions,
        grants: Grants = NO_GRANTS,
    ) -> None:
        self.provider = provider
        self.tools = tools
        self.plugins = plugins
        self.config = config
        self.summarizer = summarizer
        self.options = options
        self.grants = grants  # whom it may delegate to, and whose tasks it accepts
        self.ref: AgentRef | None = None
        self.pending: list[Message] = NO_PENDING  # sent while not resident (a list of its own once any is)
        self.activating: trio.Event | None = None
        self.fresh = True  # nothing checkpointed in this life yet: it activates as a new State


class VirtualAgents:
    """Activation and deactivation (a part of `Runtime`; it is the `Host` of every `AgentRef`
    it hands out)."""

    _agents: dict[str, Agent]  # the resident agents, least recently active first
    _slots: dict[str, Slot]  # every addressable agent
    _closed: bool
    _virtual: bool
    _activations: int
    _deactivations: int
    _leaving: set[str]  # asked to deactivate, not refused yet
    _leases: Leases | None
    _nursery: trio.Nursery
    checkpoints: Checkpoints | None
    max_resident: int | None
    bus: EventBus

    if TYPE_CHECKING:

        def _make_agent(
            self, name: str, slot: Slot, state: State, compactor: Compactor | None = None, saved: State | None = None
        ) -> Agent: ...

        def _emit(self, name: str, kind: str, **data: Any) -> None: ...

        async def _lease(self, name: str) -> None: ...

        def _unlease(self, name: str) -> None: ...

    def _touch(self, agent: Agent) -> None:
        """The agent was just active: it becomes the most recently active resident."""
        if self._agents.get(agent.name) is agent:
            del self._agents[agent.name]
            self._agents[agent.name] = agent
        self._make_room()

    async def activate(self, ref: AgentRef) -> Agent:
        """Make the agent behind `ref` resident again (from its checkpoint) and return it."""
        while True:
            slot = self._slots.get(ref.name)
            if self._closed or ref.stopped or slot is None or slot.ref is not ref:
                raise AgentStopped(f"agent {ref.name!r} has stopped")
            agent = ref.agent
            if agent is not None:
                if not agent.deactivating:
                    return agent
                await agent.wait_done()  # its deactivation ends first (its state is saved)
                continue
            if slot.activating is not None:  # someone else is activating it: wait for them
                await slot.activating.wait()
                continue
            slot.activating = trio.Event()
            leased = False
            try:
                assert self.checkpoints is not None  # virtual agents need a checkpoint store
                await self._lease(ref.name)
                leased = True
                if slot.fresh and self._leases is None:  # never checkpointed in this life: a new State is what it had
                    state = State(agent_id=ref.name, config=slot.config)
                else:  # (with leases another runtime may have had it since: always the store's word)
                    loaded = await self.checkpoints.load(ref.name)
                    if loaded is None and not slot.fresh:
                        raise CheckpointError(f"agent {ref.name!r}: its checkpoint vanished while it was deactivated")
                    state = loaded if loaded is not None else State(agent_id=ref.name, config=slot.config)
                if self._closed or ref.stopped:
                    continue
                agent = self._make_agent(ref.name, slot, state, saved=state)
                if slot.pending:
                    agent.pending, slot.pending = slot.pending, NO_PENDING
                agent.restart_count = ref.restarts
                self._agents[ref.name] = agent
                self._nursery.start_soon(agent.main, name=ref.name)
                self._activations += 1
                self._emit(ref.name, ACTIVATED)
                self._make_room()
                leased = False  # the agent holds it now
                return agent
            finally:
                if leased:
                    self._unlease(ref.name)
                slot.activating.set()
                slot.activating = None

    async def deactivate(self, name: str) -> bool:
        """Deactivate the agent `name` now if it is idle (virtual agents only); return whether
        it was. Its state is saved first; the next call on it activates it again."""
        if not self._virtual:
            raise ConfigError("deactivate needs virtual agents: open_runtime(deactivate_after=... or max_resident=...)")
        agent = self._agents.get(name)
        if agent is None or agent.deactivating or not agent.idle():
            return False
        request = Deactivate(Reply())
        try:
            agent.enqueue_nowait(request)
        except CmdcError:
            return False
        done: bool = await request.reply.wait()
        if done:
            await agent.wait_done()
        return done

    def _request_deactivation(self, agent: Agent) -> None:
        with contextlib.suppress(CmdcError):  # full or closed: it is not idle anyway
            agent.enqueue_nowait(Deactivate(Reply()))
            agent.leaving = True
            self._leaving.add(agent.name)

    def _make_room(self) -> None:
        """Beyond `max_resident`, ask the least recently active idle agents to deactivate."""
        if self.max_resident is None:
            return
        excess = len(self._agents) - self.max_resident
        if excess <= 0:
            return
        # agents already on their way out (asked, not refused) make room too
        self._leaving = {n for n in self._leaving if (a := self._agents.get(n)) is not None and a.leaving}
        excess -= len(self._leaving)
        if excess <= 0:
            return
        # From the least recently active on, and only as far as it takes (not a copy of every
        # resident agent per call: this runs at every request).
        chosen: list[Agent] = []
        for agent in self._agents.values():
            if len(chosen) >= excess:
                break
            if agent.idle() and not agent.deactivating and not agent.leaving:
                chosen.append(agent)
        for agent in chosen:
            self._request_deactivation(agent)

    async def _reap_idle(self, after: float) -> None:
        """Deactivate agents idle for `after` seconds; sleeps until the next one is due."""
        while True:
            now = trio.current_time()
            wake = now + after
            due_now: list[Agent] = []
            for agent in self._agents.values():  # least recently active first
                due = agent.last_active + after
                if due > now:
                    wake = min(wake, due)
                    break
                if agent.idle() and not agent.deactivating and not agent.leaving:
                    due_now.append(agent)
            for agent in due_now:
                self._request_deactivation(agent)
            await trio.sleep_until(wake)

    async def stop_inactive(self, ref: AgentRef) -> None:
        slot = self._slots.get(ref.name)
        if slot is not None and slot.ref is ref and ref.agent is None:
            while slot.activating is not None:
                await slot.activating.wait()
            if ref.agent is None:
                del self._slots[ref.name]
                ref.mark_stopped()
                self._emit(ref.name, STOPPED, reason="stopped", restarts=ref.restarts)
                self.bus.end_agent(ref.name)  # as when a resident agent stops
                return
        await ref.stop()

    def send_inactive(self, ref: AgentRef, messages: tuple[Message, ...]) -> None:
        slot = self._slots.get(ref.name)
        if slot is None or slot.ref is not ref:
            raise AgentStopped(f"agent {ref.name!r} has stopped")
        if len(slot.pending) + len(messages) > slot.options.max_queued:
            raise MailboxFull(f"agent {ref.name!r}: {len(slot.pending)} messages already queued")
        if slot.pending is NO_PENDING:
            slot.pending = []
        slot.pending.extend(messages)

    def queued_inactive(self, ref: AgentRef) -> list[Message]:
        slot = self._slots.get(ref.name)
        return slot.pending if slot is not None and slot.ref is ref else []

    def add_plugin_inactive(self, ref: AgentRef, plugin: Plugin) -> None:
        slot = self._slots.get(ref.name)
        if slot is None or slot.ref is not ref:
            raise AgentStopped(f"agent {ref.name!r} has stopped")
        slot.plugins = (*slot.plugins, plugin)


__all__ = ["NO_PENDING", "Slot", "VirtualAgents"]
