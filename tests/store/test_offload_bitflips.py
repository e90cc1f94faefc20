"""One flipped bit anywhere in a journal costs at most the records whose lines it lands in.

A commit is written as two identical lines, so a damaged commit line (one copy) hides nothing;
a damaged newline joining two lines is recovered (both lines pass their checksums); `repair`
puts a damaged copy's twin and a joined line's newline back. Journals written before commits
were doubled (one commit line) are still read."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cmdc.cli import main
from cmdc.errors import OffloadCorrupted
from cmdc.message import Message
from cmdc.offload import ATTEMPTS_KEY, JournalRef, OffloadStore, _decode_line, _scan

AGENT = "a1"

# Written by the code before commits were doubled (one commit line per commit): three
# compactions (committed at once; committed later; one attempt never committed beside one
# committed with a summary).
TODAYS_FORMAT = (Path(__file__).parents[1] / "data" / "journal_one_commit_line.jsonl").read_bytes()


def msg(text: str) -> Message:
    return Message.user(text)


def visible(data: bytes) -> dict[int, Message]:
    """What readers show: record number -> message."""
    return {r.seq: r.message for r in _scan(data, Path("j.jsonl")).records}


def record_lines(data: bytes) -> dict[int, tuple[int, int]]:
    """Each message record's line: seq -> (first byte, end) with its newline."""
    out: dict[int, tuple[int, int]] = {}
    offset = 0
    while offset < len(data):
        nl = data.index(b"\n", offset)
        decoded = _decode_line(data[offset:nl], "line")
        if decoded.record is not None:
            out[decoded.seq] = (offset, nl + 1)
        offset = nl + 1
    return out


def flipped(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def check_flip(
    data: bytes, bit: int, before: dict[int, Message], lines: dict[int, tuple[int, int]]
) -> dict[int, Message]:
    """Readers of `data` with `bit` flipped show a subset of what they showed, at the same
    numbers (never an uncommitted attempt), losing only records the flipped byte is in."""
    after = visible(flipped(data, bit))
    for seq, m in after.items():
        assert before.get(seq) == m, f"bit {bit}: record {seq} shown that was not (or was another message)"
    for seq in before.keys() - after.keys():
        start, end = lines[seq]
        assert start <= bit // 8 < end, f"bit {bit} (byte {bit // 8}) hid record {seq} of bytes {start}..{end}"
    return after


async def build(store: OffloadStore) -> None:
    """A journal of every kind of line and batch: committed at once, committed later, an
    attempt never committed, a retry reusing an abandoned attempt's records, a summary naming
    its (committed) attempts, a batch of one."""
    await store.append(AGENT, [msg("alpha"), msg("beta"), msg("gamma")], compaction=1)
    later = await store.append(AGENT, [msg("delta"), msg("epsilon")], compaction=2, commit=False)
    await store.commit(AGENT, later.pending)
    abandoned = [msg("zeta"), msg("eta")]
    await store.append(AGENT, abandoned, compaction=3, commit=False)
    retry = await store.append(AGENT, abandoned, compaction=3, commit=False)
    await store.commit(AGENT, retry.pending)
    await store.append(AGENT, [msg("never committed")], compaction=4, commit=False)
    summary = Message.assistant("summary", metadata={"cmdc.kind": "summary", ATTEMPTS_KEY: list(later.pending)})
    await store.append(AGENT, [msg("theta"), summary], compaction=5)
    await store.append(AGENT, [msg("iota")], compaction=6)


async def test_a_journal_in_todays_format_is_read_and_written_on(tmp_path: Path) -> None:
    (tmp_path / f"{AGENT}.jsonl").write_bytes(TODAYS_FORMAT)
    store = OffloadStore(tmp_path)
    ids = ["m00", "m01", "m02", "m03", "m04", "m06", "s01"]
    assert [m.id for m in await store.read(AGENT)] == ids
    report = await store.verify(AGENT)
    assert (report.records, report.compactions, report.uncommitted, report.clean) == (7, 3, 1, True)
    r = await store.append(AGENT, [msg("new")], compaction=4)
    assert r.first_seq == 9
    assert [m.id for m in await store.read(AGENT)] == [*ids, r_id(await store.read(AGENT))]
    assert (tmp_path / f"{AGENT}.jsonl").read_bytes().startswith(TODAYS_FORMAT)


def r_id(messages: list[Message]) -> str:
    assert messages[-1].text == "new"
    return messages[-1].id


async def test_a_flipped_bit_in_a_commit_line_hides_nothing_and_repair_restores_it(tmp_path: Path) -> None:
    """The attack: one bit flipped in a commit line hid every record it committed (17 to 0),
    and `repair` moved it aside for good. Every bit of every commit line, flipped: readers show
    every record; a repair (on a sample) gives back the journal as written, both copies."""
    store = OffloadStore(tmp_path / "src")
    await build(store)
    data = store.path_for(AGENT).read_bytes()
    before = visible(data)
    assert len(before) == 10
    commits = [i for i in range(len(data)) if data.startswith(b'{"commit":', i)]
    assert len(commits) == 10  # five commits, two copies each
    checked = 0
    for start in commits:
        end = data.index(b"\n", start)
        for bit in range(start * 8, (end + 1) * 8):
            assert visible(flipped(data, bit)) == before, bit
            if bit % 97 == 0 or bit == end * 8 + 3:  # a repair on a sample (each is fsync'd)
                d = tmp_path / f"r{bit}"
                d.mkdir()
                (d / f"{AGENT}.jsonl").write_bytes(flipped(data, bit))
                fixed = OffloadStore(d)
                assert not (await fixed.repair(AGENT)).clean
                assert (d / f"{AGENT}.jsonl").read_bytes() == data, bit  # the copy's twin put back
                assert (await fixed.verify(AGENT)).clean
                checked += 1
                shutil.rmtree(d)
    assert checked >= 8


async def test_every_single_bit_flip_loses_at_most_the_records_of_its_line(tmp_path: Path) -> None:
    """Every byte of a journal holding every kind of line and batch (every bit of the commit
    lines: the test above; any bit: the property below)."""
    store = OffloadStore(tmp_path)
    await build(store)
    data = store.path_for(AGENT).read_bytes()
    before = visible(data)
    lines = record_lines(data)
    lost = 0
    for byte in range(len(data)):  # one bit of each byte (each bit in turn), all eight of a newline
        for bit in range(8) if data[byte] == 0x0A else (byte % 8,):
            lost += len(before) - len(check_flip(data, byte * 8 + bit, before, lines))
    assert lost > 0  # (flips in message lines do cost their record)


async def test_a_damaged_newline_between_two_lines_loses_neither(tmp_path: Path) -> None:
    store = OffloadStore(tmp_path)
    await build(store)
    path = store.path_for(AGENT)
    data = path.read_bytes()
    before = await store.records(AGENT)
    newlines = [i for i, b in enumerate(data[:-1]) if b == 0x0A]
    for k, i in enumerate(newlines):
        bad = bytearray(data)
        bad[i] ^= 1 << (k % 8)
        path.write_bytes(bytes(bad))
        assert await OffloadStore(tmp_path).records(AGENT) == before, i
        report = await OffloadStore(tmp_path).verify(AGENT)
        assert [d.reason for d in report.damaged] == ["two lines joined by a damaged newline"]
    fixed = OffloadStore(tmp_path)
    assert not (await fixed.repair(AGENT)).clean
    assert path.read_bytes() == data and (await fixed.verify(AGENT)).clean


async def test_a_flipped_last_newline_is_put_back_by_the_next_writer(tmp_path: Path) -> None:
    """The file's last byte, a newline, flipped: the line before it is whole, so the writer
    puts the newline back rather than moving the line aside."""
    store = OffloadStore(tmp_path)
    first = [msg("one"), msg("two")]
    result = await store.append(AGENT, first, compaction=1, commit=False)  # ends with a record
    path = store.path_for(AGENT)
    data = path.read_bytes()
    path.write_bytes(data[:-1] + b"J")  # 0x0a ^ 0x40
    writer = OffloadStore(tmp_path)
    await writer.commit(AGENT, result.pending)
    assert await writer.read(AGENT) == first
    assert path.read_bytes().startswith(data) and not (tmp_path / f"{AGENT}.jsonl.damaged").exists()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(st.tuples(st.sampled_from(["now", "later", "abandon", "retry"]), st.integers(1, 4)), max_size=7),
    data=st.data(),
)
async def test_any_flipped_bit_loses_at_most_its_line(ops: list[tuple[str, int]], data: st.DataObject) -> None:
    """Journals built by any sequence of appends (committed at once or later, abandoned,
    retried), one bit flipped anywhere: readers lose at most the records the bit lands in and
    show nothing new; a repair keeps exactly what readers showed; a writer carries on."""
    tmp = Path(tempfile.mkdtemp(prefix="cmdc-flip-"))
    try:
        store = OffloadStore(tmp / "src")
        abandoned: list[tuple[int, list[Message]]] = []
        for compaction, (kind, n) in enumerate(ops, 1):
            batch = [msg(f"{kind} {compaction}.{i}") for i in range(n)]
            if kind == "retry" and abandoned:
                compaction, batch = abandoned.pop()
            if kind == "now" or kind == "retry":
                await store.append(AGENT, batch, compaction=compaction)
            elif kind == "later":
                r = await store.append(AGENT, batch, compaction=compaction, commit=False)
                await store.commit(AGENT, r.pending)
            else:
                await store.append(AGENT, batch, compaction=compaction, commit=False)
                abandoned.append((compaction, batch))
        await store.append(AGENT, [msg("last")], compaction=len(ops) + 1)
        raw = store.path_for(AGENT).read_bytes()
        before = visible(raw)
        # (ids and timestamps vary the file's length between runs: a position drawn as a share)
        bit = data.draw(st.integers(0, 2**32 - 1), label="where") * len(raw) * 8 // 2**32
        after = check_flip(raw, bit, before, record_lines(raw))

        for k, action in enumerate(("repair", "append")):
            d = tmp / f"{action}{k}"
            d.mkdir()
            (d / f"{AGENT}.jsonl").write_bytes(flipped(raw, bit))
            s = OffloadStore(d)
            if action == "repair":
                await s.repair(AGENT)
                assert (await s.verify(AGENT)).clean
                assert {r.seq: r.message for r in await s.records(AGENT)} == after
            else:
                new = msg("after the flip")
                with trio.fail_after(30):
                    r = await s.append(AGENT, [new], compaction=len(ops) + 2)
                assert {r.seq: r.message for r in await s.records(AGENT)} == {**after, r.first_seq: new}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_line_that_only_looks_joined_stays_damaged() -> None:
    """A damaged line is split only where both halves pass their checksums."""
    line = b'{"commit":["k0123456789abcdef"],"journal":"j0123456789abcdef","seq":1,"ts":1.0,"crc":"00000000"}'
    joined = line + b"J" + line
    with contextlib.suppress(OffloadCorrupted):
        _decode_line(joined, "x")
        raise AssertionError("a joined line decodes")
    assert visible(joined + b"\n") == {}
    assert _scan(joined + b"\n", Path("j")).damaged[0].reason != "two lines joined by a damaged newline"


def test_cmdc_compact_journal_survives_a_flipped_commit_bit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The report's case, through the command: a `cmdc compact` journal, one bit flipped in its
    commit line: `cmdc history` still lists every record, `--verify` names the damage, and
    `--repair` gives back the journal as written."""
    chat = tmp_path / "chat.jsonl"
    chat.write_text(
        "".join(f'{{"role":"{r}","content":"turn {i} {r}"}}\n' for i in range(12) for r in ("user", "assistant"))
    )
    journals = tmp_path / "journals"
    assert main(["compact", str(chat), "--offload-dir", str(journals), "--keep", "4"]) == 0
    path = journals / "chat.jsonl"
    data = path.read_bytes()
    before = visible(data)
    assert len(before) > 10
    commit = data.index(b'{"commit":')
    path.write_bytes(flipped(data, (commit + 20) * 8 + 2))
    assert visible(path.read_bytes()) == before
    capsys.readouterr()
    assert main(["history", str(journals), "chat"]) == 0
    assert f"{len(before)} records from 1 compaction(s)" in capsys.readouterr().out
    assert main(["history", str(journals), "chat", "--verify"]) == 1  # damaged: said so
    assert main(["history", str(journals), "chat", "--repair"]) == 0
    assert path.read_bytes() == data


async def test_a_huge_line_joined_to_its_commit_is_read_whole(tmp_path: Path) -> None:
    """A 3 MB record (read in pieces) whose newline is flipped: the record and its commit lines
    both read, by readers (texts whole and cut) and by a search."""
    store = OffloadStore(tmp_path)
    big = msg("needle " + "x" * 3_000_000)
    await store.append(AGENT, [msg("small"), big])
    path = store.path_for(AGENT)
    data = path.read_bytes()
    nl = data.index(b"\n", data.index(b"needle"))
    path.write_bytes(data[:nl] + b"\x0e" + data[nl + 1 :])
    assert [m.text for m in await store.read(AGENT)] == ["small", big.text]
    cut = await store.records(AGENT, max_chars=10)
    assert cut[1].message.text == "needle xxx" and cut[1].clipped == len(big.text) - 10
    assert [r.message.id for r in await store.search(AGENT, "needle")] == [big.id]
    await store.repair(AGENT)
    assert path.read_bytes() == data


@pytest.mark.parametrize("recent", [None, 1])
async def test_a_writer_learns_records_of_a_joined_line_as_readers_see_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recent: int | None
) -> None:
    """A new writer whose caller's state is behind the journal reuses the records of a batch
    it repeats, the two lines a damaged newline joined included, so the numbers it reports are
    the ones readers show (learned from the end of the file, or, with `recent=1`, looked up
    further back by the learn-back path)."""
    from cmdc import offload

    if recent is not None:
        monkeypatch.setattr(offload, "_RECENT", recent)
    store = OffloadStore(tmp_path)
    batch = [msg("one"), msg("two")]
    first = await store.append(AGENT, batch, compaction=1)
    await store.append(AGENT, [msg("three")], compaction=2)
    path = store.path_for(AGENT)
    data = path.read_bytes()
    nl = data.index(b"\n", data.index(b'"one"'))
    path.write_bytes(data[:nl] + b"\x0b" + data[nl + 1 :])  # the lines of "one" and "two" joined
    writer = OffloadStore(tmp_path)
    again = await writer.append(AGENT, [*batch, msg("four")], compaction=1, expect=JournalRef(first.journal, 0))
    assert again.seqs[:2] == first.seqs and again.written == 1
    shown = {r.message.text: r.seq for r in await writer.records(AGENT)}
    assert shown == {"one": 1, "two": 2, "three": 3, "four": 4}
