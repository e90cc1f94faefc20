"""Journals written before the line builder went table-driven (issue 32) are read and appended to,
and the lines it builds are byte for byte those a line-at-a-time encoder builds."""

from __future__ import annotations

import shutil
import zlib
from pathlib import Path

import orjson
import pytest

from cmdc import Message, OffloadStore
from cmdc.offload import JournalRef, _record_pieces

DATA = Path(__file__).parents[1] / "data" / "journal_today_format.jsonl"
JOURNAL = "ja1ded1f2e6c48331"
NEVER_COMMITTED = "k71731385f0921a0a"


def reference_lines(
    first: int, compaction: int, ts: float, messages: list[Message], attempt: str, journal: str
) -> bytes:
    """The format's definition, one line at a time (see the offload module's docstring)."""
    out = b""
    for k, message in enumerate(messages):
        body = message.to_json() + b',"compaction":%d,"ts":%s,"seq":%d,"attempt":"%s","journal":"%s"' % (
            compaction,
            orjson.dumps(ts),
            first + k,
            attempt.encode(),
            journal.encode(),
        )
        out += b'{"message":' + body + b',"crc":"%08x"}\n' % zlib.crc32(body)
    return out


@pytest.mark.parametrize(
    "first, n",
    [
        (1, 1),
        (1, 9),
        (1, 10),
        (1, 127),  # the last size built a line at a time
        (1, 128),  # the first built from the template
        (5, 600),
        (9_990, 20),
        (99_950, 300),
        (99_999, 2),
        (10**12 - 3, 7),
        (10**12 - 130, 260),
        (987_654_321, 513),
    ],
)
def test_lines_are_those_of_a_line_at_a_time_encoder(first: int, n: int) -> None:
    """Both builders (a few records a line at a time, more from a template), across record
    numbers of several widths (batches crossing 10, 100, 10^5, 10^12), with messages whose
    JSON was and was not cached."""
    messages = [Message.tool_result(f"c{i}", f"result {i} ünï \x00 {'x' * (i % 7)}") for i in range(n)]
    for m in messages[::3]:
        m.json_crc()
    attempt, journal = "k" + "0123456789abcdef", "j" + "fedcba9876543210"
    built = b"".join(_record_pieces(first, 4, 1733339999.25, messages, attempt, journal))
    assert built == reference_lines(first, 4, 1733339999.25, messages, attempt, journal)


async def test_a_journal_in_todays_format_is_read_and_appended_to(tmp_path: Path) -> None:
    """A journal written by the code before this change (checked in): two committed batches,
    each commit as two lines, and an attempt never committed. It verifies clean, reads the
    same, and a writer appends to it: a retry of the uncommitted attempt reuses its record,
    new records number on, and the old bytes stay as they were."""
    original = DATA.read_bytes()
    shutil.copy(DATA, tmp_path / "today.jsonl")
    store = OffloadStore(tmp_path)
    report = await store.verify("today")
    assert report.clean and report.journal == JOURNAL
    assert (report.records, report.compactions, report.uncommitted) == (7, 2, 1)
    records = await store.records("today")
    assert [r.seq for r in records] == [1, 2, 3, 4, 5, 6, 7]
    assert [r.message.content for r in records[:3]] == [f"first message {i}" for i in range(3)]
    assert records[4].message.content == "second 1 ünïcödé"

    last = orjson.loads(original.splitlines()[-1])  # the attempt never committed: a retry repeats it
    assert last["attempt"] == NEVER_COMMITTED
    retried = Message.from_dict(last["message"])
    fresh = [Message.user(f"after {i}") for i in range(3)]
    result = await OffloadStore(tmp_path).append(
        "today", [retried, *fresh], compaction=3, expect=JournalRef(JOURNAL, 7)
    )
    assert result.seqs == (8, 9, 10, 11) and result.written == 3 and result.journal == JOURNAL
    data = (tmp_path / "today.jsonl").read_bytes()
    assert data.startswith(original)
    assert f'"commit":["{result.attempt}","{NEVER_COMMITTED}"]'.encode() in data
    report = await OffloadStore(tmp_path).verify("today")
    assert report.clean and (report.records, report.uncommitted) == (11, 0)
    messages = await OffloadStore(tmp_path).read("today")
    assert [m.content for m in messages[7:]] == ["never committed", "after 0", "after 1", "after 2"]


@pytest.mark.parametrize("n", [1, 511, 512, 2048, 2049, 4100])
@pytest.mark.parametrize("short", [False, True])
def test_written_lines_are_those_of_a_line_at_a_time_encoder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int, short: bool
) -> None:
    """`_write_records` joins the lines a part at a time, writes parts four per `writev` and
    starts the disk's writeback as it goes: the file holds exactly the lines a line-at-a-time
    encoder gives, across part and write boundaries, around a message past `JOIN_MAX` (written
    on its own), and when every `writev` writes only part of what it was given."""
    import os

    from cmdc.store.file import codec
    from cmdc.store.fs import JOIN_MAX

    messages = [Message.user(f"message {i} ünï {'y' * (i % 11)}") for i in range(n)]
    if n > 2:
        messages[n // 2] = Message.user("h" * (JOIN_MAX + 5))  # a huge one, amid the others
    real_writev = os.writev

    def half_writev(fd: int, buffers: list[bytes]) -> int:
        first = bytes(buffers[0])
        return real_writev(fd, [first[: max(1, len(first) // 2)]])

    if short:
        monkeypatch.setattr(os, "writev", half_writev)
    attempt, journal = "k" + "0123456789abcdef", "j" + "fedcba9876543210"
    path = tmp_path / "lines"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, b"before\n")
        crcs, last, written = codec._write_records(fd, 7, 2, 1733339999.5, messages, attempt, journal)
    finally:
        os.close(fd)
    expected = reference_lines(7, 2, 1733339999.5, messages, attempt, journal)
    assert path.read_bytes() == b"before\n" + expected
    assert written == len(expected) and last == expected.splitlines(keepends=True)[-1]
    assert list(crcs) == [zlib.crc32(m.encode_json()) for m in messages]
