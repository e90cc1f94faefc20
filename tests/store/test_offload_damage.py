"""A damaged journal: torn tails at every offset, flipped bytes, corrupt or malformed complete
lines are skipped, counted or moved aside."""

from __future__ import annotations

import shutil
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from fakes import check_clean, line, users, varied

from cmdc.message import Message, ToolCall
from cmdc.offload import OffloadStore

# -- torn tails and corruption -----------------------------------------------------------------


async def test_torn_tail_at_every_offset(tmp_path: Path) -> None:
    src = tmp_path / "src"
    store = OffloadStore(src)
    msgs = [*users(2), Message.assistant("last one ✓", tool_calls=(ToolCall("c9", "f", {"x": 1}),))]
    await store.append("a", msgs[:2])
    await store.append("a", msgs[2:], compaction=1)
    data = (src / "a.jsonl").read_bytes()
    twin = data.rindex(b"\n", 0, len(data) - 1) + 1  # the last message line, then its commit twice
    commit_start = data.rindex(b"\n", 0, twin - 1) + 1
    start = data.rindex(b"\n", 0, commit_start - 1) + 1
    assert data[commit_start:twin] == data[twin:]
    extra = Message.user("after the crash")
    for cut in range(start, len(data)):
        d = tmp_path / f"c{cut}"
        d.mkdir()
        (d / "a.jsonl").write_bytes(data[:cut])
        s = OffloadStore(d)
        assert await s.read("a") == msgs[: 3 if cut >= twin else 2], cut
        assert (d / "a.jsonl").read_bytes() == data[:cut]  # readers never write
        r = await s.append("a", [extra])
        kept = cut >= commit_start - 1  # a line that lacks only its newline is completed, not moved
        assert r.written == 1 and r.first_seq == (4 if kept else 3)
        committed = cut >= twin - 1
        assert await s.read("a") == [*msgs[:2], *([msgs[2]] if committed else []), extra]
        check_clean(d / "a.jsonl")
        line = twin if committed else commit_start if kept else start  # where the torn line starts
        assert (d / "a.jsonl").read_bytes().startswith(data[:line])
        side = d / "a.jsonl.damaged"
        if cut not in (start, commit_start - 1, commit_start, twin - 1, twin, len(data) - 1):  # torn bytes moved aside
            assert data[line:cut] in side.read_bytes()
        shutil.rmtree(d)


async def test_torn_only_record(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_bytes(b'{"seq":1,"compaction":0,"ts":1.0,"mess')
    store = OffloadStore(tmp_path)
    assert await store.read("a") == []
    r = await store.append("a", users(1))
    assert r.first_seq == 1
    assert len(check_clean(tmp_path / "a.jsonl")) == 1
    assert b'{"seq":1,"compaction":0,"ts":1.0,"mess' in (tmp_path / "a.jsonl.damaged").read_bytes()


async def test_flipped_byte_in_a_record_is_skipped_and_counted(tmp_path: Path) -> None:
    src = tmp_path / "src"
    msgs = varied()[:4]
    await OffloadStore(src).append("a", msgs)
    data = (src / "a.jsonl").read_bytes()
    line2 = data.index(b"\n") + 1  # line 1 names the journal; line 2 is the first record
    end2 = data.index(b"\n", line2) + 1
    d = tmp_path / "d"
    d.mkdir()
    events: list[Any] = []
    store = OffloadStore(d, on_event=events.append)
    path = d / "a.jsonl"
    for pos in range(line2, end2, 7):  # the newline too
        for new in {data[pos] ^ 0x01, data[pos] ^ 0x80, ord("\n"), ord(" ")} - {data[pos]}:
            path.write_bytes(data[:pos] + bytes([new]) + data[pos + 1 :])
            got = await store.read("a")
            assert got in (msgs[1:], msgs[2:]), pos  # the damaged record (or two, merged) skipped
            report = await store.verify("a")
            assert report.damaged and report.damaged[0].line == 2
            assert report.records == len(got)
            assert events[-1].kind == "journal_damaged" and events[-1].data["damaged"] == len(report.damaged)


@pytest.mark.parametrize("copies", [2, 1])
async def test_corrupt_last_complete_line_is_moved_aside(tmp_path: Path, copies: int) -> None:
    """The last line, a commit, damaged. Written twice (as cmdc writes it), the other copy still
    commits the batch; written once (by an older cmdc), the batch is hidden until committed again."""
    store = OffloadStore(tmp_path)
    msgs = users(3)
    await store.append("a", msgs)
    path = tmp_path / "a.jsonl"
    data = bytearray(path.read_bytes())
    if copies == 1:
        del data[data.rindex(b"\n", 0, len(data) - 1) + 1 :]
    data[-30] ^= 0x04  # in the (last) commit line
    path.write_bytes(bytes(data) + b'{"torn')
    assert await OffloadStore(tmp_path).read("a") == (msgs if copies == 2 else [])
    events: list[Any] = []
    r = await OffloadStore(tmp_path, on_event=events.append).append("a", users(1, "after"))
    assert r.first_seq == 4  # the records of the uncommitted batch keep their numbers
    side = (tmp_path / "a.jsonl.damaged").read_bytes()
    assert bytes(data[data.rindex(b"\n", 0, len(data) - 1) + 1 : -1]) in side and b'{"torn' in side
    assert [e.kind for e in events] == ["journal_repaired"]
    check_clean(path)
    # the commit is written again (a resumed agent does this): the batch is visible once
    await OffloadStore(tmp_path).commit("a", [orjson.loads(path.read_bytes().split(b"\n")[1])["attempt"]])
    assert await OffloadStore(tmp_path).read("a") == [*msgs, *(await store.read("a"))[3:]]


def crc_line(obj: dict[str, Any]) -> bytes:
    """A line with a valid checksum for any record shape (the message first, as written)."""
    body = orjson.dumps({"message": obj.pop("message"), **obj})[:-1]
    assert body.startswith(b'{"message":')
    return body + b',"crc":"%08x"}\n' % zlib.crc32(body[len(b'{"message":') :])


@pytest.mark.parametrize(
    "content",
    [
        # seq not strictly increasing
        lambda: line(1, Message.user("a").to_dict()) + line(1, Message.user("b").to_dict()),
        lambda: line(2, Message.user("a").to_dict()) + line(1, Message.user("b").to_dict()),
        # valid crc, bad message
        lambda: line(1, {"id": "x", "role": "alien"}),
        lambda: line(1, {"id": "x", "role": "user", "extra": 1}),
        lambda: line(1, b"[1,2]"),
        lambda: line(1, {"id": "x", "role": "tool", "content": "no call id"}),
        # valid crc, bad record shape
        lambda: line(0, Message.user("a").to_dict()),
        lambda: line(1, Message.user("a").to_dict(), compaction=-1),
        lambda: crc_line({"seq": 1, "compaction": 0, "ts": 1.0, "message": Message.user("a").to_dict(), "x": 1}),
        lambda: crc_line({"seq": True, "compaction": 0, "ts": 1.0, "message": Message.user("a").to_dict()}),
        lambda: crc_line({"seq": 1, "compaction": 0, "ts": "now", "message": Message.user("a").to_dict()}),
        lambda: b"\n",
        lambda: b"not json at all\n",
    ],
)
async def test_bad_complete_lines_are_skipped(tmp_path: Path, content: Callable[[], bytes]) -> None:
    data = content()
    (tmp_path / "a.jsonl").write_bytes(data)
    store = OffloadStore(tmp_path)
    report = await store.verify("a")
    assert report.damaged and not report.clean
    records = await store.records("a")
    assert len(records) == data.count(b"\n") - len(report.damaged)
    repaired = await store.repair("a")
    assert repaired.side_file is not None and repaired.side_file.exists()
    assert (await store.verify("a")).clean and await store.records("a") == records
