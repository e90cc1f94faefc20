"""`AgentRef`, the handle users hold on a local agent, and `AgentHandle`, what every agent
handle offers (the local `AgentRef` and `cmdc.ray`'s `ClusterAgentRef` alike)."""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import trio

from .._report import Compacted, Skipped
from ..errors import AgentStopped
from ..message import Message
from ..plugins import Plugin
from ..state import State
from .mailbox import Call, Compact, Reply, Send, _StopRequested, as_messages, begun, check_system, prompt_request

if TYPE_CHECKING:
    from .agent import Agent


class AgentHandle(Protocol):
    """What every agent handle offers: the local `AgentRef` (`open_runtime`) and the cluster's
    `ClusterAgentRef` (`cmdc.ray.open_cluster`) both satisfy it, so code written against it
    runs on one machine or on a cluster. (Beyond it, `AgentRef` has synchronous `abort`,
    `queued`, `clear_queued`, plus `send_nowait` and `add_plugin`; the cluster ref's `abort`,
    `queued` and `clear_queued` are coroutines.)"""

    @property
    def name(self) -> str: ...

    @property
    def running(self) -> bool: ...

    async def prompt(self, content: str | Message | Sequence[Message]) -> Message: ...

    async def send(self, content: str | Message | Sequence[Message]) -> None: ...

    async def state(self) -> State: ...

    async def compact(self, instruction: str | None = None) -> Compacted | Skipped: ...

    async def ping(self) -> None: ...

    async def stop(self) -> None: ...


class Host(Protocol):
    """What an `AgentRef` asks when its agent is not resident (a virtual agent the runtime
    deactivated): make it resident again, or act on it without doing so."""

    async def activate(self, ref: AgentRef) -> Agent: ...

    async def stop_inactive(self, ref: AgentRef) -> None: ...

    def send_inactive(self, ref: AgentRef, messages: tuple[Message, ...]) -> None: ...

    def add_plugin_inactive(self, ref: AgentRef, plugin: Plugin) -> None: ...

    def queued_inactive(self, ref: AgentRef) -> list[Message]: ...


class AgentRef:
    """The handle users hold. Every method is safe to call from any task of the trio run.

    A runtime with virtual agents may deactivate an idle agent (its state is in the store, its
    task ended); the handle stays valid, and the next call that needs the agent activates it
    again, transparently (`send_nowait` just queues the messages for its next turn)."""

    __slots__ = ("_agent", "_host", "_restarts", "_stopped", "name")

    def __init__(self, agent: Agent, host: Host | None = None) -> None:
        self._agent: Agent | None = agent
        self._host = host
        self._stopped = False
        self._restarts = 0  # kept while the agent is not resident
        self.name = agent.name

    def __repr__(self) -> str:
        return f"<AgentRef {self.name!r}>"

    # -- the runtime's side: which agent task (if any) the handle reaches --------------------------
    @property
    def agent(self) -> Agent | None:
        """The agent task this handle reaches now (None while deactivated or stopped)."""
        return self._agent

    @property
    def stopped(self) -> bool:
        """Stopped for good (not merely deactivated)."""
        return self._stopped

    def bind(self, agent: Agent) -> None:
        """`agent` (a task activated again) is the one this handle reaches from now on."""
        self._agent = agent

    def unbind(self) -> None:
        """The agent was deactivated: keep its restart count, let go of its task."""
        agent = self._agent
        if agent is not None:
            self._restarts = agent.restart_count
        self._agent = None

    def mark_stopped(self) -> None:
        """The agent stopped for good: every later call raises `AgentStopped`."""
        self._stopped = True

    def _resident(self) -> Agent | None:
        agent = self._agent
        return None if agent is None or agent.deactivating else agent

    async def _live(self) -> Agent:
        """The resident agent, activated if need be."""
        agent = self._resident()
        if agent is not None:
            return agent
        if self._host is None or self._stopped:
            raise AgentStopped(f"agent {self.name!r} has stopped")
        return await self._host.activate(self)

    async def _enqueue(self, request: Any) -> Agent:
        while True:
            agent = await self._live()
            try:
                await agent.enqueue(request)
            except AgentStopped:
                if agent.deactivating:  # it was deactivated meanwhile: activate it again
                    continue
                raise
            return agent

    async def prompt(self, content: str | Message | Sequence[Message]) -> Message:
        """Run a turn with `content` as the user's message(s); return the final assistant reply.
        Errors inside the turn are raised here. Cancelling this call cancels the turn."""
        request = prompt_request(content)
        agent = await self._enqueue(request)
        return await agent.wait(request)  # type: ignore[no-any-return]

    async def send(self, content: str | Message | Sequence[Message]) -> None:
        """Queue user message(s) for the next turn, without running one (waits if the mailbox is full)."""
        messages = as_messages(content)
        self._check_system(messages)
        await self._enqueue(Send(messages))

    def send_nowait(self, content: str | Message | Sequence[Message]) -> None:
        """Like `send`, but raise `MailboxFull` instead of waiting."""
        messages = as_messages(content)
        self._check_system(messages)
        agent = self._resident()
        if agent is None and self._host is not None and not self._stopped:
            self._host.send_inactive(self, messages)
            return
        self._require(agent).enqueue_nowait(Send(messages))

    def _check_system(self, messages: Sequence[Message]) -> None:
        agent = self._resident()
        # Not resident (deactivated): its conversation has begun, as far as a send can tell.
        check_system(agent is None or begun((*agent.state.messages[-1:], *agent.pending)), messages)

    def _require(self, agent: Agent | None) -> Agent:
        if agent is None:
            if self._agent is not None and self._agent.deactivating and not self._stopped:
                return self._agent  # its closed mailbox says so, in the usual words
            raise AgentStopped(f"agent {self.name!r} has stopped")
        return agent

    async def compact(self, instruction: str | None = None) -> Compacted | Skipped:
        """Compact now (a manual compaction, like `/compact focus on the API changes`),
        between turns: `Compacted` (with its `report`) or `Skipped` (with its `reason`), as
        `Compactor.force_compact` answers. A compaction still over a trigger after its passes
        raises `CompactionIncomplete` (its gain is kept)."""
        request = Compact(instruction, Reply(), contextvars.copy_context())
        agent = await self._enqueue(request)
        outcome: Compacted | Skipped = await agent.wait(request)
        return outcome

    async def ping(self) -> None:
        """A round trip through the mailbox: returns when the agent has served it."""
        request = Call(lambda agent: None, Reply())
        agent = await self._enqueue(request)
        await agent.wait(request)

    async def state(self) -> State:
        """The last committed state (immutable; never a state in the middle of a step)."""
        await trio.lowlevel.checkpoint()
        agent = self._agent if self._stopped else await self._live()
        if agent is None:
            raise AgentStopped(f"agent {self.name!r} has stopped")
        return agent.state

    def abort(self) -> None:
        """Cancel the running turn, if any: its caller gets `TurnAborted`."""
        agent = self._resident()
        scope = None if agent is None else agent.turn_scope
        if agent is not None and scope is not None:
            agent.aborted = True
            scope.cancel()

    async def stop(self) -> None:
        """Stop the agent after the request it is serving; queued requests get `AgentStopped`."""
        while not self._stopped:
            agent = self._agent
            if agent is None or agent.deactivating:
                if self._host is None:
                    return
                if agent is not None:
                    await agent.wait_done()  # the deactivation finishes first
                    continue
                await self._host.stop_inactive(self)
                return
            if agent.done:
                return
            request = Call(_stop, Reply())
            try:
                await agent.enqueue(request)
            except AgentStopped:
                if agent.deactivating:
                    continue
                return
            await agent.wait_done()
            return

    def queued(self) -> tuple[Message, ...]:
        """The messages queued with `send` that the agent has received for its next turn."""
        agent = self._resident()
        if agent is None:
            return tuple(self._host.queued_inactive(self)) if self._host is not None and not self._stopped else ()
        return tuple(agent.pending)

    def clear_queued(self) -> tuple[Message, ...]:
        """Drop the messages `queued()` shows (a turn already running keeps what it took); returns them."""
        agent = self._resident()
        if agent is None:
            pending = self._host.queued_inactive(self) if self._host is not None and not self._stopped else []
        elif agent.current is not None:
            return ()  # the running turn has them: they are committed with it or dropped if it fails
        else:
            pending = agent.pending
        dropped = tuple(pending)
        pending.clear()
        return dropped

    def add_plugin(self, plugin: Plugin) -> None:
        """Register a plugin at run time (for turns and compactions alike)."""
        agent = self._resident()
        if agent is None and self._host is not None and not self._stopped:
            self._host.add_plugin_inactive(self, plugin)
            return
        self._require(agent).add_plugin(plugin)

    @property
    def running(self) -> bool:
        """True until the agent stops for good (a deactivated virtual agent is still running)."""
        if self._stopped:
            return False
        agent = self._agent
        return agent is None or agent.deactivating or not agent.done

    @property
    def resident(self) -> bool:
        """True while the agent's task is in memory (False for a deactivated virtual agent)."""
        return self._resident() is not None and not self._stopped

    @property
    def restarts(self) -> int:
        agent = self._agent
        return self._restarts if agent is None else agent.restart_count


def _stop(agent: Agent) -> None:
    raise _StopRequested


__all__ = ["AgentHandle", "AgentRef", "Host"]
