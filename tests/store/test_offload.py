"""The offload journal (cmdc.offload): appends and reads, hostile ids, retried batches written
once, search and ranges, concurrency and cancellation, O(1) recovery, a stalled disk, huge
records read in short steps."""

from __future__ import annotations

import os
import stat
import time
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import cmdc.offload as offload
from cmdc._fs import JOIN_MAX
from cmdc.errors import ConfigError, OffloadError
from cmdc.message import Message, ToolCall
from cmdc.offload import AppendResult, OffloadStore
from tests._support.fakes import REAL_FSYNC, REAL_PREAD, check_clean, is_journal_fd, line, users, varied


def listing(path: Path) -> list[str]:
    return os.listdir(path)


def append_bytes(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


# -- basics ------------------------------------------------------------------------------------


async def test_round_trip(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path / "off")
    msgs = varied()
    result = await store.append("a1", msgs, compaction=2)
    path = tmp_path / "off" / "a1.jsonl"
    assert (result.path, result.first_seq, result.last_seq, result.written) == (path, 1, len(msgs), len(msgs))
    assert isinstance(result, AppendResult) and result.journal and result.attempt and result.pending == ()
    assert store.path_for("a1") == path
    back = await store.read("a1")
    assert back == msgs
    assert [m.id for m in back] == [m.id for m in msgs]
    records = await store.records("a1")
    assert [r.seq for r in records] == list(range(1, len(msgs) + 1))
    assert all(r.compaction == 2 for r in records)
    assert all(abs(r.timestamp - time.time()) < 60 for r in records)
    objs = check_clean(path)
    assert [Message.from_dict(o["message"]) for o in objs] == msgs
    # a fresh store reads the same
    assert await OffloadStore(tmp_path / "off").read("a1") == msgs


async def test_seq_across_appends_and_new_store(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    assert (await store.append("a", users(3))).last_seq == 3
    r = await store.append("a", users(2, "more"), compaction=1)
    assert (r.first_seq, r.last_seq, r.written) == (4, 5, 2)
    # a new store (a new process) recovers the seq from the tail
    store2 = OffloadStore(tmp_path)
    r = await store2.append("a", users(1, "again"), compaction=2)
    assert (r.first_seq, r.last_seq) == (6, 6)
    # interleaved writers on the same file keep seqs increasing
    r = await store.append("a", users(1, "back"))
    assert (r.first_seq, r.last_seq) == (7, 7)
    r = await store2.append("a", users(1, "and forth"))
    assert (r.first_seq, r.last_seq) == (8, 8)
    assert [r.seq for r in await store.records("a")] == list(range(1, 9))
    # journals are per agent
    assert (await store.append("b", users(1))).first_seq == 1
    check_clean(tmp_path / "a.jsonl")


async def test_empty_append_touches_nothing(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path / "off")
    r = await store.append("a", [])
    assert (r.first_seq, r.last_seq, r.written) == (1, 0, 0)
    assert not (tmp_path / "off").exists()
    await store.append("a", users(2))
    r = await OffloadStore(tmp_path / "off").append("a", [])
    assert (r.first_seq, r.last_seq, r.written) == (3, 2, 0)


async def test_permissions(tmp_path: Path) -> None:
    old = os.umask(0o277)
    try:
        store = OffloadStore(tmp_path / "x" / "y")
        await store.append("a", users(2))
        await store.write_transcript("a")
    finally:
        os.umask(old)
    for d in (tmp_path / "x", tmp_path / "x" / "y"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    for f in (tmp_path / "x" / "y" / "a.jsonl", tmp_path / "x" / "y" / "a.md"):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600


HOSTILE = ["../x", "a/b", "", "a\x00b", ".", "..", "x" * 200, ".hidden", "/abs", "a b", 5, None]


@pytest.mark.parametrize("agent_id", HOSTILE)
async def test_hostile_ids_refused_before_touching_disk(tmp_path: Path, agent_id: Any) -> None:
    root = tmp_path / "root"
    store = OffloadStore(root)
    with pytest.raises(ConfigError):
        store.path_for(agent_id)
    with pytest.raises(ConfigError):
        await store.append(agent_id, users(1))
    with pytest.raises(ConfigError):
        await store.append(agent_id, [])
    with pytest.raises(ConfigError):
        await store.records(agent_id)
    with pytest.raises(ConfigError):
        await store.read(agent_id)
    with pytest.raises(ConfigError):
        await store.read_range(agent_id, 1, 5)
    with pytest.raises(ConfigError):
        await store.search(agent_id, "x")
    assert not root.exists()
    assert listing(tmp_path) == []


async def test_missing_journal_reads_empty_and_creates_nothing(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path / "none")
    assert await store.records("a") == []
    assert await store.read("a") == []
    assert await store.read_range("a", 1, 10) == []
    assert await store.search("a", "anything") == []
    assert not (tmp_path / "none").exists()


async def test_bad_arguments(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    with pytest.raises(ConfigError):
        await store.append("a", users(1), compaction=-1)
    with pytest.raises(ConfigError):
        await store.search("a", "x", limit=0)
    with pytest.raises(ConfigError):
        await store.search("a", "x", limit=True)
    assert listing(tmp_path) == []


async def test_transcript_content(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    await store.append("a", users(1))
    assert await store.write_transcript("a") == tmp_path / "a.md"
    await store.append("a", varied()[3:5], compaction=4)
    await store.write_transcript("a")  # incremental: only the new batch is appended
    md = (tmp_path / "a.md").read_text()
    assert md.count("## Compaction") == 2
    assert "## Compaction 0 — records 1\N{EN DASH}1" in md
    assert "## Compaction 4 — records 2\N{EN DASH}3" in md
    assert "search" in md and '"q":"trio"' in md
    assert "tool (call ` c1 `, error)" in md
    assert "result text" in md
    # a new store rewrites it whole, with the same content
    await OffloadStore(tmp_path).write_transcript("a")
    assert (tmp_path / "a.md").read_text() == md


# -- retry dedup --------------------------------------------------------------------------------


async def test_retry_dedup(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    a, b, c, d = users(4)
    r1 = await store.append("x", [a, b, c], compaction=1)
    assert (r1.first_seq, r1.last_seq, r1.written) == (1, 3, 3)
    r2 = await store.append("x", [a, b, c], compaction=1)
    assert (r2.first_seq, r2.last_seq, r2.written) == (1, 3, 0)
    r3 = await store.append("x", [b, c, d], compaction=1)
    assert (r3.first_seq, r3.last_seq, r3.written) == (2, 4, 1)
    r4 = await store.append("x", [d, d])
    assert (r4.first_seq, r4.last_seq, r4.written) == (4, 4, 0)
    assert await store.read("x") == [a, b, c, d]
    assert len(check_clean(tmp_path / "x.jsonl")) == 4


async def test_dedup_across_stores(tmp_path: Path) -> None:
    a, b, c = users(3)
    await OffloadStore(tmp_path).append("x", [a, b])
    r = await OffloadStore(tmp_path).append("x", [a, b, c])  # another process retried
    assert (r.first_seq, r.last_seq, r.written) == (1, 3, 1)
    r = await OffloadStore(tmp_path).append("x", [a, a])  # duplicates within a batch are written once
    assert (r.first_seq, r.last_seq, r.written) == (1, 1, 0)
    records = await OffloadStore(tmp_path).records("x")
    assert [r.message for r in records] == [a, b, c]  # each message once, at its first record
    assert [r.seq for r in records] == [1, 2, 3]
    assert len(check_clean(tmp_path / "x.jsonl")) == 3


# -- search and ranges --------------------------------------------------------------------------


async def test_search_ranking(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    msgs = [
        Message.user("the quick brown fox"),  # 1: fox
        Message.user("FOX and dog, dog, dog"),  # 2: fox + dog, 4 hits
        Message.user("nothing to see"),  # 3
        Message.user("dog fox"),  # 4: fox + dog, 2 hits
        Message.assistant("", tool_calls=(ToolCall("c1", "find_dog", {"animal": "Fox"}),)),  # 5: fox
        Message.user("foxes are not a fox-match? fox"),  # 6: fox x2
        Message.user("a dog"),  # 7: dog
    ]
    await store.append("s", msgs)
    got = [r.seq for r in await store.search("s", "Fox, DOG!")]
    # BM25: "fox" is in most records (it tells little), "dog" in three: a record with "dog" ranks
    # above one with only "fox", however often (issue 28)
    assert got[:3] == [2, 4, 7] and sorted(got[3:]) == [1, 5, 6]  # then by "fox", shorter records first
    assert [r.seq for r in await store.search("s", "fox dog", limit=2)] == [2, 4]
    assert [r.seq for r in await store.search("s", "find_dog")] == [5]
    assert [r.seq for r in await store.search("s", "animal")] == [5]
    assert await store.search("s", "zebra") == []
    assert await store.search("s", " ,;! ") == []
    assert (await store.search("s", "see"))[0].message == msgs[2]


async def test_read_range(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    msgs = users(6)
    await store.append("r", msgs[:3])
    await store.append("r", msgs[3:], compaction=1)
    got = await store.read_range("r", 2, 4)
    assert [r.seq for r in got] == [2, 3, 4]
    assert [r.message for r in got] == msgs[1:4]
    assert [r.compaction for r in got] == [0, 0, 1]
    assert await store.read_range("r", 5, 2) == []
    assert [r.seq for r in await store.read_range("r", 0, 100)] == list(range(1, 7))


# -- concurrency, cancellation, O(1) recovery ---------------------------------------------------


async def test_concurrent_appends(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    results: list[AppendResult] = []

    async def writer(i: int) -> None:
        results.append(await store.append("c", users(5, f"task{i}")))

    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(writer, i)
    records = await store.records("c")
    assert [r.seq for r in records] == list(range(1, 51))
    assert sorted((r.first_seq, r.last_seq) for r in results) == [(i, i + 4) for i in range(1, 51, 5)]
    for r in results:  # each batch is contiguous
        texts = {records[s - 1].message.text.split()[0] for s in range(r.first_seq, r.last_seq + 1)}
        assert len(texts) == 1
    check_clean(tmp_path / "c.jsonl")


async def test_cancel_while_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = OffloadStore(tmp_path)
    before = users(2)
    await store.append("a", before)

    in_fsync: list[float] = []

    def slow_fsync(fd: int) -> None:
        if is_journal_fd(fd):
            in_fsync.append(time.monotonic())
            time.sleep(0.3)
        REAL_FSYNC(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    batch = users(20, "cancelled")
    with trio.move_on_after(0.05) as scope:
        await store.append("a", batch)
    assert scope.cancel_called
    with trio.move_on_after(0):
        await store.append("a", users(3, "never"))
    monkeypatch.undo()
    got = await store.read("a")
    assert got in (before, before + batch)
    if in_fsync:  # the cancel arrived while the thread ran: the write was waited for, not abandoned
        assert got == before + batch
    check_clean(tmp_path / "a.jsonl")
    after = users(1, "after")
    r = await store.append("a", after)
    assert r.first_seq == len(got) + 1
    assert await store.read("a") == got + after


async def test_tail_recovery_reads_only_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.jsonl"
    filler = "x" * 10_000
    lines = [line(seq, Message.user(f"{seq} {filler}").to_dict()) for seq in range(1, 2001)]
    path.write_bytes(b"".join(lines) + b'{"seq":2001,"comp')  # and a torn tail
    size = path.stat().st_size
    assert size > 20_000_000
    read_bytes = {"n": 0}

    def counting_pread(fd: int, n: int, offset: int) -> bytes:
        data = REAL_PREAD(fd, n, offset)
        read_bytes["n"] += len(data)
        return data

    def no_read(*args: Any) -> bytes:
        raise AssertionError("the writer must not read the whole file")

    monkeypatch.setattr(os, "pread", counting_pread)
    monkeypatch.setattr(os, "read", no_read)
    r = await OffloadStore(tmp_path).append("big", users(1))
    assert (r.first_seq, r.last_seq) == (2001, 2001)
    assert 0 < read_bytes["n"] <= 3 * offload._BLOCK
    monkeypatch.undo()
    tail = path.read_bytes()[-30_000:]
    assert tail.count(b'"seq":2000,"crc"') == 1 and tail.count(b'"seq":2001,"attempt"') == 1
    assert b'"comp\n' not in tail


async def test_tail_recovery_with_a_long_last_line(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    big = Message.user("y" * (3 * offload._BLOCK + 123))
    await store.append("a", [*users(2), big])
    append_bytes(tmp_path / "a.jsonl", b'{"seq":4')
    r = await OffloadStore(tmp_path).append("a", users(1))
    assert r.first_seq == 4
    assert (await store.read("a"))[2] == big
    check_clean(tmp_path / "a.jsonl")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@given(
    text=st.text(),
    metadata=st.dictionaries(st.text(), json_values, max_size=3),
    seq=st.integers(1, 2**40),
    compaction=st.integers(0, 10**6),
)
def test_line_round_trip_property(text: str, metadata: dict[str, Any], seq: int, compaction: int) -> None:
    msg = Message.assistant(text, tool_calls=(ToolCall("c", "t", {"v": text}),), metadata=metadata)
    encoded = offload._encode_records(seq, compaction, 12.5, [orjson.dumps(msg.to_dict())])
    assert encoded.endswith(b"\n") and encoded.count(b"\n") == 1
    record = offload._decode_record(encoded[:-1], "here")
    assert (record.seq, record.compaction, record.timestamp, record.message) == (seq, compaction, 12.5, msg)


async def test_a_stalled_disk_is_bounded_and_fails_the_journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    release, entered, left = threading.Event(), threading.Event(), threading.Event()
    real_fsync = os.fsync

    def stalled(fd: int) -> None:  # a disk that does not answer (released at the end of the test)
        entered.set()
        release.wait(60)
        real_fsync(fd)
        left.set()

    store = OffloadStore(tmp_path, write_timeout=0.2)
    monkeypatch.setattr(os, "fsync", stalled)
    outcome: list[BaseException] = []

    async def caller(scope: trio.CancelScope) -> None:
        with scope:
            try:
                await store.append("a", users(1))
            except OffloadError as exc:  # (a Cancelled would end the scope and leave this empty)
                outcome.append(exc)

    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()
        nursery.start_soon(caller, scope)
        await trio.to_thread.run_sync(entered.wait)
        scope.cancel()  # the caller gives up while the write runs: it still waits for the
        # write's outcome, but only until the bound
    assert len(outcome) == 1 and isinstance(outcome[0], OffloadError), outcome
    assert "did not finish within" in str(outcome[0])
    # it gave up while the disk still stalled: it did not wait for the fsync
    assert entered.is_set() and not left.is_set()
    with pytest.raises(OffloadError, match="later appends are refused"):
        await store.append("a", users(1))
    release.set()


async def test_search_decodes_only_candidates_and_agrees_with_a_full_scan(tmp_path: Path) -> None:
    """The file store's search filters lines before decoding them; what it finds (and in
    which order) is what ranking every visible record finds: commits, attempts never
    committed, a summary that commits an earlier attempt, duplicates, damage, casefolding."""
    from cmdc._search import query_words, rank
    from cmdc.message import KIND_KEY, SUMMARY_KIND

    store = OffloadStore(tmp_path)
    texts = [
        "Deploy the STAGING cluster",
        "straße und Kelvin \u212a heat",  # casefolds to strasse / k
        'quoted "needle" and back\\slash\nnewline\ttab',
        "nothing to see",
        "ünïcödé words: Ärger ÉCOLE",
        "needle needle haystack",
    ]
    await store.append("a", [Message.user(t) for t in texts[:3]])
    call = ToolCall(id="c1", name="kubectl_rollout", arguments={"target": "Staging-Needle"})
    await store.append("a", [Message.assistant("", tool_calls=(call,))])
    hidden = await store.append(
        "a", [Message.user("needle never committed")], attempt=offload.new_attempt_id(), commit=False
    )
    later = await store.append(
        "a", [Message.user("needle committed by a summary")], attempt=offload.new_attempt_id(), commit=False
    )
    tags = {KIND_KEY: SUMMARY_KIND, offload.ATTEMPTS_KEY: list(later.pending)}
    summary = Message.user("summary: needle", metadata=tags)
    await store.append("a", [summary, *[Message.user(t) for t in texts[3:]]])
    assert hidden.pending
    path = store.path_for("a")
    lines = path.read_bytes().split(b"\n")
    victim = next(i for i, line in enumerate(lines) if b"nothing to see" in line)
    lines[victim] = lines[victim].replace(b"nothing", b"NOTHING")  # its checksum no longer holds
    path.write_bytes(b"\n".join(lines))

    records = await store.records("a")
    assert "needle never committed" not in [r.message.text for r in records]
    assert "needle committed by a summary" in [r.message.text for r in records]
    queries = [
        "needle",
        "STAGING",
        "strasse",
        "STRASSE k",
        "kubectl_rollout",
        "staging needle",
        "ärger école",
        "slash",
        "newline tab",
        "nothing",
        "absent",
        "needle haystack deploy",
        "c1",
    ]
    for query in queries:  # the index finds what ranking every visible record finds (BM25 orders it)
        found = await store.search("a", query, 50)
        assert sorted(r.seq for r in found) == sorted(r.seq for r in rank(records, query_words(query), 50)), query
        assert set(found) == set(await OffloadStore(tmp_path, index=False).search("a", query, 50))  # the scan
        for limit in (1, 3):
            assert await store.search("a", query, limit) == found[:limit], (query, limit)
    assert [r.message.text for r in await store.search("a", "needle", 1)] == ["needle needle haystack"]
    assert await store.search("nobody", "needle") == []


async def test_search_over_ascii_chunks_agrees_with_a_full_scan(tmp_path: Path) -> None:
    from cmdc._search import query_words, rank

    store = OffloadStore(tmp_path)
    words = ["Alpha", "beta", "GAMMA", "delta_x", "eps1lon"]
    batches = [
        [Message.user(f"{words[i % 5]} {words[(i * 3) % 5].upper()} n{i}") for i in range(j, j + 400)]
        for j in range(0, 4000, 400)
    ]
    for b in batches[:-1]:
        await store.append("b", b)
    await store.append("b", batches[-1], attempt=offload.new_attempt_id(), commit=False)  # never committed
    records = await store.records("b")
    assert len(records) == 3600
    for query in ["alpha", "BETA gamma", "delta_x", "n17", "n3999", "eps1lon alpha n5", "zzz"]:
        everything = await store.search("b", query, 5000)
        assert sorted(r.seq for r in everything) == sorted(r.seq for r in rank(records, query_words(query), 5000))
        assert await store.search("b", query, 7) == everything[:7], query


# -- huge lines are read in short steps ----------------------------------------------------------


_TRICKY = st.lists(
    st.sampled_from(["a", " ", "é", "😀", "\n", '"', "\\", "\t", "\x01", "\u2028", "word", "ß"]), max_size=100
).map("".join)


@given(text=_TRICKY, piece=st.integers(min_value=1, max_value=40))
def test_a_huge_line_decodes_in_pieces_as_whole(text: str, piece: int) -> None:
    """Cut anywhere (escapes, surrogate pairs, UTF-8 sequences, quotes), a message's text read in
    pieces is the text; its head and its word counts are those of the whole."""
    from cmdc import _bigjson
    from cmdc._search import message_words

    message = Message.tool_result("c", text, metadata={"k": "v"})
    line = offload._record_pieces(1, 0, 1.0, [message], "k" + "0" * 16, "j" + "0" * 16)
    data = b"".join(line)[:-1]
    old = (_bigjson.PIECE, _bigjson.BIG)
    _bigjson.PIECE, _bigjson.BIG = piece, 10
    try:
        full, counts = offload._decode_at(data, 0, len(data), "x", None, ["word", "a"])
        cut, _ = offload._decode_at(data, 0, len(data), "x", 7)
    finally:
        _bigjson.PIECE, _bigjson.BIG = old
    assert full.record is not None and full.record.message == message and full.record.clipped == 0
    assert cut.record is not None and cut.record.message.content == text[:7]
    assert cut.record.clipped == max(0, len(text) - 7) and cut.record.message.id == message.id
    whole = message_words(message)
    assert counts is not None and {w: counts[w] for w in ("word", "a")} == {w: whole[w] for w in ("word", "a")}


def test_a_damaged_huge_line_is_detected(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    big = "start " + "x y z\n" * 400_000  # 2.4 MB: past _bigjson.BIG
    trio.run(store.append, "a", [Message.user("one"), Message.user(big), Message.user("three")])
    path = store.path_for("a")
    data = bytearray(path.read_bytes())
    assert trio.run(store.search, "a", "start")[0].message.content == big
    at = data.index(b"x y z", 1_000_000)
    data[at] = ord("w")  # a flipped byte deep inside the huge line
    path.write_bytes(bytes(data))
    report = trio.run(store.verify, "a")
    assert report.records == 2 and [d.reason for d in report.damaged] == ["checksum mismatch"]
    assert [r.message.text for r in trio.run(store.records, "a")] == ["one", "three"]
    assert trio.run(store.search, "a", "start") == []
    # valid checksum, broken JSON inside the text (a raw control byte): detected too
    assert trio.run(store.repair, "a").moved > 0
    trio.run(store.append, "a", [Message.user(big)])
    good = bytearray(path.read_bytes())
    start = good.index(b'{"message":', good.index(b"three"))
    end = good.index(b"\n", start)
    good[start + 1_000_000] = 0x01  # inside the text: JSON forbids a raw control character
    head = next(h for h in offload._HEADS if good.startswith(h, start))
    crc = zlib.crc32(bytes(good[start + len(head) : end - 18]))
    good[end - 10 : end - 2] = b"%08x" % crc
    path.write_bytes(bytes(good))
    report = trio.run(store.verify, "a")
    assert len(report.damaged) == 1 and report.damaged[0].reason.startswith("not valid JSON")
    assert report.records == 2 and trio.run(store.search, "a", "start") == []


@given(text=st.lists(st.sampled_from(["a", "`", "``", "```", " ", "é", "\n"]), max_size=60).map("".join))
def test_backtick_runs_are_found_a_slice_at_a_time(text: str) -> None:
    import re

    from cmdc.store import transcript

    old = transcript._TEXT_SLICE
    transcript._TEXT_SLICE = 3
    try:
        found = transcript._longest_backticks(text)
    finally:
        transcript._TEXT_SLICE = old
    assert found == max((len(r) for r in re.findall("`+", text)), default=0)


@given(text=_TRICKY, slice_=st.integers(min_value=1, max_value=9), meta=st.booleans())
def test_a_huge_message_is_encoded_in_slices_as_whole(text: str, slice_: int, meta: bool) -> None:
    """A text past 4 slices is escaped a slice at a time: the same bytes as one encoding."""
    import cmdc.message as message_module

    old = message_module._CHECK_SLICE
    message_module._CHECK_SLICE = slice_
    try:
        m = Message.tool_result('c"1', text, metadata={"k": "é"} if meta else {})
        data = m.to_json()
    finally:
        message_module._CHECK_SLICE = old
    assert data == orjson.dumps(m._plain(), default=message_module.encode_default)
    assert Message.from_json(data) == m


def test_a_huge_piece_is_written_without_joining_it(tmp_path: Path) -> None:
    """Lines around a message past `JOIN_MAX` are written in order, the big one on its own."""
    store = OffloadStore(tmp_path)
    big = "b" * (JOIN_MAX + 10)
    batch = [Message.user("one"), Message.user(big), Message.user("three")]
    trio.run(store.append, "a", batch)
    assert trio.run(store.read, "a") == batch
    assert trio.run(store.verify, "a").clean


@pytest.mark.parametrize("join_max", [3, 1 << 20])
@pytest.mark.parametrize("group", [1, 2, 4096])
def test_write_pieces_writes_every_byte_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, join_max: int, group: int
) -> None:
    """Short pieces only (joined `group` at a time) or some past JOIN_MAX (written alone): the
    file holds the pieces joined, and the count returned is its size."""
    import cmdc._fs as fs

    monkeypatch.setattr(fs, "JOIN_MAX", join_max)
    pieces = [b"a", b"", b"bcdefgh", b"ij", b"klmnopqrstu", b"v"] * 3
    path = tmp_path / "out"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        assert fs.write_pieces(fd, pieces, group) == len(b"".join(pieces))
        assert fs.write_pieces(fd, [], group) == 0
    finally:
        os.close(fd)
    assert path.read_bytes() == b"".join(pieces)


# -- what a store remembers ------------------------------------------------------------------------


async def test_a_store_forgets_idle_journals_past_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that wrote for many agents keeps at most `_JOURNALS_KEPT` journals' caches; a
    forgotten one is learned again from its file, as by a new process: numbers go on, a
    retried batch is not written twice, a commit still lands once."""
    monkeypatch.setattr(offload, "_JOURNALS_KEPT", 3)
    store = OffloadStore(tmp_path)
    batches = {f"a{i}": users(3) for i in range(12)}
    for agent, msgs in batches.items():
        await store.append(agent, msgs, compaction=1)
        assert len(store._journals) <= 3
    assert list(store._journals) == ["a9", "a10", "a11"]  # the most recently used
    r = await store.append("a0", batches["a0"], compaction=1)  # a retry after it was forgotten
    assert (r.first_seq, r.last_seq, r.written) == (1, 3, 0)
    more = users(2)
    r = await store.append("a0", more, compaction=2, commit=False)
    assert (r.first_seq, r.last_seq, r.written) == (4, 5, 2)
    for i in range(1, 5):  # a0 forgotten again before its commit
        await store.append(f"a{i}", batches[f"a{i}"], compaction=1)
    assert "a0" not in store._journals
    assert await store.commit("a0", r.pending) is True
    batches["a0"] += more
    for agent, msgs in batches.items():
        assert await store.read(agent) == msgs
        assert len(check_clean(tmp_path / f"{agent}.jsonl")) == len(msgs)  # each record once


async def test_a_journal_in_use_or_refused_is_never_forgotten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offload, "_JOURNALS_KEPT", 1)
    store = OffloadStore(tmp_path)
    with store._hold("busy") as busy:
        for i in range(4):
            await store.append(f"a{i}", users(1))
        assert store._journals["busy"] is busy  # held: kept past the bound
    busy.failed = "refused: a write may still be running"  # as a stalled write leaves it
    for i in range(4):
        await store.append(f"b{i}", users(1))
    assert store._journals["busy"] is busy
    with pytest.raises(OffloadError, match="refused"):
        await store.append("busy", users(1))
    assert list(store._journals) == ["busy"]  # the bound holds for every other one


async def test_a_journal_is_kept_while_its_transcript_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Other agents' appends while a transcript reads its records do not make the store forget
    the journal the transcript is about to lock (nor give a second one to another writer)."""
    monkeypatch.setattr(offload, "_JOURNALS_KEPT", 1)
    store = OffloadStore(tmp_path)
    await store.append("a", users(2))
    read = store.records
    kept: list[bool] = []

    async def records_while_others_write(agent_id: str, **kw: Any) -> Any:
        for other in ("b", "c", "d"):
            await store.append(other, users(1))
        kept.append(agent_id in store._journals)
        return await read(agent_id, **kw)

    monkeypatch.setattr(store, "records", records_while_others_write)
    path = await store.write_transcript("a")
    assert kept == [True] and path.read_text().count("message ") == 2
    await store.repair("a")
    assert len(store._journals) <= 1
