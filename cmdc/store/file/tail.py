"""Reading a journal from its end, as a writer does before appending (docs/journal.md, "Damage
is contained"): its lines backwards, its last newline; and damaged bytes moved
aside to `<agent>.jsonl.damaged`."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..fs import fsync_dir, refuse_linked, write_all

_BLOCK = 64 * 1024
_WRITE_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW

def _pread_exact(fd: int, n: int, offset: int) -> bytes:
    data = os.pread(fd, n, offset)
    if len(data) != n:
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    return data


def _lines_back(fd: int, end: int) -> Iterator[tuple[int, bytes]]:
    """The complete lines before `end` (0, or just past a newline), last first, as (offset,
    line without its newline); read backwards a block at a time, never further than needed."""
    pos, buf, hi = end, b"", 0  # buf holds the bytes from `pos`; buf[:hi] is not yet yielded
    while True:
        i = buf.rfind(b"\n", 0, hi - 1) if hi > 0 else -1
        if i < 0 and pos > 0:
            parts = [buf[:hi]]
            while pos > 0:
                n = min(_BLOCK, pos)
                pos -= n
                chunk = _pread_exact(fd, n, pos)
                parts.append(chunk)
                if b"\n" in (chunk if hi > 0 or len(parts) > 2 else chunk[:-1]):
                    break
            buf = b"".join(reversed(parts))
            hi = len(buf)
            continue
        if hi == 0:
            return
        start = i + 1
        yield pos + start, buf[start : hi - 1]
        hi = start


def _last_newline(fd: int, size: int) -> int:
    """The offset just past the last newline before `size` (0 if there is none)."""
    pos = size
    while pos > 0:
        n = min(_BLOCK, pos)
        pos -= n
        i = _pread_exact(fd, n, pos).rfind(b"\n")
        if i >= 0:
            return pos + i + 1
    return 0


def _move_aside(side: Path, source: Path, chunks: Sequence[tuple[int, bytes, str]]) -> int:
    """Append damaged bytes to the side file (each chunk after a one-line note), fsync'd
    before the caller removes them from the journal. Returns the bytes moved."""
    out: list[bytes] = []
    moved = 0
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for offset, data, why in chunks:
        note = f"# cmdc: {len(data)} bytes moved from {source.name} at byte {offset}, {stamp}: {why}\n"
        out += (note.encode(), data, b"\n")
        moved += len(data)
    new = not os.path.lexists(side)
    fd = os.open(side, _WRITE_FLAGS | os.O_NONBLOCK, 0o600)  # a planted FIFO: an error, not a hang
    try:
        refuse_linked(fd, side)
        write_all(fd, b"".join(out))
        os.fsync(fd)
    finally:
        os.close(fd)
    if new:
        fsync_dir(side.parent)
    return moved


__all__ = ["_last_newline", "_lines_back", "_move_aside", "_pread_exact"]
