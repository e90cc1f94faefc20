"""The file store's journal writer: what a writer knows of a journal (`_Journal`, `_Known`), the
control lines it writes, the plan of an append and its one write-and-fsync step. Moved out of
`journal.py`; the protocol: docs/journal.md."""

from __future__ import annotations

import _thread
import contextlib
import errno
import os
import threading
import time
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio

from ...errors import OffloadError
from ...message import Message
from ..fs import (
    fsync_dir,
)
from .scan import Known


class _Known:
    """The records a writer remembers, by message id: (seq, crc, attempt, compaction). Kept as
    an index into a flat array of checksums, and runs: records numbered one after another in
    the order they were remembered (a batch's new records always are), with the attempt,
    compaction and first number once per run. Remembering a batch of n messages allocates no
    object per record but its index entry (n tuples would feed the garbage collector, which
    then walks every live object: tens of ms for a 50k-message batch)."""

    __slots__ = ("_index", "_pending", "crcs", "run_of", "runs", "settled")

    def __init__(self) -> None:
        self._index: dict[str, int] = {}  # message id -> position in the arrays
        self._pending: list[tuple[Sequence[str], int]] = []  # batches not indexed yet: (ids, first position)
        self.crcs: array[int] = array("I")
        self.run_of: array[int] = array("l")  # position -> index in `runs`
        # (attempt, compaction, first position, its record number) of each run
        self.runs: list[tuple[str | None, int, int, int]] = []
        self.settled = 0  # the leading runs known to be committed (see `uncommitted`)

    @property
    def index(self) -> dict[str, int]:
        """Message id -> position in the arrays. A batch is indexed when a lookup first needs
        it, not when it is remembered: the append that writes 50k records does not also build
        a 50k-entry dict that only a later append of the same journal may read."""
        if self._pending:
            index = self._index
            for ids, base in self._pending:
                index.update(zip(ids, range(base, base + len(ids)), strict=True))
            self._pending.clear()
        return self._index

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self.index

    @property
    def positions(self) -> int:
        """Array entries, an upper bound of `len(self)` that indexes nothing."""
        return len(self.crcs)

    @property
    def garbage(self) -> int:
        """Array entries no id points to any more (records remembered again at another number)."""
        return len(self.crcs) - len(self.index)

    def get(self, message_id: str) -> Known | None:
        i = self.index.get(message_id)
        if i is None:
            return None
        attempt, compaction, start, seq = self.runs[self.run_of[i]]
        return seq + i - start, self.crcs[i], attempt, compaction

    def add(
        self, ids: Sequence[str], first_seq: int, crcs: Iterable[int], attempt: str | None, compaction: int
    ) -> None:
        """Remember the records of one batch, numbered `first_seq`, `first_seq + 1`, ... in the
        order of `ids` (replacing what was remembered for those ids). `ids` is kept as it is
        until indexed: the caller does not change it."""
        base, n = len(self.crcs), len(ids)
        self.crcs.extend(crcs)
        if len(self.crcs) != base + n:
            del self.crcs[base:]
            raise AssertionError("a remembered batch needs one checksum per message")
        self.run_of.extend(array("l", (len(self.runs),)) * n)
        self.runs.append((attempt, compaction, base, first_seq))
        if n:
            self._pending.append((ids, base))

    def add_records(self, records: dict[str, Known], only_new: bool = False) -> None:
        """Remember records learned one by one: a run per stretch of consecutive numbers of
        one attempt and compaction."""
        rows = sorted(
            ((seq, attempt, compaction, mid, crc) for mid, (seq, crc, attempt, compaction) in records.items()),
            key=itemgetter(0),
        )
        if only_new:
            rows = [r for r in rows if r[3] not in self.index]
        start = 0
        for k in range(1, len(rows) + 1):
            if k == len(rows) or rows[k][0] != rows[k - 1][0] + 1 or rows[k][1:3] != rows[k - 1][1:3]:
                seq, attempt, compaction = rows[start][:3]
                self.add([r[3] for r in rows[start:k]], seq, [r[4] for r in rows[start:k]], attempt, compaction)
                start = k

    def uncommitted(self, committed: set[str]) -> bool:
        """Whether a remembered record belongs to an attempt not in `committed` (the journal's
        committed attempts, a set that only grows while this object is in use): the runs found
        committed are not looked at again, so a writer's check costs O(1), not O(batches)."""
        runs, k = self.runs, self.settled
        while k < len(runs) and (runs[k][0] is None or runs[k][0] in committed):
            k += 1
        self.settled = k
        return k < len(runs)

    def items(self) -> Iterator[tuple[str, str | None]]:
        """(message id, attempt) of every remembered record."""
        runs, run_of = self.runs, self.run_of
        for mid, i in self.index.items():
            yield mid, runs[run_of[i]][0]

    def kept(self, keep: Any) -> _Known:
        """A copy holding only the records whose attempt `keep(attempt)` accepts."""
        out = _Known()
        rows: dict[str, Known] = {}
        for mid in self.index:
            known = self.get(mid)
            assert known is not None
            if keep(known[2]):
                rows[mid] = known
        out.add_records(rows)
        return out


@attrs.define
class _Journal:
    """What a store knows about one agent's journal; guarded by `lock`."""

    lock: trio.Lock = attrs.field(factory=trio.Lock)
    failed: str | None = None
    transcribed: int = 0  # last seq written to the Markdown transcript by this store
    # the file as this store last left it: (dev, ino), size and last line, for the quick check
    inode: tuple[int, int] | None = None
    size: int = 0
    last: bytes = b""
    journal: str | None = None  # the journal's id
    seq: int = 0  # the highest record number given out in it
    parents: dict[str, str | None] = attrs.field(factory=dict)  # journal -> the one it follows (link lines)
    known: _Known = attrs.field(factory=_Known)  # records this writer remembers
    committed: set[str] = attrs.field(factory=set)
    # uncommitted attempts never to be committed: a message of theirs has a later record (a
    # retry wrote it again), and committing them would show it at their older number
    superseded: set[str] = attrs.field(factory=set)
    expected: tuple[str, int] | None = None  # (journal, highest record number) this store last wrote
    users: int = 0  # tasks between `_hold` and its end: while any, the store keeps this object

    def forget_file(self) -> None:
        self.inode, self.size, self.last = None, 0, b""


def _offload_error(path: Path, exc: OSError, doing: str) -> OffloadError:
    text = os.strerror(exc.errno) if exc.errno else str(exc)
    if exc.errno == errno.ELOOP and path.is_symlink():  # O_NOFOLLOW's answer: "Too many levels of symbolic links"
        text = "it is a symbolic link, and cmdc does not follow links to journals"
    return OffloadError(f"offload journal {path}: {doing} failed: {text}")


def _control(obj: dict[str, Any]) -> bytes:
    """A control line (`journal` or `commit`): its first key is the head; the CRC covers the
    bytes between the head and the suffix, as on message lines."""
    body = orjson.dumps(obj)[:-1]
    head = len(next(iter(obj))) + 4  # {"key":
    return body + b',"crc":"%08x"}\n' % zlib.crc32(body[head:])


def _link(journal: str, follows: str | None, agent: str, seq: int) -> bytes:
    return _control({"journal": journal, "follows": follows, "agent": agent, "seq": seq, "ts": time.time()})


def _commit_line(attempts: Sequence[str], journal: str, seq: int) -> bytes:
    """A commit, as two identical lines: one damaged copy (a flipped bit, a bad sector's worth
    of it) costs nothing, the other commits the attempts; a damaged newline between them is
    recovered by `_fused`. Readers and writers treat a repeated commit as one."""
    line = _control({"commit": list(attempts), "journal": journal, "seq": seq, "ts": time.time()})
    return line + line


@attrs.frozen
class _AppendPlan:
    """What an append writes, decided before any byte is: the messages that get new records
    (`fresh`, numbered `first`, `first + 1`, ... in the batch's order), each batch message's
    record number (`seqs`), the number after the last new one (`next_seq`), the attempts its
    commit names (`ordered`, the append's own first), the journal's highest number after it
    (`high`), and the uncommitted attempts it supersedes."""

    fresh: Sequence[Message]
    seqs: Sequence[int]
    first: int
    next_seq: int
    ordered: tuple[str, ...]
    high: int
    superseded: frozenset[str]


def _plan_append(
    journal: _Journal, batch: tuple[Message, ...], in_batch: set[str], compaction: int, attempt: str
) -> _AppendPlan:
    """The append of `batch` as attempt `attempt`, planned from what the writer knows of the
    journal (its end, the records it remembers): pure, no I/O, nothing changed."""
    from .journal import OffloadStore  # (journal.py imports this module)

    pending = {attempt}
    superseded: set[str] = set()
    first = journal.seq + 1
    # the common case: every message is new (checked over the smaller of the two)
    if journal.known.index.keys().isdisjoint(in_batch):
        fresh: Sequence[Message] = batch
        next_seq = first + len(batch)
        seqs: Sequence[int] = range(first, next_seq)
    else:
        fresh, numbers = OffloadStore._reused(journal, batch, in_batch, compaction, pending, superseded)
        next_seq = first
        for i, s in enumerate(numbers):
            if s < 0:
                numbers[i] = next_seq
                next_seq += 1
        seqs = numbers
    if not fresh:
        pending.discard(attempt)
    ordered = tuple(a for a in (attempt, *sorted(pending - {attempt})) if a in pending)
    high = max(journal.seq, next_seq - 1)
    return _AppendPlan(fresh, seqs, first, next_seq, ordered, high, frozenset(superseded))


def _write_synced(
    fd: int,
    path: Path,
    journal: _Journal,
    write: Callable[[], bytes],
    *,
    archive: bool,
    written: Callable[[], None] | None = None,
) -> None:
    """The one write-and-fsync step of every journal change (appends and commits), run with the
    file locked: `write()` appends the lines and returns the last one. A failed write leaves the
    file where it ended (truncated back) and is raised as `OffloadError`; a failed fsync marks the
    journal failed (later appends are refused: what reached the disk is unknown). Then the file's
    new end is remembered. `archive`: the written pages go back to the system but for the last
    line's (a journal is rarely read; the next change reads its last line). `written()`, when
    given, is called once every byte is written, by a thread of its own started immediately
    before the fsync (see `_tell_beside`): the fsync starts at once, not after the work the
    call wakes up (a summary in trio's thread, a ledger in a worker) had its turns on the GIL."""
    size = os.fstat(fd).st_size
    # A new (empty) file: its directory entry is made durable beside the data, by a thread
    # started now, so that it overlaps the encoding and the file's own fsync (docs/journal.md,
    # "Why a new journal's directory fsync runs beside its data").
    entry = _DirSync(path.parent) if size == 0 else None
    try:
        last = write()
        end = os.fstat(fd).st_size
    except BaseException as exc:  # nothing of the change stays: the file ends where it did
        try:
            os.ftruncate(fd, size)
        except OSError as exc2:
            journal.failed = f"{_offload_error(path, exc2, 'truncate after a failed write')}"
        journal.forget_file()
        if entry is not None:
            entry.wait()  # (its own failure is moot: the write's is raised)
        if isinstance(exc, OSError):
            raise _offload_error(path, exc, "write") from exc
        raise
    told = None if written is None else _tell_beside(written)
    try:
        try:
            os.fsync(fd)
            if archive and end - size > len(last):  # (a length of 0 would mean: to the end of the file)
                os.posix_fadvise(fd, size, end - size - len(last), os.POSIX_FADV_DONTNEED)
        finally:
            failed = None if entry is None else entry.wait()  # waited for whatever the fsync did
            if told is not None:  # told before this returns: the callback runs before the append's caller resumes
                told.acquire()
        if failed is not None:
            raise failed
    except OSError as exc:
        journal.failed = f"{_offload_error(path, exc, 'fsync')}; later appends are refused"
        raise _offload_error(path, exc, "fsync") from exc
    journal.size, journal.last = end, last


def _tell_beside(tell: Callable[[], None]) -> threading.Lock:
    """`tell()` in a thread of its own, started now, for a caller about to block in a system
    call (the fsync): the new thread first runs when that call releases the GIL. Called here,
    `tell` (waking trio's thread: a socket write, which releases the GIL) let the woken work (a
    ledger, a summary) take the GIL while this thread waited to get it back and start the fsync,
    up to the switch interval (5 ms) each time: measured, the fsync of a 10k-message batch
    started 5.5 ms after its last write. What `tell` raises is dropped (it is a hint).

    Returns a lock released once `tell` has returned: the writer acquires it before it returns,
    so what `tell` scheduled in trio's thread runs before the append's caller resumes (without
    it, a loaded machine could run the thread after the append had returned)."""
    done = threading.Lock()
    done.acquire()

    def run() -> None:
        try:
            with contextlib.suppress(Exception):
                tell()
        finally:
            done.release()

    try:
        _thread.start_new_thread(run, ())
    except RuntimeError:  # no thread to be had: told here instead
        run()
    return done


class _DirSync:
    """`fsync_dir(directory)` in a thread of its own, started at once (without the handshake of
    `threading.Thread.start`, which would wait until the new thread holds the GIL); `wait()`
    waits for it and returns the `OSError` it met, or None."""

    __slots__ = ("_directory", "_done", "_error")

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._error: OSError | None = None
        self._done = threading.Lock()
        self._done.acquire()
        try:
            _thread.start_new_thread(self._run, ())
        except RuntimeError:  # no thread to be had: done here instead
            self._run()

    def _run(self) -> None:
        try:
            fsync_dir(self._directory)
        except OSError as exc:
            self._error = exc
        finally:
            self._done.release()

    def wait(self) -> OSError | None:
        with self._done:
            return self._error
