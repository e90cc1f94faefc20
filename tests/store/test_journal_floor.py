"""Issue 32 (compaction at the disk floor): a journal written by the code before this work is
read and appended to; an append's numbering hint comes once its fsync has started; an uncommitted
batch does not wake the search index, its commit does; the ledger's summary scan finds what a
message-by-message scan finds."""

from __future__ import annotations

import os
import random
import shutil
import stat
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from cmdc import Message, OffloadStore
from cmdc.compaction.ledger import summary_positions
from cmdc.offload import JournalRef
from cmdc.store.file import journal as journal_mod
from cmdc.store.records import AppendResult

DATA = Path(__file__).parents[1] / "data" / "journal_floor_format.jsonl"
JOURNAL = "jcbb67d13e937bf36"
FIRST, SECOND = "k99d324feb002e2f3", "k1a2d99fbd053476b"  # the two compactions' attempts


async def test_a_journal_written_before_the_floor_work_is_read_and_appended_to(tmp_path: Path) -> None:
    """Written by the code at e773e40 through a Compactor (two compactions of 135 and 141
    records, their lines built from the template, each commit as two lines; the second batch
    holds the first summary, which names the first attempt), then an attempt of 130 records
    never committed. It verifies clean and reads every committed record once, in order; a retry
    of the uncommitted attempt reuses its records and commits it; the old bytes stay."""
    original = DATA.read_bytes()
    shutil.copy(DATA, tmp_path / "floor.jsonl")
    store = OffloadStore(tmp_path)
    report = await store.verify("floor")
    assert report.clean and report.journal == JOURNAL
    assert (report.records, report.compactions, report.uncommitted, report.duplicates) == (276, 2, 130, 0)
    records = await store.records("floor")
    assert [r.seq for r in records] == list(range(1, 277))
    assert len({r.message.id for r in records}) == 276
    assert {r.attempt for r in records} == {FIRST, SECOND}
    summaries = [r for r in records if r.message.is_summary]
    assert [r.attempt for r in summaries] == [SECOND]  # the first compaction's summary, evicted by the second
    assert summaries[0].message.metadata["cmdc.attempts"] == (FIRST,)
    assert records[-1].message.content == "later 135"  # the newest four were kept

    lines = original.splitlines()
    pending = [orjson.loads(line) for line in lines[-130:]]
    assert {p["attempt"] for p in pending} == {pending[0]["attempt"]} and pending[0]["seq"] == 277
    retried = [Message.from_dict(p["message"]) for p in pending]
    fresh = [Message.user(f"after {i}") for i in range(3)]
    result = await OffloadStore(tmp_path).append(
        "floor", [*retried, *fresh], compaction=3, expect=JournalRef(JOURNAL, 276)
    )
    assert result.seqs == tuple(range(277, 410)) and result.written == 3 and result.journal == JOURNAL
    data = (tmp_path / "floor.jsonl").read_bytes()
    assert data.startswith(original)
    assert f'"commit":["{result.attempt}","{pending[0]["attempt"]}"]'.encode() in data
    report = await OffloadStore(tmp_path).verify("floor")
    assert report.clean and (report.records, report.uncommitted, report.duplicates) == (409, 0, 0)
    messages = await OffloadStore(tmp_path).read("floor")
    assert [m.content for m in messages[276:]] == [
        *(f"never committed {i}" for i in range(130)),
        "after 0",
        "after 1",
        "after 2",
    ]


async def test_the_numbering_hint_comes_once_the_fsync_has_started(tmp_path: Path, monkeypatch: Any) -> None:
    """`on_numbered` is sent after every byte is written, by a thread of its own that first
    runs when the writer blocks in the fsync: the fsync is not held up by the work the hint
    wakes (the writer used to send it itself, and then wait for the GIL while that work ran).
    The hint reaches trio's thread while the fsync still runs (this fsync waits for it); the
    batch is durable when `append` returns."""
    order: list[str] = []
    told = threading.Event()
    real_fsync = os.fsync

    def fsync(fd: int) -> None:  # (a new file's directory is fsync'd beside it, by a thread of its own)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            order.append("dir fsync")
            real_fsync(fd)
            return
        order.append("fsync starts")
        if not told.is_set():
            assert told.wait(10), "the hint did not come during the fsync"
        real_fsync(fd)
        order.append("fsync ends")

    def seen(result: AppendResult) -> None:
        order.append("told")
        results.append(result)
        told.set()

    monkeypatch.setattr(journal_mod.os, "fsync", fsync)
    results: list[AppendResult] = []
    store = OffloadStore(tmp_path, index=False)
    result = await store.append("a1", [Message.user(f"m{i}") for i in range(300)], on_numbered=seen)
    assert "dir fsync" in order  # the new file's directory, at any time before append returned
    # Told while the fsync runs; or, when a loaded machine runs the telling thread before the
    # writer reaches its fsync, just before it: never held until the fsync has ended.
    assert [step for step in order if step != "dir fsync"] in (
        ["fsync starts", "told", "fsync ends"],
        ["told", "fsync starts", "fsync ends"],
    )
    assert results == [result] and (result.first_seq, result.last_seq) == (1, 300)
    order.clear()
    told.set()
    await store.append("a1", [Message.user("no hint")])
    assert order == ["fsync starts", "fsync ends"]  # no hint asked for: nothing sent
    assert [m.content for m in await store.read("a1")][-1] == "no hint"


async def test_an_uncommitted_batch_does_not_wake_the_index_its_commit_does(tmp_path: Path, monkeypatch: Any) -> None:
    store = OffloadStore(tmp_path)
    poked: list[Path] = []
    monkeypatch.setattr(store._indexer, "poke", poked.append)
    result = await store.append("a1", [Message.user("pending")], commit=False)
    assert poked == []
    assert await store.commit("a1", result.pending)
    assert poked == [store.path_for("a1")]
    await store.append("a1", [Message.user("committed as written")])
    assert poked == [store.path_for("a1")] * 2
    assert [m.content for m in await store.read("a1")] == ["pending", "committed as written"]
    found = await store.search("a1", "pending")
    assert [r.message.content for r in found] == ["pending"]


@pytest.mark.parametrize("seed", range(20))
def test_the_summary_scan_finds_what_a_message_by_message_scan_finds(seed: int) -> None:
    rng = random.Random(seed)
    messages: list[Message] = []
    for i in range(rng.randrange(0, 300)):
        kind = rng.random()
        if kind < 0.05:
            messages.append(Message.user(f"summary {i}", metadata={"cmdc.kind": "summary"}))
        elif kind < 0.15:
            messages.append(Message.user(f"tagged {i}", metadata={"cmdc.kind": "other", "n": i}))
        elif kind < 0.2:
            messages.append(Message.assistant(f"call {i}", tool_calls=()))
        else:
            messages.append(Message.user(f"plain {i}"))
    assert summary_positions(messages) == [i for i, m in enumerate(messages) if m.is_summary]


@pytest.mark.parametrize("n", [5, 300])  # the few-records builder and the template
async def test_the_writer_leaves_messages_as_they_came(tmp_path: Path, n: int) -> None:
    """A message the writer encodes is not given a cached encoding (a batch's JSON is let go
    once written); one that had it keeps it; the lines read back are the messages."""
    messages = [Message.user(f"message {i} ünï") for i in range(n)]
    for m in messages[::2]:
        m.json_crc()
    before = [m._json for m in messages]
    store = OffloadStore(tmp_path, index=False)
    await store.append("a1", messages)
    assert [m._json for m in messages] == before
    assert [m._json_crc is None for m in messages] == [b is None for b in before]
    assert await store.read("a1") == messages
    again = await store.append("a1", messages)  # the same messages: their records are reused
    assert again.written == 0 and again.seqs == tuple(range(1, n + 1))
