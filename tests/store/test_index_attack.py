"""The file store's index attacked: what it answers compared with a whole read of the journal
(its source of truth) on random journals, damaged ones too; journals whose lines were damaged
in place after they were indexed; kills between its two files' commits."""

from __future__ import annotations

import os
import random
import sqlite3
import stat
import unicodedata
from pathlib import Path

import pytest

from cmdc import Message, OffloadStore, ToolCall, _index
from cmdc.errors import OffloadCorrupted
from cmdc.events import JOURNAL_INDEX_REBUILT, Event
from cmdc.message import KIND_KEY, SUMMARY_KIND
from cmdc.offload import ATTEMPTS_KEY, new_attempt_id


def summary(text: str, names: list[str]) -> Message:
    return Message.user(text, metadata={KIND_KEY: SUMMARY_KIND, ATTEMPTS_KEY: names})


async def same_as_a_scan(scanner: OffloadStore, reader: OffloadStore, words: tuple[str, ...] = ()) -> None:
    """What `reader` answers through its index is what `scanner` (no index) reads."""
    scanned = await scanner.records("a")
    report = await scanner.verify("a")
    want = [(r.seq, r.message.id) for r in scanned]
    assert [(r.seq, r.message.id) for r in await reader.read_range("a", -1, 2**62)] == want
    for n in (1, 3, 50):
        assert [(r.seq, r.message.id) for r in await reader.last_records("a", n)] == want[max(0, len(want) - n) :]
    ext = await reader.extent("a")
    ends = (want[0][0], want[-1][0]) if want else (0, 0)
    assert (ext.records, ext.first_seq, ext.last_seq, ext.compactions) == (len(want), *ends, report.compactions)
    for word in words:
        held = {r.seq for r in scanned if word in r.message.text.split()}
        assert {r.seq for r in await reader.search("a", word, 10_000)} == held, word
        assert {r.seq for r in await scanner.search("a", word, 10_000)} == held, word


async def test_a_summary_written_into_a_batch_a_summary_committed_commits_what_it_names(tmp_path: Path) -> None:
    """A batch committed by a summary naming it, then written into again (a compaction appended
    to it) with a summary naming a third batch: that batch is committed too, wherever in the
    journal the summary committing the second one is. The journal's read said no (it looked
    at each summary once, from the end: the one naming the third batch came after the one
    committing its own) while the index said yes."""
    store = OffloadStore(tmp_path, index=False)
    await store.append("a", [Message.user("plain one")], compaction=1)
    second = await store.append("a", [Message.user("second batch")], attempt=new_attempt_id(), commit=False)
    await store.append("a", [summary("commits the second", list(second.pending))], compaction=2)
    third = await store.append("a", [Message.user("third batch zeta")], attempt=new_attempt_id(), commit=False)
    into = second.pending[0]  # written into the second batch, committed already
    await store.append("a", [summary("names the third", list(third.pending))], attempt=into, commit=False)
    texts = [r.message.text for r in await store.records("a")]
    assert "third batch zeta" in texts and "names the third" in texts
    await same_as_a_scan(store, OffloadStore(tmp_path), ("zeta", "third", "batch"))


async def test_check_index_does_not_call_a_journal_with_a_damaged_line_rebuilt(tmp_path: Path) -> None:
    """An index of a journal holding a damaged line is right: `check_index` says so, and not
    that it rebuilt it (the damaged line's event was counted as a rebuild)."""
    store = OffloadStore(tmp_path)
    await store.append("a", [Message.user(f"line {i}") for i in range(5)], compaction=1)
    journal = store.path_for("a")
    journal.write_bytes(journal.read_bytes().replace(b"line 2", b"LINE 2"))
    events: list[Event] = []
    reader = OffloadStore(tmp_path, on_event=events.append)
    report = await reader.check_index("a")
    assert report.ok and not report.rebuilt and report.records == 4, report
    assert not [e for e in events if e.kind == JOURNAL_INDEX_REBUILT]


async def test_a_hidden_record_damaged_in_place_after_it_was_indexed_is_found_by_check_index(tmp_path: Path) -> None:
    """A record of a batch not committed yet, indexed, then damaged in place (its bytes far from
    the index's mark, which checks only the bytes just before it): once the batch commits the
    index would show a record the journal no longer holds. `check_index` (and `history
    --verify`) compared only the visible records, equal while the batch was hidden, and said
    "ok": it now compares every record line too, and rebuilds."""
    store = OffloadStore(tmp_path)
    await store.append("a", [Message.user(f"shown {i}") for i in range(3)], compaction=1)
    hidden = await store.append(
        "a", [Message.user(f"hidden {i}") for i in range(3)], attempt=new_attempt_id(), commit=False
    )
    await store.append("a", [Message.user(f"after {i}") for i in range(6)], compaction=2)
    assert (await store.extent("a")).records == 9  # indexed, the hidden batch in it
    journal = store.path_for("a")
    data = journal.read_bytes()
    assert data.count(b"hidden 1") == 1
    _write_at(journal, data.index(b"hidden 1"), b"HIDDEN 1")  # in place: the same file, the same size
    report = await store.check_index("a")  # (it compared the shown records alone: equal, "ok")
    assert not report.ok and report.rebuilt and report.records == 9, report
    assert "of 12 record lines, the journal 9 from 2 of 11" in report.problems[0], report
    await store.commit("a", hidden.pending)
    scanner = OffloadStore(tmp_path, index=False)
    await same_as_a_scan(scanner, store, ("hidden", "shown", "1"))


def _damage(path: Path, rnd: random.Random) -> None:
    """A flipped bit somewhere in the journal, a newline's bit (two lines fused) or a torn end."""
    if not path.exists():
        return
    data = bytearray(path.read_bytes())
    newlines = [i for i, b in enumerate(data) if b == 10]
    if len(newlines) < 3:
        return
    what = rnd.choice(["byte", "newline", "tear"])
    if what == "byte":
        i = rnd.randrange(len(data))
        data[i] ^= 1 << rnd.randrange(7) if data[i] != 10 else 0
    elif what == "newline":
        data[rnd.choice(newlines[:-1])] ^= 1 << rnd.randrange(8)
    else:
        del data[len(data) - rnd.randrange(1, 40) :]
    _write_at(path, 0, bytes(data))
    os.truncate(path, len(data))


def _write_at(path: Path, offset: int, data: bytes) -> None:
    """`data` written over the file's bytes at `offset` (the file kept: its inode, its size)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


@pytest.mark.parametrize("seed", range(6))
async def test_random_journals_read_alike_through_the_index_and_a_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Random journals (batches committed or not, late commits, summaries naming batches and
    written into committed ones, messages written again, damaged bits, fused lines, torn ends):
    after each step, the index a reader keeps up to date answers what a whole read does; after
    damage to bytes it had indexed, `check_index` finds it and rebuilds; at the end, an index
    built anew in small chunks does too."""
    rnd = random.Random(seed)
    words = ("alpha", "beta", "src/a/b.py", "w3", "w7")
    writer = OffloadStore(tmp_path, index=False)
    scanner = OffloadStore(tmp_path, index=False)
    reader = OffloadStore(tmp_path)
    pending: list[str] = []
    committed: list[str] = []
    sent: list[Message] = []
    number = 0

    def fresh(n: int) -> list[Message]:
        made = [
            Message.user(
                f"m{len(sent) + k} w{(len(sent) + k) % 10} " + " ".join(rnd.sample(words[:3], rnd.randrange(3)))
            )
            for k in range(n)
        ]
        sent.extend(made)
        return made

    for step in range(30):
        r = rnd.random()
        if r < 0.2:
            number += rnd.choice([0, 1])
            again = rnd.sample(sent, min(len(sent), rnd.randrange(3)))
            got = await writer.append(
                "a", fresh(rnd.randrange(1, 5)) + again, attempt=new_attempt_id(), commit=False, compaction=number
            )
            pending += got.pending
        elif r < 0.3 and pending:
            some = rnd.sample(pending, rnd.randrange(1, len(pending) + 1))
            await writer.commit("a", some)
            committed += some
            pending = [p for p in pending if p not in some]
        elif r < 0.45 and pending + committed:
            names = rnd.sample(pending + committed, min(len(pending + committed), rnd.randrange(1, 3)))
            message = summary(f"summary {step} alpha", names)
            if committed and rnd.random() < 0.5:  # into a batch committed already
                await writer.append("a", [message], attempt=rnd.choice(committed), commit=False, compaction=number)
            else:
                await writer.append("a", [message], compaction=number)
            pending = [p for p in pending if p not in names]
            committed += [a for a in names if a not in committed]
        elif r < 0.55 and committed:
            await writer.append(
                "a", fresh(2), attempt=rnd.choice(committed), commit=rnd.random() < 0.5, compaction=number
            )
        elif r < 0.62:
            _damage(writer.path_for("a"), rnd)
            writer = OffloadStore(tmp_path, index=False)  # (a writer learns the file again)
            await reader.check_index("a")  # damage before the index's mark: found by a check
        else:
            number += rnd.choice([0, 1, 1])
            await writer.append("a", fresh(rnd.randrange(1, 6)), compaction=number)
        await same_as_a_scan(scanner, reader, words)
        report = await reader.check_index("a")
        assert report.ok and not report.rebuilt, (step, report)
    _index.remove(writer.path_for("a"))
    monkeypatch.setattr(_index, "_CHUNK", 600)
    await same_as_a_scan(scanner, OffloadStore(tmp_path), words)
    assert _index.index_path(writer.path_for("a")).stat().st_size > 0


@pytest.mark.parametrize("which", ["index", "words"])
async def test_an_index_file_open_to_other_users_is_made_again_0600(tmp_path: Path, which: str) -> None:
    """An index file another user may read (its words are the journal's) or write (it says
    which records are shown), as a restored backup or a `chmod` leaves it, is never used: it is
    removed and built again 0600, with an event; what it answers is the journal's."""
    store = OffloadStore(tmp_path)
    await store.append("a", [Message.user(f"secret {i}") for i in range(5)], compaction=1)
    await store.append("a", [Message.user("never shown")], attempt=new_attempt_id(), commit=False)
    assert (await store.extent("a")).records == 5
    journal = store.path_for("a")
    path = _index.index_path(journal) if which == "index" else _index.words_path(journal)
    await store.aclose()
    if which == "index":  # written by another user: the uncommitted record shown
        _show_all(_index.index_path(journal))
    path.chmod(0o666)
    events: list[Event] = []
    reader = OffloadStore(tmp_path, on_event=events.append)
    assert [r.message.text for r in await reader.search("a", "never shown")] == []
    reasons = [e.data["reason"] for e in events if e.kind == JOURNAL_INDEX_REBUILT]
    assert len(reasons) == 1 and "open to other users (mode 666" in reasons[0], reasons
    for name in (_index.index_path(journal), _index.words_path(journal)):
        assert stat.S_IMODE(name.stat().st_mode) == 0o600, name
    await same_as_a_scan(OffloadStore(tmp_path, index=False), reader, ("secret", "shown"))


def _show_all(index: Path) -> None:
    conn = sqlite3.connect(index)
    try:
        conn.execute("UPDATE recs SET vis = 1")
        conn.commit()
    finally:
        conn.close()


async def test_a_word_beside_a_symbol_or_a_combining_accent_is_found(tmp_path: Path) -> None:
    """FTS5's tokenizer (Unicode 6.1) keeps in a word what a query's words (Python's `\\w`)
    leave out: a combining accent (a decomposed `café`, the dot `İ` folds to), a character
    newer than Unicode 6.1 (most emoji: `🥳`, `🤖`), a private-use one. `build🥳passed` was one
    word of the index, so `passed` found nothing there while a scan found it. Both read the
    text's words alike now, on the build's fast path (plain text) and on its other one (a tool
    call)."""
    texts = ["build🥳passed", "it is 10°c outside", unicodedata.normalize("NFD", "the café menu"), "İstanbul trip"]
    texts += ["shipped🤖today", "a\ue000b joined"]
    store = OffloadStore(tmp_path, index=False)
    await store.append("a", [Message.user(t) for t in texts], compaction=1)
    call = Message.assistant("", tool_calls=[ToolCall("c1", "run", {"cmd": "deploy✓ok"})])
    await store.append("a", [call, Message.tool_result("c1", "fine")], compaction=2)
    reader = OffloadStore(tmp_path)
    for query, seq in [
        ("passed", 1),
        ("10", 2),
        ("cafe", 3),
        ("stanbul", 4),
        ("shipped", 5),
        ("today", 5),
        ("b", 6),
        ("ok", 7),
    ]:
        assert [r.seq for r in await reader.search("a", query)] == [seq], query
        assert [r.seq for r in await store.search("a", query)] == [seq], query
    assert (await reader.check_index("a")).ok


def _numbered_line(seq: int, attempt: str, journal: str) -> bytes:
    """A hand-made message line numbered `seq`, its checksum right."""
    import zlib

    body = b'{"id":"mhostile","role":"user","content":"hostile zebra"},"compaction":1,"ts":1.5,'
    body += b'"seq":%d,"attempt":"%s","journal":"%s"' % (seq, attempt.encode(), journal.encode())
    return b'{"message":' + body + b',"crc":"%08x"}\n' % zlib.crc32(body)


async def test_a_line_numbered_past_sqlites_integers_is_damaged_to_every_reader(tmp_path: Path) -> None:
    """A hand-made line numbered 2**63 (a valid checksum; a whole read took it) could not go into
    the index: every read built the index, failed, removed it, built it again, failed, and read
    the whole journal, with a rebuild event each time. A line numbered past 2**62 (the highest
    number `read_range` takes) is damaged now, to a whole read as to the index; the index is
    used; and a writer never numbers a record past it (after a line numbered so, an append is
    refused)."""
    store = OffloadStore(tmp_path, index=False)
    first = await store.append("a", [Message.user(f"rec {i}") for i in range(200)], compaction=1)
    assert first.attempt is not None and first.journal is not None
    path = store.path_for("a")
    lines = path.read_bytes().splitlines(keepends=True)
    lines.insert(100, _numbered_line(2**63, first.attempt, first.journal))  # (at the end, a writer moves it aside)
    lines.insert(150, _numbered_line(2**62 + 1, first.attempt, first.journal))  # (past read_range's numbers)
    path.write_bytes(b"".join(lines))
    await store.append("a", [Message.user("after zebra")], compaction=2)
    assert (await store.verify("a")).records == 201 and len((await store.verify("a")).damaged) == 2
    events: list[Event] = []
    reader = OffloadStore(tmp_path, on_event=events.append)
    for _ in range(2):  # the first builds the index; the second reads 2 records through it
        _index.READS["records"] = 0
        assert [r.message.text for r in await reader.last_records("a", 2)] == ["rec 199", "after zebra"]
    assert _index.READS["records"] == 2
    assert not [e for e in events if e.kind == JOURNAL_INDEX_REBUILT]
    await same_as_a_scan(store, reader, ("zebra",))
    path.write_bytes(path.read_bytes() + _numbered_line(2**62, first.attempt, first.journal))
    assert [r.seq for r in await reader.search("a", "hostile")] == [2**62]  # the last valid number
    with pytest.raises(OffloadCorrupted, match="past 4611686018427387904"):
        await OffloadStore(tmp_path, index=False).append("a", [Message.user("one more")], compaction=3)
    await same_as_a_scan(store, reader, ("zebra",))


@pytest.mark.parametrize("index", [True, False])
async def test_last_records_and_search_take_any_count(tmp_path: Path, index: bool) -> None:
    """More records asked for than the journal holds are all of them, through the index or a
    whole read (which gave the last `len - n` counted from the end: 2 of 5 for n = 7), and a
    count past SQLite's integers is no `OverflowError` (`cmdc history --limit 99999999999999999999`)."""
    store = OffloadStore(tmp_path, index=index)
    await store.append("a", [Message.user(f"rec {i} word") for i in range(5)], compaction=1)
    for n in (5, 6, 7, 9, 2**63, 2**70):
        assert [r.seq for r in await store.last_records("a", n)] == [1, 2, 3, 4, 5], n
        assert sorted(r.seq for r in await store.search("a", "word", n)) == [1, 2, 3, 4, 5], n
    assert [r.seq for r in await store.last_records("a", 2)] == [4, 5]


@pytest.mark.parametrize("removed", ["index", "words"])
async def test_one_file_of_the_index_removed_is_one_event_to_a_new_process(tmp_path: Path, removed: str) -> None:
    """Either file of the index removed while no process had it open: the next process rebuilds
    both with one event. The records' file removed left the old words, another index's now,
    dropped without a word (the words' file removed was told)."""
    store = OffloadStore(tmp_path)
    await store.append("a", [Message.user(f"rec {i} word") for i in range(50)], compaction=1)
    assert (await store.extent("a")).records == 50
    await store.aclose()
    journal = store.path_for("a")
    (_index.index_path(journal) if removed == "index" else _index.words_path(journal)).unlink()
    events: list[Event] = []
    reader = OffloadStore(tmp_path, on_event=events.append)
    assert len(await reader.search("a", "word", 100)) == 50
    assert len([e for e in events if e.kind == JOURNAL_INDEX_REBUILT]) == 1, events
    await same_as_a_scan(OffloadStore(tmp_path, index=False), reader, ("word", "rec"))
