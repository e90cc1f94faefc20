"""Tests for the event bus (cmdc.bus)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import structlog
import trio
import trio.testing
from structlog.testing import capture_logs

from cmdc.bus import EVENTS_DROPPED, EventBus, Subscription
from cmdc.errors import ConfigError
from cmdc.events import Event
from cmdc.testing import drain


def ev(kind: str, agent: str | None = "a", **data: Any) -> Event:
    return Event(kind, agent_id=agent, data=data)


async def test_per_agent_and_all_agents_in_order() -> None:
    bus = EventBus(log=False)
    with bus.subscribe("a") as sub_a, bus.subscribe("b") as sub_b, bus.subscribe() as sub_all:
        events = [ev("e0", "a"), ev("e1", "b"), ev("e2", "a"), ev("e3", None), ev("e4", "c")]
        for e in events:
            bus.publish(e)
        assert [e.kind for e in drain(sub_a)] == ["e0", "e2"]
        assert [e.kind for e in drain(sub_b)] == ["e1"]
        assert drain(sub_all) == events


async def test_receive_waits_for_events() -> None:
    bus = EventBus(log=False)
    got: list[str] = []

    async def reader(sub: Subscription) -> None:
        async for e in sub:
            got.append(e.kind)

    sub = bus.subscribe("a")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader, sub)
        await trio.testing.wait_all_tasks_blocked()
        for i in range(5):
            bus.publish(ev(f"e{i}"))
            await trio.testing.wait_all_tasks_blocked()
        assert got == [f"e{i}" for i in range(5)]
        bus.close()  # the reader's iteration ends, so the nursery exits
    assert sub.closed


async def test_slow_subscriber_gets_drop_report_then_latest() -> None:
    bus = EventBus(log=False)
    with bus.subscribe("a", buffer=3) as sub:
        for i in range(10):
            bus.publish(ev(f"e{i}"))
        first = await sub.receive()
        assert first.kind == EVENTS_DROPPED
        assert first.agent_id is None
        assert dict(first.data) == {"count": 7}
        assert [(await sub.receive()).kind for _ in range(3)] == ["e7", "e8", "e9"]
        assert sub.dropped == 7
        # the count is per report: two more drops later are reported as 2, before the rest
        for i in range(10, 15):
            bus.publish(ev(f"e{i}"))
        kinds = [(e.kind, dict(e.data)) for e in drain(sub)]
        assert kinds == [(EVENTS_DROPPED, {"count": 2}), ("e12", {}), ("e13", {}), ("e14", {})]
        assert sub.dropped == 9


async def test_slow_subscriber_does_not_affect_others() -> None:
    bus = EventBus(log=False)
    with bus.subscribe("a", buffer=1) as slow, bus.subscribe("a", buffer=100) as fast:
        for i in range(50):
            bus.publish(ev(f"e{i}"))
        assert [e.kind for e in drain(fast)] == [f"e{i}" for i in range(50)]
        assert [e.kind for e in drain(slow)] == [EVENTS_DROPPED, "e49"]


async def test_unsubscribe_stops_delivery() -> None:
    bus = EventBus(log=False)
    sub = bus.subscribe("a")
    other = bus.subscribe()
    with sub:
        bus.publish(ev("kept"))
    bus.publish(ev("after"))
    with pytest.raises(trio.EndOfChannel):
        await sub.receive()
    assert [e.kind for e in drain(other)] == ["kept", "after"]
    other.close()
    other.close()  # idempotent
    bus.publish(ev("nobody"))
    assert drain(other) == []
    assert bus._by_agent == {}
    assert bus._all == {}


async def test_close_wakes_pending_receivers() -> None:
    bus = EventBus(log=False)
    ended: list[str] = []

    async def waiter(sub: Subscription, name: str) -> None:
        with pytest.raises(trio.EndOfChannel):
            await sub.receive()
        ended.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter, bus.subscribe("a"), "a")
        nursery.start_soon(waiter, bus.subscribe(), "all")
        await trio.testing.wait_all_tasks_blocked()
        bus.close()
    assert sorted(ended) == ["a", "all"]


async def test_close_drains_buffered_then_ends() -> None:
    bus = EventBus(log=False)
    sub = bus.subscribe("a")
    bus.publish(ev("e0"))
    bus.publish(ev("e1"))
    bus.close()
    bus.publish(ev("late"))
    assert [e.kind async for e in sub] == ["e0", "e1"]
    late = bus.subscribe("a")  # a subscription to a closed bus is closed already
    assert late.closed
    assert [e async for e in late] == []


async def test_unsubscribe_wakes_receiver() -> None:
    bus = EventBus(log=False)
    sub = bus.subscribe()
    got: list[Event] = []

    async def reader() -> None:
        async for e in sub:
            got.append(e)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        sub.close()
    assert got == []


async def test_cancelled_receive_loses_nothing() -> None:
    bus = EventBus(log=False)
    with bus.subscribe("a") as sub:
        with trio.move_on_after(0.01):
            await sub.receive()
        bus.publish(ev("e0"))
        with trio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(trio.Cancelled):
                await sub.receive()
        assert (await sub.receive()).kind == "e0"


@pytest.mark.parametrize("buffer", [0, -1, True, 2.5, "3"])
def test_bad_buffer(buffer: Any) -> None:
    with pytest.raises(ConfigError):
        EventBus(log=False).subscribe("a", buffer=buffer)


def test_bad_agent() -> None:
    with pytest.raises(ConfigError):
        EventBus(log=False).subscribe("../x")


@attrs.frozen
class Report:
    tokens: int
    path: str
    _cache: bytes = attrs.field(default=b"x" * 100, repr=False)


async def test_logging_one_entry_per_event() -> None:
    bus = EventBus()
    with capture_logs() as logs:
        bus.publish(ev("turn_start", "a", step=1))
        bus.publish(ev("compaction_end", "b", report=Report(5, "/p"), error=ValueError("boom"), ids=("x", "y")))
        bus.publish(Event("odd", data={"event": "clash", "agent": "clash"}))
    assert len(logs) == 3
    assert logs[0] == {
        "event": "turn_start",
        "log_level": "debug",
        "agent": "a",
        "step": 1,
        "messages": None,  # the keys of the kind's shape are always there
        "tokens": None,
    }
    assert logs[1] == {
        "event": "compaction_end",
        "log_level": "info",
        "agent": "b",
        "report": {"tokens": 5, "path": "/p"},
        "error": "ValueError('boom')",
        "ids": ["x", "y"],
    }
    assert logs[2]["agent"] is None
    assert logs[2]["event"] == "odd"
    assert logs[2]["event_"] == "clash"
    assert logs[2]["agent_"] == "clash"


async def test_no_logging_when_disabled() -> None:
    with capture_logs() as logs:
        EventBus(log=False).publish(ev("quiet"))
    assert logs == []


async def test_raising_processor_does_not_break_publish() -> None:
    def boom(logger: Any, method: str, event_dict: Any) -> Any:
        raise RuntimeError("broken processor")

    structlog.configure(processors=[boom])  # the conftest restores structlog afterwards
    bus = EventBus()
    with bus.subscribe("a") as sub:
        bus.publish(ev("e0"))
        bus.publish(ev("e1"))
        assert [e.kind for e in drain(sub)] == ["e0", "e1"]


async def test_thousands_of_agents_only_the_target_is_woken(monkeypatch: pytest.MonkeyPatch) -> None:
    bus = EventBus(log=False)
    n = 2000
    received: dict[str, list[str]] = {}
    pushes: list[str | None] = []
    real_push = Subscription._push

    def counting_push(self: Subscription, event: Event) -> None:
        pushes.append(self.agent)
        real_push(self, event)

    async def reader(sub: Subscription) -> None:
        async for e in sub:
            received.setdefault(str(sub.agent), []).append(e.kind)

    subs = [bus.subscribe(f"agent{i}") for i in range(n)]
    monkeypatch.setattr(Subscription, "_push", counting_push)
    async with trio.open_nursery() as nursery:
        for sub in subs:
            nursery.start_soon(reader, sub)
        await trio.testing.wait_all_tasks_blocked()
        assert all(len(sub._lot) == 1 for sub in subs)
        bus.publish(ev("hello", "agent1234"))
        await trio.testing.wait_all_tasks_blocked()
        assert received == {"agent1234": ["hello"]}
        assert pushes == ["agent1234"]  # no other subscriber was even looked at
        assert sum(len(sub._lot) for sub in subs) == n  # every reader is parked again
        bus.close()
    assert received == {"agent1234": ["hello"]}
