"""What a journal writer remembers (`_Known`: runs of consecutive record numbers, not one entry
per record) and the end of the file it tracks, checked against plain models."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmdc import Message, OffloadStore
from cmdc.offload import JournalRef, Known, _Known, _record_pieces, new_attempt_id

IDS = [f"m{i}" for i in range(12)]
ATTEMPTS = [None, "k" + "1" * 16, "k" + "2" * 16, "k" + "3" * 16]

_batch = st.tuples(
    st.lists(st.sampled_from(IDS), min_size=0, max_size=6, unique=True),
    st.integers(1, 40),  # first record number
    st.sampled_from(ATTEMPTS),
    st.integers(0, 3),  # compaction
)
_learned = st.tuples(
    st.dictionaries(
        st.sampled_from(IDS),
        st.tuples(st.integers(1, 60), st.integers(0, 2**32 - 1), st.sampled_from(ATTEMPTS), st.integers(0, 3)),
        max_size=8,
    ),
    st.booleans(),  # only_new
)
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), _batch),
        st.tuples(st.just("learn"), _learned),
        st.tuples(st.just("commit"), st.sampled_from(ATTEMPTS[1:])),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(ops=_ops, crc_seed=st.integers(0, 2**31))
def test_known_answers_as_a_plain_dict_would(ops: list[tuple[str, Any]], crc_seed: int) -> None:
    """Batches numbered consecutively (fresh ones) mixed with records learned one by one (any
    numbers, any order, some only when new), remembered again under other numbers, and commits:
    `get`, `items`, `len`, `garbage`, `kept` and `uncommitted` answer as a dict of records."""
    known = _Known()
    model: dict[str, Known] = {}
    attempts: list[str | None] = []  # of every batch remembered, superseded or not
    entries = 0
    committed: set[str] = set()
    for kind, arg in ops:
        if kind == "add":
            ids, first, attempt, compaction = arg
            crcs = [(crc_seed * 7919 + first * 31 + i) % 2**32 for i in range(len(ids))]
            known.add(ids, first, crcs, attempt, compaction)
            for i, mid in enumerate(ids):
                model[mid] = (first + i, crcs[i], attempt, compaction)
            attempts.append(attempt)
            entries += len(ids)
        elif kind == "learn":
            records, only_new = arg
            fresh = {mid: r for mid, r in records.items() if not (only_new and mid in model)}
            known.add_records(records, only_new=only_new)
            model.update(fresh)
            attempts += [r[2] for r in fresh.values()]
            entries += len(fresh)
        else:
            committed.add(arg)
        assert known.uncommitted(committed) == any(a is not None and a not in committed for a in attempts)
    assert len(known) == len(model)
    assert known.garbage == entries - len(model)
    for mid in IDS:
        assert known.get(mid) == model.get(mid)
        assert (mid in known) == (mid in model)
    assert dict(known.items()) == {mid: r[2] for mid, r in model.items()}
    kept = known.kept(lambda a: a is None or a in committed)
    assert {mid: kept.get(mid) for mid in IDS} == {
        mid: model[mid] if mid in model and (model[mid][2] is None or model[mid][2] in committed) else None
        for mid in IDS
    }
    assert kept.garbage == 0


def test_record_pieces_join_to_the_lines_of_one_piece_each() -> None:
    """Pieces a line (the message, then the rest of the line and the next line's head): joined,
    the same bytes as each line built on its own; a message never encoded is encoded."""
    messages = [Message.user(f"hello {i}") for i in range(5)]
    messages[2].json_crc()
    attempt, journal = "k" + "a" * 16, "j" + "b" * 16
    whole = b"".join(_record_pieces(7, 2, 1.5, messages, attempt, journal))
    alone = b"".join(b"".join(_record_pieces(7 + i, 2, 1.5, [m], attempt, journal)) for i, m in enumerate(messages))
    assert whole == alone
    assert whole.count(b"\n") == 5 and whole.endswith(b"}\n")
    assert _record_pieces(1, 0, 1.0, [], attempt, journal) == []


async def test_the_end_a_writer_remembers_is_the_end_of_the_file(tmp_path: Path) -> None:
    """After every kind of append (a new journal's head, fresh records with and without their
    commit, a retry that reuses every record, a batch mixing reused and fresh messages, a commit)
    the size and last line the store keeps for its quick check are the file's."""
    store = OffloadStore(tmp_path)
    path = tmp_path / "a.jsonl"

    def check() -> None:
        data = path.read_bytes()
        journal = store._journal("a")
        assert journal.size == len(data)
        assert journal.last == data[data.rstrip(b"\n").rfind(b"\n") + 1 :]

    first = [Message.user(f"first {i}") for i in range(3)]
    r1 = await store.append("a", first, compaction=1, commit=False)
    check()
    await store.commit("a", r1.pending)
    check()
    ref = JournalRef(r1.journal, r1.last_seq)
    batch = [Message.user(f"second {i}") for i in range(4)]
    attempt = new_attempt_id()
    r2 = await store.append("a", batch, compaction=2, attempt=attempt, expect=ref, commit=False)
    check()
    again = await store.append("a", batch, compaction=2, attempt=new_attempt_id(), expect=ref, commit=False)
    assert again.seqs == r2.seqs and again.written == 0 and again.pending == (attempt,)
    check()
    mixed = [*batch, Message.user("third")]
    r3 = await store.append("a", mixed, compaction=2, attempt=new_attempt_id(), expect=ref)
    assert r3.seqs[:4] == r2.seqs and r3.written == 1 and r3.seqs[4] == r2.last_seq + 1
    check()
    assert await store.read("a") == first + mixed
    # a new process learns the same numbers from the file
    fresh = OffloadStore(tmp_path)
    r4 = await fresh.append("a", mixed, compaction=3, expect=JournalRef(r3.journal, r3.last_seq))
    assert r4.seqs == r3.seqs and r4.written == 0


def test_uncommitted_looks_at_each_committed_run_once() -> None:
    """The check a writer makes on every append does not walk the runs it found committed."""
    known = _Known()
    committed: set[str] = set()
    for n in range(50):
        attempt = f"k{n:016x}"
        known.add([f"m{n}"], n + 1, [n], attempt, 1)
        assert known.uncommitted(committed)
        committed.add(attempt)
        assert not known.uncommitted(committed)
        assert known.settled == n + 1


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@given(
    texts=st.lists(_text, min_size=1, max_size=6),
    first=st.integers(1, 10**12),
    compaction=st.integers(0, 10**6),
    ts=st.floats(0, 2e9, allow_nan=False),
)
@settings(max_examples=60)
def test_record_lines_are_the_lines_the_format_defines(
    texts: list[str], first: int, compaction: int, ts: float
) -> None:
    """Each line, read as the module docstring defines it: plain JSON with the keys in order, the
    record's fields, and a checksum that is the CRC-32 of every byte between the head and the
    suffix."""
    messages = [Message.tool_result(f"c{i}", t) for i, t in enumerate(texts)]
    attempt, journal = "k" + "c" * 16, "j" + "d" * 16
    data = b"".join(_record_pieces(first, compaction, ts, messages, attempt, journal))
    lines = data.split(b"\n")
    assert lines.pop() == b"" and len(lines) == len(messages)
    for k, (line, message) in enumerate(zip(lines, messages, strict=True)):
        obj = orjson.loads(line)
        assert list(obj) == ["message", "compaction", "ts", "seq", "attempt", "journal", "crc"]
        assert Message.from_json(orjson.dumps(obj["message"])) == message
        assert (obj["compaction"], obj["ts"], obj["seq"]) == (compaction, ts, first + k)
        assert (obj["attempt"], obj["journal"]) == (attempt, journal)
        assert line.startswith(b'{"message":') and line.endswith(b',"crc":"%s"}' % obj["crc"].encode())
        body = line[len(b'{"message":') : -len(b',"crc":"xxxxxxxx"}')]
        assert obj["crc"] == f"{zlib.crc32(body):08x}"


def test_a_batch_is_indexed_when_a_lookup_first_needs_it() -> None:
    """Remembering a batch builds no index entry; the first lookup indexes every batch in order
    (a later batch's number for an id wins), and the bound check indexes nothing."""
    known = _Known()
    known.add(["a", "b", "c"], 1, [1, 2, 3], "k" + "1" * 16, 1)
    known.add(["b", "d"], 4, [5, 6], "k" + "2" * 16, 2)
    assert known._index == {} and known.positions == 5
    assert known.get("b") == (4, 5, "k" + "2" * 16, 2)
    assert known.get("a") == (1, 1, "k" + "1" * 16, 1) and "d" in known and "e" not in known
    assert len(known) == 4 and known.garbage == 1 and known._pending == []
    known.add(["e"], 6, [7], None, 3)
    assert known.index["e"] == 5 and known._pending == []


@pytest.mark.parametrize("chunk, join", [(1, 1), (2, 3), (3, 1000)])
async def test_a_batch_past_a_chunk_is_written_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int, join: int
) -> None:
    """Lines built a chunk of records at a time and written a few pieces per call, a message past
    JOIN_MAX among them: the records read back in order, numbered on, and the end of the file
    is the one the writer remembers."""
    import cmdc._fs as fs
    from cmdc.store.file import codec

    monkeypatch.setattr(codec, "_LINES_AT_ONCE", chunk)
    monkeypatch.setattr(codec, "_JOIN", join)
    monkeypatch.setattr(fs, "JOIN_MAX", 64)
    store = OffloadStore(tmp_path)
    batch = [Message.user(f"m{i} " + ("x" * 100 if i == 4 else "")) for i in range(9)]
    result = await store.append("a", batch)
    assert (result.first_seq, result.last_seq, result.seqs) == (1, 9, tuple(range(1, 10)))
    after = Message.user("after")
    assert (await store.append("a", [after])).first_seq == 10
    assert await store.read("a") == [*batch, after]
    assert (await store.verify("a")).clean
    data = (tmp_path / "a.jsonl").read_bytes()
    assert store._journal("a").last == data[data.rstrip(b"\n").rfind(b"\n") + 1 :]


async def test_the_last_line_stays_cached_after_an_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pages an append lets go (`POSIX_FADV_DONTNEED`) never include the last line's, which
    the next append or commit reads, whatever was written: a head and records, one record, a
    commit line alone (a length of 0 would mean the whole rest of the file)."""
    import os

    calls: list[tuple[int, int]] = []
    real = os.posix_fadvise

    def fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        calls.append((offset, length))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    store = OffloadStore(tmp_path)
    path = tmp_path / "a.jsonl"

    def check() -> None:
        data = path.read_bytes()
        last = data[data.rstrip(b"\n").rfind(b"\n") + 1 :]
        assert all(length > 0 and offset + length <= len(data) - len(last) for offset, length in calls), calls
        calls.clear()

    await store.append("a", [Message.user(f"m{i}") for i in range(3)])
    check()
    pending = await store.append("a", [Message.user("one")], commit=False)
    check()
    await store.commit("a", pending.pending)
    check()
