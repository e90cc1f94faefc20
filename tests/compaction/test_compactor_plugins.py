"""Compaction plugins: before_compact skips, aborts or evicts less (pairs re-closed), after_compact
re-injects; a raising, misbehaving or hanging plugin is reported and skipped."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from fakes import asst, check_pairs, res, state_in

from cmdc import (
    Abort,
    AfterCompact,
    BeforeCompact,
    Compacted,
    CompactionAborted,
    Compactor,
    Event,
    Message,
    Plugin,
    Skip,
    Skipped,
    State,
)
from cmdc.testing import RecordingSummarizer, conversation


class SkipAll(Plugin):
    async def before_compact(self, ctx: BeforeCompact) -> Skip:
        return Skip("not now")


class Raising(Plugin):
    priority = 1

    async def before_compact(self, ctx: BeforeCompact) -> None:
        raise ValueError("plugin bug")

    async def after_compact(self, ctx: AfterCompact) -> None:
        raise ValueError("plugin bug")


class Reinject(Plugin):
    async def after_compact(self, ctx: AfterCompact) -> State:
        return ctx.state.append(Message.user("skills re-injected"))


async def test_before_compact_skip(tmp_path: Path) -> None:
    events: list[Event] = []
    state = state_in(tmp_path, conversation(30))
    result = await Compactor(RecordingSummarizer(), plugins=[SkipAll()], on_event=events.append).force_compact(state)
    assert isinstance(result, Skipped) and result.skipped_by == "SkipAll" and result.reason == "not now"
    assert events[-1].kind == "compaction_skipped" and events[-1].data["skipped_by"] == "SkipAll"
    assert not (tmp_path / "offload").exists()


async def test_before_compact_abort(tmp_path: Path) -> None:
    class Stop(Plugin):
        async def before_compact(self, ctx: BeforeCompact) -> Abort:
            return Abort("forbidden")

    with pytest.raises(CompactionAborted, match="forbidden"):
        await Compactor(plugins=[Stop()]).force_compact(state_in(tmp_path, conversation(30)))


async def test_raising_plugins_are_reported_and_skipped(tmp_path: Path) -> None:
    events: list[Event] = []
    state = state_in(tmp_path, conversation(30))
    result = await Compactor(
        RecordingSummarizer(), plugins=[Raising(), Reinject()], on_event=events.append
    ).force_compact(state)
    assert isinstance(result, Compacted)
    errors = [e.data for e in events if e.kind == "plugin_error"]
    assert [(e["plugin"], e["hook"]) for e in errors] == [("Raising", "before_compact"), ("Raising", "after_compact")]
    assert "plugin bug" in errors[0]["error"]
    assert result.state.messages[-1].text == "skills re-injected"
    assert result.report.messages_after == len(result.state.messages)
    assert result.state.compactions == 1 and result.state.last_usage is None


async def test_before_compact_can_evict_less_and_pairs_are_reclosed(tmp_path: Path) -> None:
    msgs = [
        Message.user("task"),
        asst("A"),
        res("A", "a result " * 200),
        Message.user("keep me"),
        asst("B"),
        res("B", "b result " * 200),
        Message.user("u"),
        Message.user("last"),
    ]

    class KeepSome(Plugin):
        async def before_compact(self, ctx: BeforeCompact) -> list[Message]:
            # drop "keep me" and only the result of B: B's call must stay with it
            return [m for m in ctx.evicted if m.text != "keep me" and m.tool_call_id != "B"]

    state = state_in(tmp_path, msgs, compact_keep=("messages", 1))
    result = await Compactor(RecordingSummarizer(), plugins=[KeepSome()], pin_task=False).force_compact(state)
    assert isinstance(result, Compacted)
    kept = result.state.messages[1:]
    assert [m.tool_call_id or (m.tool_calls[0].id if m.tool_calls else m.text) for m in kept] == [
        "keep me",
        "B",
        "B",
        "last",
    ]
    check_pairs(kept, msgs)


async def test_a_bad_plugin_return_is_ignored(tmp_path: Path) -> None:
    class Bad(Plugin):
        async def before_compact(self, ctx: BeforeCompact) -> list[Message]:
            return [Message.user("not offered")]

    events: list[Event] = []
    result = await Compactor(RecordingSummarizer(), plugins=[Bad()], on_event=events.append).force_compact(
        state_in(tmp_path, conversation(30))
    )
    assert isinstance(result, Compacted)
    assert any(e.kind == "plugin_error" and "subset" in e.data["error"] for e in events)


async def test_a_hanging_plugin_times_out(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    class Hang(Plugin):
        hook_timeout = 5.0

        async def before_compact(self, ctx: BeforeCompact) -> None:
            await trio.sleep_forever()

    events: list[Event] = []
    result = await Compactor(RecordingSummarizer(), plugins=[Hang()], on_event=events.append).force_compact(
        state_in(tmp_path, conversation(30))
    )
    assert isinstance(result, Compacted)
    assert any(e.kind == "plugin_error" and "TooSlow" in e.data["error"] for e in events)
