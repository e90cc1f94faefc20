"""The event bus: every event goes to the subscribers that want it and, one line each, to the
application's logging (see `cmdc.events`: silent unless the application configured logging).

Each subscription has a bounded buffer. When it is full the oldest event is dropped and
counted, and the subscriber's next event is a synthetic `events_dropped` event carrying the
count, so a slow subscriber loses events visibly and never slows a publisher. Subscribers are
indexed by agent: publishing one agent's event touches only that agent's subscribers and the
all-agents ones.
"""

from __future__ import annotations

from collections import deque
from types import TracebackType

import trio

from .._check import integer
from ..events import EVENTS_DROPPED, Event, log_event, logging_enabled
from ..state import validate_agent_id


def _now() -> float:
    try:
        return trio.current_time()
    except RuntimeError:  # outside trio
        return 0.0


class Subscription:
    """A subscriber's view of the bus: the events of one agent (or of all agents, `agent=None`).

    Use it as `with bus.subscribe(...) as sub:` (leaving the block unsubscribes), then
    `await sub.receive()` or `async for event in sub:`. After `close()` nothing more arrives,
    buffered events are discarded and receivers end with `trio.EndOfChannel`. When the bus
    closes, what is already buffered can still be received, then receivers end.
    """

    def __init__(self, bus: EventBus | None, agent: str | None, buffer: int) -> None:
        self.agent = agent
        self.dropped = 0  # events dropped over the subscription's life
        self._bus = bus
        self._events: deque[Event] = deque(maxlen=buffer)
        self._unreported = 0  # dropped since the last `events_dropped` event
        self._closed = False
        self._lot = trio.lowlevel.ParkingLot()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._events)} buffered"
        return f"<Subscription agent={self.agent!r} {state}>"

    @property
    def buffer(self) -> int:
        maxlen = self._events.maxlen
        assert maxlen is not None
        return maxlen

    @property
    def closed(self) -> bool:
        return self._closed

    def _push(self, event: Event) -> None:
        if len(self._events) == self._events.maxlen:  # the append below drops the oldest
            self._unreported += 1
            self.dropped += 1
        self._events.append(event)
        if len(self._lot):
            self._lot.unpark_all()

    def _end(self, *, drain: bool) -> None:
        self._closed = True
        self._bus = None
        if not drain:
            self._events.clear()
            self._unreported = 0
        if len(self._lot):
            self._lot.unpark_all()

    def receive_nowait(self) -> Event:
        """The next event; `trio.WouldBlock` if there is none yet, `trio.EndOfChannel` if there
        will be none."""
        if self._unreported:
            count, self._unreported = self._unreported, 0
            return Event(EVENTS_DROPPED, agent_id=None, data={"count": count}, time=_now())
        if self._events:
            return self._events.popleft()
        if self._closed:
            raise trio.EndOfChannel
        raise trio.WouldBlock

    async def receive(self) -> Event:
        """The next event, waiting for one; `trio.EndOfChannel` once the subscription is closed."""
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            event = self.receive_nowait()
        except trio.WouldBlock:
            pass
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return event
        while True:
            await self._lot.park()  # nothing is taken until woken, so a cancel loses nothing
            try:
                return self.receive_nowait()
            except trio.WouldBlock:  # another receiver of this subscription took it
                continue

    def close(self) -> None:
        """Unsubscribe: stop delivery, discard what is buffered, end pending receivers."""
        if self._bus is not None:
            self._bus._remove(self)
        self._end(drain=False)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None


class EventBus:
    """Delivers published events to subscribers and (if `log`) to logging; see the module
    docstring. Use it from trio's thread (or outside any trio run)."""

    def __init__(self, log: bool = True) -> None:
        self.log = log
        self._by_agent: dict[str, dict[Subscription, None]] = {}  # insertion-ordered sets
        self._all: dict[Subscription, None] = {}
        self._closed = False

    def subscribe(self, agent: str | None = None, *, buffer: int = 256) -> Subscription:
        """A subscription to `agent`'s events (all agents' if None), buffering up to `buffer`.
        On a closed bus the subscription is already closed."""
        if agent is not None:
            validate_agent_id(agent)
        integer(buffer, "subscription buffer")
        if self._closed:
            sub = Subscription(None, agent, buffer)
            sub._end(drain=True)
        else:
            sub = Subscription(self, agent, buffer)
            if agent is None:
                self._all[sub] = None
            else:
                self._by_agent.setdefault(agent, {})[sub] = None
        return sub

    def _remove(self, sub: Subscription) -> None:
        if sub.agent is None:
            self._all.pop(sub, None)
            return
        subs = self._by_agent.get(sub.agent)
        if subs is not None:
            subs.pop(sub, None)
            if not subs:
                del self._by_agent[sub.agent]

    def end_agent(self, agent_id: str) -> None:
        """`agent_id` stopped: its subscribers receive what is buffered, then their iteration
        ends. All-agents subscriptions go on. A later subscription to the name (an agent
        spawned again under it) is a new one."""
        for sub in self._by_agent.pop(agent_id, {}):
            sub._end(drain=True)

    def listening(self, agent_id: str | None) -> bool:
        """Whether an event of `agent_id` would reach anyone (a subscriber or the log), so a
        publisher can skip building it."""
        return (
            bool(self._all) or (agent_id is not None and agent_id in self._by_agent) or (self.log and logging_enabled())
        )

    def publish(self, event: Event) -> None:
        """Deliver `event` to its agent's subscribers and to the all-agents ones, then log it.
        Never blocks and never raises."""
        if event.agent_id is not None:
            for sub in self._by_agent.get(event.agent_id, ()):
                sub._push(event)
        for sub in self._all:
            sub._push(event)
        if self.log:
            log_event(event)

    def close(self) -> None:
        """Close every subscription: receivers get what is buffered, then `trio.EndOfChannel`."""
        self._closed = True
        subs = [*self._all, *(sub for group in self._by_agent.values() for sub in group)]
        self._all.clear()
        self._by_agent.clear()
        for sub in subs:
            sub._end(drain=True)


__all__ = ["EVENTS_DROPPED", "EventBus", "Subscription"]
