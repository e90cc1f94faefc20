"""Issue 32: the work of a large compaction that needs the records' numbers but not their fsync
(the ledger, what the summarizer reads) starts beside the append, with the numbers the state
predicts; they are checked once the append has numbered the records, and the work is done again
with the real ones when they differ. A failure or a cancel between that work and the fsync
loses nothing and leaves nothing half done: the batch stays an uncommitted attempt, a later
compaction commits each message once."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

import cmdc.compaction.compactor as compactor_mod
from cmdc import Compacted, Compactor, Message, OffloadError, OffloadStore, State
from cmdc.compaction.ledger import LEDGER_KEY, Ledger
from cmdc.store.records import AppendResult
from cmdc.testing import conversation
from tests._support.fakes import REAL_FSYNC, is_journal_fd, state_in

N = 600  # past `_LEDGER_INLINE` evicted messages: the early path


async def instant(messages: Sequence[Message], instruction: str) -> str:
    return "the summary"


def ledger_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(first_seq, last_seq) of every ledger made, with the numbers it was made with."""
    calls: list[tuple[int, int]] = []
    real = compactor_mod._ledger

    def spy(state: State, split: Any, written: AppendResult, budget: int, **kw: Any) -> Ledger:
        calls.append((written.first_seq, written.last_seq))
        return real(state, split, written, budget, **kw)

    monkeypatch.setattr(compactor_mod, "_ledger", spy)
    return calls


def ledger_records(state: State) -> set[int]:
    """The journal records the summary's ledger names (its entries' and its demoted ranges')."""
    summary = next(m for m in state.messages if m.is_summary)
    ledger = Ledger.from_metadata(summary.metadata[LEDGER_KEY])
    named = {e.seq for e in ledger.entries if e.seq > 0}
    for ranges in ledger.demoted.values():
        for low, high in ranges:
            named |= {low, high}
    return named


async def test_a_predicted_numbering_is_used_once_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh journal: the records are numbered as predicted (1, 2, ...), the ledger made
    beside the append is the one used, made once."""
    calls = ledger_calls(monkeypatch)
    state = state_in(tmp_path, conversation(N, seed=3))
    result = await Compactor(instant).force_compact(state)
    assert isinstance(result, Compacted)
    report = result.report
    assert calls == [(1, report.evicted)] and (report.first_seq, report.last_seq) == (1, report.evicted)
    named = ledger_records(result.state)
    assert named and all(report.first_seq <= s <= report.last_seq for s in named)


async def test_a_journal_written_behind_the_state_is_numbered_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal holds records the state never saw (another writer, an older checkpoint): the
    prediction is wrong, the ledger and the summarizer's input are made again with the real
    numbers, and the summary names only records of this batch."""
    pre = await OffloadStore(tmp_path / "offload").append("a1", conversation(50, seed=9), compaction=0)
    held = pre.last_seq  # records the state never saw
    calls = ledger_calls(monkeypatch)
    read: list[str] = []

    async def summarizer(messages: Sequence[Message], instruction: str) -> str:
        read.extend(m.text for m in messages)
        return "the summary"

    # past `_REDUCE_INLINE_TOKENS` evicted: the summarizer's input is made beside the append too;
    # tool results past 50 tokens are clipped for it, with a pointer naming the batch's records
    state = state_in(tmp_path, conversation(3_000, seed=4))
    result = await Compactor(summarizer, reduce_tokens=50).force_compact(state)
    assert isinstance(result, Compacted)
    report = result.report
    assert held > 0 and report.first_seq == held + 1 and report.last_seq == held + report.evicted
    assert calls == [(1, report.evicted), (held + 1, held + report.evicted)]  # predicted, then the real ones
    named = ledger_records(result.state)
    assert named and all(held < s <= report.last_seq for s in named)
    pointers = [t for t in read if "the full text is in the journal" in t]
    assert pointers and all(f"records {report.first_seq}-{report.last_seq}" in t for t in pointers)


@pytest.mark.parametrize("failure", ["fsync", "ledger"])
async def test_a_failure_beside_the_fsync_loses_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    """The ledger is made beside the append; then the fsync fails (or the ledger raises while the
    append goes on): the compaction raises, the state is unchanged, nothing of the batch is
    visible. A later compaction (a new store: the failed fsync's refuses appends) commits every
    evicted message exactly once."""
    state = state_in(tmp_path, conversation(N, seed=5))
    before = state.to_json()
    made = threading.Event()
    real = compactor_mod._ledger

    def ledger(state: State, split: Any, written: AppendResult, budget: int, **kw: Any) -> Ledger:
        made.set()
        if failure == "ledger":
            raise RuntimeError("ledger bug")
        return real(state, split, written, budget, **kw)

    def fsync(fd: int) -> None:
        if is_journal_fd(fd) and failure == "fsync":
            assert made.wait(10), "the ledger was not made beside the append"
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        REAL_FSYNC(fd)

    monkeypatch.setattr(compactor_mod, "_ledger", ledger)
    monkeypatch.setattr(os, "fsync", fsync)
    expected = (OffloadError, "fsync") if failure == "fsync" else (RuntimeError, "ledger bug")
    with pytest.raises(expected[0], match=expected[1]):
        await Compactor(instant).force_compact(state)
    monkeypatch.undo()
    assert state.to_json() == before
    store = OffloadStore(tmp_path / "offload")
    assert await store.read("a1") == []  # written (or not), never committed
    result = await Compactor(instant).force_compact(state)
    assert isinstance(result, Compacted)
    offloaded = await OffloadStore(tmp_path / "offload").read("a1")
    assert len(offloaded) == len({m.id for m in offloaded}) == result.report.evicted
    assert (await OffloadStore(tmp_path / "offload").verify("a1")).clean


async def test_a_cancel_while_the_ledger_is_made_waits_for_the_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while the ledger is made beside the append: `trio.Cancelled` comes out once the
    append's write and fsync and the ledger's thread are done (nothing half done, nothing left
    running), the state is unchanged, the batch is an uncommitted attempt; the next compaction
    reuses its records and commits each message once."""
    state = state_in(tmp_path, conversation(N, seed=6))
    before = state.to_json()
    release = threading.Event()
    making = threading.Event()
    synced: list[bool] = []
    real = compactor_mod._ledger

    done: list[bool] = []

    def slow_ledger(state: State, split: Any, written: AppendResult, budget: int, **kw: Any) -> Ledger:
        making.set()
        release.wait(10)
        try:
            return real(state, split, written, budget, **kw)
        finally:
            done.append(True)

    def fsync(fd: int) -> None:
        REAL_FSYNC(fd)
        if is_journal_fd(fd):
            synced.append(True)

    monkeypatch.setattr(compactor_mod, "_ledger", slow_ledger)
    monkeypatch.setattr(os, "fsync", fsync)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:

            async def cancel_soon() -> None:
                await trio.to_thread.run_sync(making.wait, 10)
                scope.cancel()
                release.set()

            nursery.start_soon(cancel_soon)
            await Compactor(instant).force_compact(state)
    monkeypatch.undo()
    assert scope.cancelled_caught and synced == [True] and state.to_json() == before
    assert done == [True]  # the ledger's thread was waited for too: nothing left running
    store = OffloadStore(tmp_path / "offload")
    assert await store.read("a1") == [] and (await store.verify("a1")).uncommitted > 0
    result = await Compactor(instant).force_compact(state)
    assert isinstance(result, Compacted)
    offloaded = await store.read("a1")
    assert len(offloaded) == len({m.id for m in offloaded}) == result.report.evicted
