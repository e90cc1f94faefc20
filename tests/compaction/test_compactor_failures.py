"""A failed compaction changes nothing: offload failures, empty or raising summarizers, retries,
the retry predicate, failover, a cancel."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import trio
from fakes import REAL_FSYNC, is_journal_fd, state_in

from cmdc import (
    Compacted,
    CompactionError,
    Compactor,
    Event,
    Message,
    OffloadError,
    OffloadStore,
    State,
    SummarizerError,
)
from cmdc.compaction import SummaryAttempt, default_should_retry
from cmdc.events import COMPACTION_FAILED
from cmdc.store import FileStore
from cmdc.testing import RecordingSummarizer, conversation


@pytest.mark.parametrize("answer", ["", "   \n"])
async def test_empty_summary_fails_and_changes_nothing(tmp_path: Path, answer: str) -> None:
    state = state_in(tmp_path, conversation(30))
    with pytest.raises(CompactionError, match="empty"):
        await Compactor(RecordingSummarizer(answer), retries=1, retry_backoff=0).force_compact(state)
    assert state == state_in(tmp_path, state.messages)


async def test_raising_summarizer_fails_then_a_retry_duplicates_nothing(tmp_path: Path) -> None:
    state = state_in(tmp_path, conversation(30))
    before = state.to_json()

    async def broken(messages: Sequence[Message], instruction: str) -> str:
        raise RuntimeError("model down")

    with pytest.raises(CompactionError, match="model down"):
        await Compactor(broken, retries=0).force_compact(state)
    assert state.to_json() == before
    compactor = Compactor(RecordingSummarizer())
    result = await compactor.force_compact(state)
    assert isinstance(result, Compacted)
    assert all("placeholder" not in m.text for m in result.state.messages)
    offloaded = await OffloadStore(tmp_path / "offload").read("a1")
    assert len(offloaded) == len({m.id for m in offloaded}) == result.report.evicted


async def test_offload_failure_changes_nothing_and_skips_the_summarizer(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    state = State(
        agent_id="a1",
        messages=conversation(30),
        config={"compact_offload_dir": str(blocker / "sub"), "compact_keep": ("messages", 2)},
    )
    summarizer = RecordingSummarizer()
    with pytest.raises(OffloadError):
        await Compactor(summarizer).force_compact(state)
    assert summarizer.calls == []


async def test_disk_full_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = state_in(tmp_path, conversation(30))
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".jsonl"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    summarizer = RecordingSummarizer()
    with pytest.raises(OffloadError, match="No space"):
        await Compactor(summarizer).force_compact(state)
    assert summarizer.calls == []
    monkeypatch.setattr(os, "write", real_write)
    assert await OffloadStore(tmp_path / "offload").read("a1") == []


async def test_retries_then_failover(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    state = state_in(tmp_path, conversation(30))
    tries = 0

    async def flaky(messages: Sequence[Message], instruction: str) -> str:
        nonlocal tries
        tries += 1
        raise ConnectionError("reset")

    backup = RecordingSummarizer("backup summary")
    events: list[Event] = []
    compactor = Compactor(flaky, fallbacks=[backup], retries=2, retry_backoff=1.0, on_event=events.append)
    start = trio.current_time()
    result = await compactor.force_compact(state)
    assert isinstance(result, Compacted)
    assert tries == 3 and result.report.attempts == 4 and result.report.summarizer == "RecordingSummarizer"
    assert trio.current_time() - start >= 1.0 + 2.0  # backoff between the primary's attempts
    roles = [(e.data["role"], e.data["ok"]) for e in events if e.kind == "summarizer_attempt"]
    assert roles == [("primary", False)] * 3 + [("failover", True)]


async def test_every_summarizer_failing_raises(tmp_path: Path) -> None:
    state = state_in(tmp_path, conversation(30))
    compactor = Compactor(
        RecordingSummarizer(""),
        fallbacks=[RecordingSummarizer(""), RecordingSummarizer("")],
        retries=0,
        retry_backoff=0,
    )
    with pytest.raises(CompactionError, match="3 attempts"):
        await compactor.force_compact(state)
    # written ahead, but never committed: readers do not see the failed attempt
    assert await OffloadStore(tmp_path / "offload").read("a1") == []
    assert (await OffloadStore(tmp_path / "offload").verify("a1")).uncommitted > 0


async def test_cancelled_compaction_leaves_the_state_alone(tmp_path: Path) -> None:
    started = trio.Event()

    async def slow(messages: Sequence[Message], instruction: str) -> str:
        started.set()
        await trio.sleep_forever()
        return ""

    state = state_in(tmp_path, conversation(30))
    before = state.to_json()
    with trio.move_on_after(5) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(Compactor(slow).force_compact, state)
            await started.wait()
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught and state.to_json() == before
    # the journal is whole and a later compaction sees every message once
    result = await Compactor(RecordingSummarizer()).force_compact(state)
    assert isinstance(result, Compacted)
    offloaded = await OffloadStore(tmp_path / "offload").read("a1")
    assert len(offloaded) == result.report.evicted


async def test_should_retry_sees_unusable_answers(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    answers = iter(["too short", "## Summary\nthe real one"])

    async def model(messages: Sequence[Message], instruction: str) -> str:
        return next(answers)

    seen: list[SummaryAttempt] = []

    def needs_sections(attempt: SummaryAttempt) -> bool:
        seen.append(attempt)
        return attempt.error is not None or "##" not in (attempt.answer or "")

    state = state_in(tmp_path, conversation(30))
    result = await Compactor(model, should_retry=needs_sections).force_compact(state)
    assert isinstance(result, Compacted)
    summary = next(m for m in result.state.messages if m.is_summary)
    assert "the real one" in summary.text and result.report.attempts == 2
    assert [(a.number, a.answer, a.error) for a in seen] == [
        (1, "too short", None),
        (2, "## Summary\nthe real one", None),
    ]


async def test_failover_callable_gets_the_last_attempt(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    async def primary(messages: Sequence[Message], instruction: str) -> str:
        raise TimeoutError("primary timed out")

    big_model = RecordingSummarizer("summary by the big model")
    calls: list[SummaryAttempt | None] = []

    def failover(last: SummaryAttempt | None) -> tuple[RecordingSummarizer, list[Message]]:
        calls.append(last)
        assert last is not None
        return big_model, list(last.messages)  # the same input, a model with a larger window

    events: list[Event] = []
    state = state_in(tmp_path, conversation(30))
    compactor = Compactor(primary, retries=1, retry_backoff=1.0, failover=failover, on_event=events.append)
    result = await compactor.force_compact(state)
    assert isinstance(result, Compacted)
    assert result.report.summarizer == "RecordingSummarizer" and result.report.attempts == 3
    assert len(calls) == 1 and calls[0] is not None
    assert calls[0].number == 2 and isinstance(calls[0].error, TimeoutError) and calls[0].answer is None
    roles = [(e.data["role"], e.data["ok"]) for e in events if e.kind == "summarizer_attempt"]
    assert roles == [("primary", False), ("primary", False), ("failover", True)]


async def test_when_every_summarizer_fails_nothing_changes(tmp_path: Path) -> None:
    async def broken(messages: Sequence[Message], instruction: str) -> str:
        raise ConnectionError("down")

    state = state_in(tmp_path, conversation(30))
    before = state.to_json()
    compactor = Compactor(broken, fallbacks=[broken], failover=lambda last: None, retries=1, retry_backoff=0)
    with pytest.raises(CompactionError, match="4 attempts"):
        await compactor.force_compact(state)
    assert state.to_json() == before


async def test_a_predicate_can_stop_retrying_an_error(tmp_path: Path) -> None:
    tries = 0

    async def auth_broken(messages: Sequence[Message], instruction: str) -> str:
        nonlocal tries
        tries += 1
        raise PermissionError("bad key")

    def retry_transient(attempt: SummaryAttempt) -> bool:
        if isinstance(attempt.error, PermissionError):
            return False  # never retry an auth error: move on to the fallback
        return default_should_retry(attempt)

    state = state_in(tmp_path, conversation(30))
    compactor = Compactor(
        auth_broken, fallbacks=[RecordingSummarizer("backup")], should_retry=retry_transient, retries=5
    )
    result = await compactor.force_compact(state)
    assert isinstance(result, Compacted) and tries == 1 and result.report.attempts == 2


async def test_a_broken_failover_is_a_summarizer_error(tmp_path: Path) -> None:
    async def down(messages: Sequence[Message], instruction: str) -> str:
        raise ConnectionError("down")

    state = state_in(tmp_path, conversation(30))
    for failover in (lambda last: 1 / 0, lambda last: "not a pair"):
        compactor = Compactor(down, failover=failover, retries=0)
        with pytest.raises(SummarizerError, match="failover callable failed"):
            await compactor.force_compact(state)


# -- the summary is made while the journal's fsync runs ----------------------------------------------


def _journal_fsync(first: Callable[[int], None]) -> Callable[[int], None]:
    """An fsync that runs `first(fd)` in place of the first journal fsync (the evicted records'),
    and is the real one otherwise."""
    done: list[int] = []

    def fsync(fd: int) -> None:
        if is_journal_fd(fd) and not done:
            done.append(fd)
            first(fd)
        else:
            REAL_FSYNC(fd)

    return fsync


@pytest.mark.parametrize("file_store", [False, True])
async def test_the_summary_is_made_while_the_journal_fsyncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, file_store: bool
) -> None:
    """The summarizer starts once the evicted messages are written and numbered, while their
    fsync still runs (this fsync waits for it); the compaction returns after both. So too
    through the file store a runtime gives its compactors."""
    state = state_in(tmp_path, conversation(30))
    store = {"store": FileStore(tmp_path / "offload")} if file_store else {}
    started = threading.Event()
    synced: list[bool] = []

    def fsync(fd: int) -> None:
        assert started.wait(10), "the summarizer did not start during the journal's fsync"
        REAL_FSYNC(fd)
        synced.append(True)

    async def summarizer(messages: Sequence[Message], instruction: str) -> str:
        started.set()
        return "the summary"

    monkeypatch.setattr(os, "fsync", _journal_fsync(fsync))
    result = await Compactor(summarizer, **store).force_compact(state)
    assert isinstance(result, Compacted) and synced == [True]
    offloaded = await OffloadStore(tmp_path / "offload").read("a1")
    kept = {m.id for m in result.state.messages}
    assert len(offloaded) == result.report.evicted and not kept & {m.id for m in offloaded}
    assert {m.id for m in offloaded} | kept >= {m.id for m in state.messages}


async def test_a_journal_fsync_failing_after_the_summary_fails_the_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summary was made during the fsync; the fsync fails: the compaction raises the
    journal's error (itself, not in a group), the state is unchanged, the journal refuses
    later appends (its store's: a store belongs to the compactor that opened it)."""
    state = state_in(tmp_path, conversation(30))
    before = state.to_json()
    started = threading.Event()
    summarizer = RecordingSummarizer()
    events: list[Event] = []

    async def summarize(messages: Sequence[Message], instruction: str) -> str:
        started.set()
        return await summarizer(messages, instruction)

    def fsync(fd: int) -> None:
        assert started.wait(10)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", _journal_fsync(fsync))
    compactor = Compactor(summarize, on_event=events.append)
    with pytest.raises(OffloadError, match="fsync"):
        await compactor.force_compact(state)
    assert len(summarizer.calls) == 1 and state.to_json() == before
    assert [e.kind for e in events].count(COMPACTION_FAILED) == 1
    with pytest.raises(OffloadError, match="later appends are refused"):
        await compactor.force_compact(state)
    assert len(summarizer.calls) == 1  # refused before any summary was asked for


@pytest.mark.parametrize("fsync_fails", [False, True])
async def test_a_summarizer_failing_during_the_fsync_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync_fails: bool
) -> None:
    """A summarizer that fails while the journal's fsync runs: the compaction raises only once
    the fsync is over (nothing left half done), with the summarizer's error, or the journal's
    when that failed too."""
    state = state_in(tmp_path, conversation(30))
    started = threading.Event()
    finished: list[bool] = []

    def fsync(fd: int) -> None:
        assert started.wait(10)
        time.sleep(0.2)
        finished.append(True)
        if fsync_fails:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        REAL_FSYNC(fd)

    async def broken(messages: Sequence[Message], instruction: str) -> str:
        started.set()
        raise RuntimeError("model down")

    monkeypatch.setattr(os, "fsync", _journal_fsync(fsync))
    expected = (OffloadError, "fsync") if fsync_fails else (CompactionError, "model down")
    events: list[Event] = []
    with pytest.raises(expected[0], match=expected[1]):
        await Compactor(broken, retries=0, on_event=events.append).force_compact(state)
    assert finished == [True]
    failures = [e for e in events if e.kind == COMPACTION_FAILED]
    assert len(failures) == 1 and expected[1] in failures[0].data["error"]
    if not fsync_fails:  # the attempt is in the journal, uncommitted: a retry reuses its records
        result = await Compactor(RecordingSummarizer()).force_compact(state)
        assert isinstance(result, Compacted)
        offloaded = await OffloadStore(tmp_path / "offload").read("a1")
        assert len(offloaded) == len({m.id for m in offloaded}) == result.report.evicted


async def test_a_failed_append_cancels_the_summarizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal's fsync fails while the summarizer works: the summarizer is cancelled (its
    summary could not be used), the journal's error is raised at once, one event says so."""
    state = state_in(tmp_path, conversation(30))
    started = threading.Event()
    cancelled: list[bool] = []

    async def slow(messages: Sequence[Message], instruction: str) -> str:
        started.set()
        try:
            await trio.sleep(60)
        except trio.Cancelled:
            cancelled.append(True)
            raise
        return "never"

    def fsync(fd: int) -> None:
        assert started.wait(10)
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", _journal_fsync(fsync))
    events: list[Event] = []
    began = trio.current_time()
    with pytest.raises(OffloadError, match="fsync"):
        await Compactor(slow, on_event=events.append).force_compact(state)
    assert trio.current_time() - began < 30 and cancelled == [True]
    assert [e.kind for e in events].count(COMPACTION_FAILED) == 1


async def test_a_cancel_during_the_summary_comes_out_as_itself(tmp_path: Path) -> None:
    """A compaction cancelled while its summarizer works raises `trio.Cancelled` itself (code
    that catches it still does), after the journal's append is done; the state is unchanged."""
    state = state_in(tmp_path, conversation(30))
    before = state.to_json()
    caught: list[BaseException] = []

    async def slow(messages: Sequence[Message], instruction: str) -> str:
        await trio.sleep(60)
        return "never"

    with trio.move_on_after(0.5) as scope:
        try:
            await Compactor(slow).force_compact(state)
        except trio.Cancelled as exc:
            caught.append(exc)
            raise
    assert scope.cancelled_caught and len(caught) == 1 and state.to_json() == before
    assert len(await OffloadStore(tmp_path / "offload").records("a1")) == 0  # written, never committed
    assert (await OffloadStore(tmp_path / "offload").verify("a1")).uncommitted > 0
