"""The file store's journal: `<root>/<agent_id>.jsonl`, one per agent, a log of attempts and
commits (`OffloadStore`).

The protocol it keeps (exactly-once attempts and commits, stable record numbers and journal
identity, damage contained) and the line format are stated once, in docs/journal.md. Here: the
store (`OffloadStore`: a lock per journal, `flock` across processes, the end of the file checked
before every append). Beside it: the line encoding (codec.py), the decoding and scan of a file
(scan.py: `_decode_at`, the checksums, `_scan`, `_find_head`), the read of its end (tail.py) and
the writer's plan and write step (writer.py).

Implementation notes the page does not need: every line starts with a fixed head and ends with
the fixed suffix `,"crc":"xxxxxxxx"}`, the CRC-32 of the bytes between them (a message's
checksum, computed once when it entered its state, is reused). A writer knows the end of the
file and, when the caller's state is behind the journal (`expect.seq` below its highest number),
every record numbered after the state's: that is how it reuses a retried message's record. A
journal whose link lines lead back to the expected one (directly or through other successors) is
its successor: that loss was recorded already and is not reported again. The journal, its side
file (and the file store's lease files) are refused when they are not a regular file with one
link: a hard link planted at the name would make a write land outside the store.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import inspect
import os
import re
import sqlite3
import stat
import time
import weakref
from array import array
from collections.abc import Callable, Iterator, Sequence
from operator import attrgetter
from pathlib import Path
from typing import Any

import attrs
import trio

from ..._check import integer, seconds
from ...errors import ConfigError, IndexUnavailable, InvalidMessage, JournalLost, OffloadCorrupted, OffloadError
from ...events import (
    JOURNAL_DAMAGED,
    JOURNAL_INDEX_REBUILT,
    JOURNAL_LOST,
    JOURNAL_REPAIRED,
    Event,
    EventSink,
    emit,
    logger,
)
from ...message import Message
from ...state import validate_agent_id
from .. import bigjson as _bigjson
from ..fs import (
    DirProbe,
    atomic_write,
    fsync_dir,
    make_dirs,
    os_cause,
    refuse_linked,
    run_bounded,
    write_all,
    write_pieces,
)
from ..records import (
    ATTEMPTS_KEY,
    JOURNAL_KEY,
    AppendResult,
    JournalExtent,
    JournalRecord,
    JournalRef,
    new_attempt_id,
    new_journal_id,
)
from ..search import MAX_QUERY_CHARS, TEXT_CHARS, best_matches, query_words, record_text, tokens, wanted_words
from ..transcript import md_code, md_fenced, transcript_pieces
from . import index as _index
from .codec import _HEAD, _write_records
from .codec import _encode_records as _encode_records  # (importable from here, as before the split)
from .codec import _record_pieces as _record_pieces
from .scan import (
    _HEADS,
    _ID_HEAD,
    MAX_SEQ,
    Damage,
    Known,
    _decode_at,
    _decode_line,
    _decode_record,
    _find_head,
    _fused_cuts,
    _fused_lines,
    _Line,
    _newline_flipped,
    _remember,
    _Scan,
    _scan,
    _search_spans,
    _twin,
    _valid_id,
)
from .tail import _BLOCK as _BLOCK  # (importable from here, as before the split)
from .tail import _last_newline, _lines_back, _move_aside, _pread_exact
from .writer import _commit_line, _Journal, _Known, _link, _offload_error, _plan_append, _write_synced

_SCAN_LIMIT = 32 * 1024 * 1024  # how far back a writer reads to learn the latest attempts
_KNOWN = 65_536  # records a writer remembers (message id, number, checksum) for idempotent appends
_JOURNALS_KEPT = 4096  # journals a store keeps what it learned of while nobody uses them (see _hold)
_RECENT = 1024 * 1024  # past the latest commit, how far back it goes on learning committed ones
_WORD = re.compile(r"\w+")
_MESSAGE_ID = attrgetter("id")
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW
_JOURNAL_FLAGS = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW


@attrs.frozen
class JournalReport:
    """What `verify` found (or `repair` did): visible records, compactions (committed batches
    that start a compaction number: capped, masked and clipped results are batches numbered
    with the current one, not compactions), records of attempts never committed, hidden duplicate records, damaged
    lines, torn bytes at the end; after a repair, the bytes moved to `side_file`."""

    path: Path
    journal: str | None
    records: int
    compactions: int
    uncommitted: int
    duplicates: int
    damaged: tuple[Damage, ...]
    torn: int
    size: int
    moved: int = 0
    side_file: Path | None = None

    @property
    def clean(self) -> bool:
        return not self.damaged and not self.torn


_CHECK_TRIES = 3
"""Reads of the journal `check_index` compares with its index while appends go on (see there)."""


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return -1


@attrs.frozen
class IndexReport:
    """What `check_index` found: the index file, whether it was right, what was wrong, the
    records it now counts, and whether it was rebuilt."""

    path: Path
    ok: bool
    problems: tuple[str, ...]
    records: int
    rebuilt: bool
    note: str = ""
    """Why there was nothing to check (the index is off, or cannot be used in this directory)."""


def _in_trio(callback: Callable[[AppendResult], object], agent_id: str) -> Callable[[AppendResult], None]:
    """`callback`, callable from a worker thread: it runs soon in trio's thread, and what it
    raises is logged (trio would otherwise end the whole run)."""
    token = trio.lowlevel.current_trio_token()

    def safe(result: AppendResult) -> None:
        try:
            callback(result)
        except Exception:
            logger.exception("offload: an append's on_numbered callback failed (agent %s)", agent_id)

    def soon(result: AppendResult) -> None:
        with contextlib.suppress(trio.RunFinishedError):  # an append left to finish after its run ended
            token.run_sync_soon(safe, result)

    return soon


class OffloadStore:
    """Journals under `root`, one per agent; the protocol: docs/journal.md. `root` is made absolute
    once, here: a later `chdir` does not move the journals. `on_event` receives
    `journal_lost`, `journal_damaged` and `journal_repaired` events."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        write_timeout: float = 60.0,
        on_event: EventSink | None = None,
        index: bool = True,
    ) -> None:
        self.write_timeout = seconds(write_timeout, "write_timeout")
        self.root = Path(os.path.abspath(root))
        self.on_event = on_event
        self._journals: dict[str, _Journal] = {}
        self._probe = DirProbe.of(self.root)
        if not isinstance(index, bool):
            raise ConfigError(f"index must be True or False, got {index!r}")
        self.index = index
        """Whether the search and offsets index beside each journal is used (see `cmdc.store.file.index`)."""
        self._indexer = _index.Indexer(self._index_in_background)  # holds this store weakly
        weakref.finalize(self, self._indexer.close)  # a store dropped unclosed ends its thread
        self._tokens: dict[Path, tuple[str, trio.lowlevel.TrioToken | None]] = {}  # who to tell of a rebuild
        self._index_seen: set[Path] = set()  # journals whose index this store opened (one gone is missing)
        self._index_conns = _index.Connections()

    def __repr__(self) -> str:
        return f"OffloadStore({str(self.root)!r})"

    async def aclose(self) -> None:
        """Close the idle open search indexes (they reopen on the next use). Quick, and no
        checkpoint: an agent's task closes its compactor's store as it ends. The background
        indexer's thread ends too, after its transaction in progress (the work it had not started
        is left to the next reader, which catches the index up itself)."""
        self._indexer.close()
        self._index_conns.close_all()

    async def check_usable(self) -> None:
        """Check once that journals can be written under `root` (created if missing; a probe
        file created, written, fsync'd and removed); `OffloadError` naming the directory and
        the cause if not. A runtime calls it at spawn, before any model request."""
        if self._probe.ok:
            return
        try:
            await run_bounded(self._probe.run, limit=self.write_timeout)
        except OSError as exc:
            raise OffloadError(f"offload directory {self.root} is not usable: {os_cause(exc)}") from None
        except trio.TooSlowError:
            raise OffloadError(
                f"offload directory {self.root} is not usable: a test write took over {self.write_timeout} s"
            ) from None

    def location(self, agent_id: str) -> str:
        """The journal's file, as a string (`JournalReader`'s location)."""
        return str(self.path_for(agent_id))

    def path_for(self, agent_id: str) -> Path:
        """The journal's path; raises `ConfigError` for an unsafe agent id."""
        return self.root / f"{validate_agent_id(agent_id)}.jsonl"

    def side_file(self, agent_id: str) -> Path:
        """Where damaged bytes of the journal are moved."""
        return self.root / f"{validate_agent_id(agent_id)}.jsonl.damaged"

    def _emit(self, kind: str, agent_id: str, **data: Any) -> None:
        if self.on_event is not None:
            try:
                now = trio.current_time()
            except RuntimeError:
                now = 0.0
            emit(self.on_event, Event(kind, agent_id, data, now))

    def _journal(self, agent_id: str) -> _Journal:
        """What this store knows of the agent's journal, now the most recently used."""
        journal = self._journals.pop(agent_id, None)
        if journal is None:
            journal = _Journal()
        self._journals[agent_id] = journal
        return journal

    @contextlib.contextmanager
    def _hold(self, agent_id: str) -> Iterator[_Journal]:
        """The agent's `_Journal`, kept while the block runs. Past `_JOURNALS_KEPT` journals the
        least recently used ones that nobody holds are forgotten when a block ends: a store that
        saw a million agents does not remember a million journals (each up to `_KNOWN`
        records). A forgotten journal is learned again from its file by its next writer, as a
        store of a new process would (the end of the file; the caller's `expect` still catches a
        lost journal). One whose writes are refused (`failed`: a write may still be running) is
        never forgotten."""
        journal = self._journal(agent_id)
        journal.users += 1
        try:
            yield journal
        finally:
            journal.users -= 1
            if len(self._journals) > _JOURNALS_KEPT:
                self._forget_idle()

    def _forget_idle(self) -> None:
        excess = len(self._journals) - _JOURNALS_KEPT
        idle: list[str] = []
        for agent_id, journal in self._journals.items():  # least recently used first
            if len(idle) >= excess:
                break
            if not journal.users and journal.failed is None and not journal.lock.locked():
                idle.append(agent_id)
        for agent_id in idle:
            del self._journals[agent_id]

    # -- writing ----------------------------------------------------------------------------
    async def append(
        self,
        agent_id: str,
        messages: Sequence[Message],
        *,
        compaction: int = 0,
        attempt: str | None = None,
        expect: JournalRef | None = None,
        commit: bool = True,
        on_numbered: Callable[[AppendResult], object] | None = None,
    ) -> AppendResult:
        """Append `messages` durably (fsync'd before this returns) as a batch of `attempt` (a
        new attempt id when None). With `commit` (the default) the batch is committed by the
        same write; otherwise it stays invisible until `commit(agent_id, result.pending)`.
        Messages already in the journal (same id, same content) reuse their records.
        `expect`: the journal the caller's state names; a vanished, replaced or truncated
        journal raises `JournalLost` before anything is appended (docs/journal.md, "Stable addresses").
        `on_numbered(result)`: called in trio's thread, with what this call will return, as
        soon as the records are written and numbered, while the fsync still runs: work that
        needs the record numbers (a summary naming them) overlaps the wait for the disk. It
        is a hint: the batch is durable only when this returns, and may still fail to be (an
        exception it raises is logged, never raised here)."""
        path = self.path_for(agent_id)
        integer(compaction, "compaction", minimum=0)
        if attempt is not None and not (isinstance(attempt, str) and attempt.startswith("k") and _valid_id(attempt)):
            raise ConfigError(f"attempt must be an id from new_attempt_id(), got {attempt!r}")
        if expect is not None and not isinstance(expect, JournalRef):
            raise ConfigError(f"expect must be a JournalRef, got {expect!r}")
        batch = tuple(messages)
        if set(map(type, batch)) - {Message}:  # one C pass in the common case; then find the culprit
            for i, msg in enumerate(batch):
                if not isinstance(msg, Message):
                    raise InvalidMessage(f"messages[{i}] is a {type(msg).__name__}, not a Message")
        if on_numbered is not None and (not callable(on_numbered) or inspect.iscoroutinefunction(on_numbered)):
            raise ConfigError(f"on_numbered must be a plain (not async) function of the result, got {on_numbered!r}")
        numbered = None if on_numbered is None else _in_trio(on_numbered, agent_id)
        args = (agent_id, path, batch, compaction, attempt or new_attempt_id(), expect, commit, numbered)
        # An uncommitted batch changes nothing a reader (or the search) sees: the index is
        # poked by the commit that makes it visible, after the compaction's state exists.
        result: AppendResult = await self._locked(agent_id, path, self._append_sync, *args, index=commit)
        return result

    async def commit(self, agent_id: str, attempts: Sequence[str], *, expect: JournalRef | None = None) -> bool:
        """Make the batches of `attempts` visible (one durable commit line); attempts already
        committed are skipped. Returns whether a line was written. Raises `JournalLost` when
        the journal they were written to is gone."""
        path = self.path_for(agent_id)
        wanted = tuple(dict.fromkeys(attempts))
        if not all(isinstance(a, str) and a.startswith("k") and _valid_id(a) for a in wanted):
            raise ConfigError(f"attempts must be ids from new_attempt_id(), got {attempts!r}")
        known = self._journals.get(agent_id)
        if not wanted or (known is not None and known.committed.issuperset(wanted)):
            return False
        wrote: bool = await self._locked(agent_id, path, self._commit_sync, agent_id, path, wanted, expect)
        return wrote

    async def _locked(self, agent_id: str, path: Path, fn: Any, *args: Any, index: bool = True) -> Any:
        """`fn(journal, events, *args)` in a worker thread with the journal locked; then, with
        `index`, the search index is poked (it catches up later, off the writer's path)."""
        with self._hold(agent_id) as journal:
            async with journal.lock:
                if journal.failed is not None:
                    raise OffloadError(journal.failed)
                events: list[tuple[str, dict[str, Any]]] = []
                # A cancelled caller waits for the write to finish, but not past write_timeout.
                try:
                    done = await run_bounded(fn, journal, events, *args, limit=self.write_timeout)
                    if index:
                        self._index_soon(agent_id, path)  # after the journal changed, off its path
                    return done
                except trio.TooSlowError:
                    journal.failed = (
                        f"offload journal {path}: an append did not finish within {self.write_timeout} s "
                        "(the disk stalls); later appends are refused"
                    )
                    raise OffloadError(journal.failed) from None
                finally:
                    for kind, data in events:
                        self._emit(kind, agent_id, **data)

    def _open_locked(self, path: Path) -> int:
        """Open the journal for appending and take its lock; the fd names the file now at
        `path` (a repair may replace it while we wait for the lock)."""
        for _ in range(16):
            try:
                fd = os.open(path, _JOURNAL_FLAGS, 0o600)
            except FileNotFoundError:
                make_dirs(path.parent)
                fd = os.open(path, _JOURNAL_FLAGS, 0o600)
            try:
                refuse_linked(fd, path)
                fcntl.flock(fd, fcntl.LOCK_EX)
                st = os.fstat(fd)
                try:
                    now = os.stat(path, follow_symlinks=False)
                except FileNotFoundError:
                    now = None
                if now is not None and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                    return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        raise OSError(errno.EAGAIN, "the journal keeps being replaced")

    def _check_tail(self, fd: int, path: Path, journal: _Journal, agent_id: str, events: list[Any]) -> None:
        """Bring `journal` up to date with the file: a quick look at the last line when the
        file is as this store left it; otherwise read back from the end (repairing a torn or
        damaged tail) to learn its identity, highest record number and latest attempts."""
        st = os.fstat(fd)
        inode, size = (st.st_dev, st.st_ino), st.st_size
        if size == 0:
            os.fchmod(fd, 0o600)
        last = journal.last
        if (
            journal.inode == inode
            and journal.size == size
            and size >= len(last) > 0
            and _pread_exact(fd, len(last), size - len(last)) == last
        ):
            return
        same_file = journal.inode == inode
        cut = _last_newline(fd, size)
        chunks: list[tuple[int, bytes, str]] = []
        if cut < size:  # a torn last record
            torn = _pread_exact(fd, size - cut, cut)
            try:
                _decode_line(torn, "torn tail")
            except OffloadCorrupted:
                if _newline_flipped(torn):  # a whole line whose newline a flipped bit changed
                    os.ftruncate(fd, size - 1)  # (a crash here leaves the line without it: kept below)
                    write_all(fd, b"\n")
                    os.fsync(fd)
                    cut = size
                else:
                    chunks.append((cut, torn, "torn record (no newline)"))
            else:  # complete but for its newline: keep it
                write_all(fd, b"\n")
                os.fsync(fd)
                size = cut = size + 1
        identity: _Line | None = None
        last = b""
        known: dict[str, Known] = {}
        committed: set[str] = set()
        superseded: set[str] = set()
        commit_seen = False
        scanned = 0
        stop = False
        for offset, line in _lines_back(fd, cut):
            scanned += len(line) + 1
            where = f"{path}: byte {offset}"
            try:
                parts = [_decode_line(line, where)]
            except OffloadCorrupted as exc:
                parts = _fused_lines(line, where)[::-1]  # two lines: read back, the last first
                if not parts:
                    if identity is None:  # damage at the end: moved aside below
                        if scanned > _SCAN_LIMIT:
                            raise OffloadCorrupted(
                                f"{path}: the last {scanned} bytes are damaged; run `cmdc history "
                                f"{path.parent} {agent_id} --repair`"
                            ) from None
                        chunks.append((offset, line, str(exc).rsplit(": ", 1)[-1]))
                        cut = offset
                    continue
            for decoded in parts:
                if identity is None:
                    identity, last = decoded, line + b"\n"
                if decoded.kind == "journal":
                    assert decoded.journal is not None
                    journal.parents[decoded.journal] = decoded.follows
                    if decoded is not identity:  # the head of the journal the file ends with
                        stop = True
                        break
                if decoded.kind == "commit":
                    committed.update(decoded.attempts)
                    commit_seen = True
                    continue
                r = decoded.record
                if r is not None:
                    if r.attempt is None:
                        stop = True  # written by an older cmdc: nothing to learn further back
                        break
                    _remember(known, committed, r, superseded)
                # Back past the uncommitted attempts at the end (a retry repeats them) and the
                # latest commits, within a constant budget: never the whole file.
                if scanned > (_RECENT if commit_seen else _SCAN_LIMIT):
                    stop = True
                    break
            if stop:
                break
        if chunks:
            chunks.reverse()
            moved = _move_aside(path.with_name(path.name + ".damaged"), path, chunks)
            os.ftruncate(fd, cut)
            os.fsync(fd)
            size = cut
            events.append((JOURNAL_REPAIRED, {"path": str(path), "moved": moved, "lines": len(chunks)}))
        prior_journal = journal.journal
        journal.inode, journal.size, journal.last = inode, size, last
        if identity is None:  # an empty file
            journal.journal = None
            journal.known, journal.committed, journal.superseded = _Known(), set(), set()
            if not same_file:
                journal.seq = 0 if prior_journal is None else journal.seq
            return
        if identity.journal != prior_journal or not same_file:
            journal.known, journal.committed, journal.superseded = _Known(), set(), set()
        if identity.journal != prior_journal:
            journal.seq = 0
        journal.journal = identity.journal
        journal.seq = max(journal.seq, identity.seq)
        journal.known.add_records(known)
        journal.committed |= committed
        journal.superseded |= superseded

    def _expect(
        self, fd: int, path: Path, journal: _Journal, agent_id: str, expect: JournalRef | None, events: list[Any]
    ) -> tuple[bytes, str]:
        """Check the file against what the state (else this store) expects. Returns the line
        to write before the batch (a header for a new journal, else b"") and the journal's id;
        raises `JournalLost` after writing a link line when the expected journal is gone."""
        exp_id = expect.journal if expect is not None and expect.journal is not None else None
        exp_seq = expect.seq if exp_id is not None and expect is not None else 0
        if exp_id is None and journal.expected is not None:
            exp_id, exp_seq = journal.expected
        found = journal.journal
        if exp_id is None:
            if found is None:  # a new journal, or one written by an older cmdc: give it an identity
                jid = new_journal_id()
                return _link(jid, None, agent_id, journal.seq), jid
            return b"", found
        why = ""
        if found is None:
            why = "vanished" if journal.size == 0 else "replaced by a journal with no identity"
        elif found != exp_id and not self._follows(fd, journal, found, exp_id):
            why = f"replaced by journal {found}"
        elif found == exp_id and journal.seq < exp_seq:
            why = f"truncated: it ends at record {journal.seq}, the state names records up to {exp_seq}"
        if not why:
            assert found is not None
            return b"", found
        # The expected journal is gone: say so durably (a link that numbers on past every record
        # handed out), then fail this append; the retry writes its whole batch.
        lost_seq = journal.seq
        successor = new_journal_id()
        seq = max(journal.seq, exp_seq)
        line = _link(successor, exp_id, agent_id, seq)
        size = os.fstat(fd).st_size
        write_all(fd, line)
        os.fsync(fd)
        if size == 0:
            fsync_dir(path.parent)
        journal.journal, journal.seq = successor, seq
        journal.known, journal.committed, journal.superseded = _Known(), set(), set()
        journal.parents[successor] = exp_id
        journal.expected = None
        journal.size, journal.last = size + len(line), line
        journal.inode = _inode(fd)
        message = (
            f"offload journal {path}: journal {exp_id} {why}; going on as journal {successor} from record {seq + 1}"
        )
        events.append((JOURNAL_LOST, {"path": str(path), "expected": exp_id, "found": found, "why": why}))
        raise JournalLost(message, expected=exp_id, found=found, expected_seq=exp_seq, found_seq=lost_seq, why=why)

    @staticmethod
    def _follows(fd: int, journal: _Journal, found: str, lost: str) -> bool:
        """Whether journal `found` took over from `lost`, directly or through other successors:
        the loss was recorded durably (by this store or by another process before a restart)
        and is not reported again. Each journal's link line is learned from the end of the
        file, else found once by a search back through it."""
        seen: set[str] = set()
        while found not in seen:
            seen.add(found)
            if found not in journal.parents:
                head = _find_head(fd, journal.size, found)
                journal.parents[found] = None if head is None else head.follows
            parent = journal.parents[found]
            if parent is None:
                return False
            if parent == lost:
                return True
            found = parent
        return False

    def _append_sync(
        self,
        journal: _Journal,
        events: list[Any],
        agent_id: str,
        path: Path,
        batch: tuple[Message, ...],
        compaction: int,
        attempt: str,
        expect: JournalRef | None,
        commit: bool,
        numbered: Callable[[AppendResult], None] | None = None,
    ) -> AppendResult:
        if not batch:
            first = self._peek_next_seq(path, journal)
            return AppendResult(path, first, first - 1, 0, journal.journal, attempt)
        ids = list(map(_MESSAGE_ID, batch))  # (a C loop: no Python step per record)
        in_batch = set(ids)
        if len(in_batch) != len(ids):  # a message repeated within the batch: written once
            batch = tuple(dict(zip(ids, batch, strict=True)).values())
            ids = list(map(_MESSAGE_ID, batch))
        with self._at_end(path, journal, agent_id, expect, events) as (fd, head, jid):
            if expect is not None and journal.seq > expect.seq and not head:
                # The journal holds records the caller's state has not seen (a retry after an
                # abandoned attempt, a state resumed from an older checkpoint): some messages of
                # the batch may be among them, further back than the end this store has read.
                unknown = in_batch.difference(journal.known.index)
                if unknown:
                    self._learn_since(fd, path, journal, expect.seq, unknown)
            plan = _plan_append(journal, batch, in_batch, compaction, attempt)
            if plan.next_seq - 1 > MAX_SEQ:  # (a hand-made line numbered near the end of the range)
                raise OffloadCorrupted(f"{path}: record numbers would go past {MAX_SEQ}, which no reader takes")
            journal.superseded |= plan.superseded  # (known now: a failed write does not undo it)
            seqs = plan.seqs
            if not plan.fresh and not plan.ordered and not head:
                return AppendResult(path, min(seqs), max(seqs), 0, jid, attempt, (), tuple(seqs))
            fresh, first, ordered = plan.fresh, plan.first, plan.ordered
            commit_line = _commit_line(ordered, jid, plan.high) if commit and ordered else b""
            low, top = (first, plan.next_seq - 1) if fresh is batch else (min(seqs), max(seqs))
            result = AppendResult(path, low, top, len(fresh), jid, attempt, () if commit else ordered, tuple(seqs))
            crcs: array[int] = array("L")

            def write() -> bytes:
                nonlocal crcs
                last = b""
                if head:
                    write_all(fd, head)
                crcs, last, _ = _write_records(fd, first, compaction, time.time(), fresh, attempt, jid)
                if commit_line:
                    write_all(fd, commit_line)
                return commit_line[len(commit_line) // 2 :] or last or head or journal.last  # the last line written

            tell = None if numbered is None else functools.partial(numbered, result)
            _write_synced(fd, path, journal, write, archive=True, written=tell)
            journal.journal, journal.seq = jid, plan.high
            journal.expected = (jid, plan.high)
            # the fresh records are numbered first, first + 1, ... in the batch's order
            if fresh:
                journal.known.add(ids if fresh is batch else [m.id for m in fresh], first, crcs, attempt, compaction)
            if commit and ordered:
                journal.committed.update(ordered)
                self._prune(journal, ordered)
            return result

    @staticmethod
    def _learn_since(fd: int, path: Path, journal: _Journal, since: int, wanted: set[str]) -> None:
        """Learn the records of the `wanted` messages numbered after `since`, and the commits
        after them, reading back from the end (only the lines of wanted messages are decoded)."""
        learned: dict[str, Known] = {}
        committed: set[str] = set()
        left = len(wanted)

        def take(r: JournalRecord) -> None:
            nonlocal left
            if r.message.id in wanted and r.attempt is not None:
                left -= r.message.id not in learned
                _remember(learned, committed | journal.committed, r, journal.superseded)

        for offset, line in _lines_back(fd, journal.size):
            if line.startswith(_HEAD):
                k = line.rfind(b',"seq":') + 7
                try:
                    seq = int(line[k : line.find(b",", k)])
                except ValueError:
                    continue  # damaged: readers skip it too
                if seq <= since:
                    break
                if line.startswith(_ID_HEAD) and next(_fused_cuts(line, 0, len(line)), -1) < 0:  # (else decoded)
                    end = line.find(b'"', len(_ID_HEAD))
                    if line[len(_ID_HEAD) : end].decode("utf-8", "replace") not in wanted:
                        continue
                try:
                    take(_decode_record(line, f"{path}: byte {offset}"))
                except OffloadCorrupted:  # damaged: readers skip it too, unless it is two lines
                    for part in _fused_lines(line, f"{path}: byte {offset}")[::-1]:
                        if part.record is not None and part.seq > since:
                            take(part.record)
                        committed.update(part.attempts)
            elif line.startswith(_HEADS[2]):
                try:
                    committed.update(_decode_line(line, f"{path}: byte {offset}").attempts)
                except OffloadCorrupted:
                    for part in _fused_lines(line, f"{path}: byte {offset}")[::-1]:
                        if part.record is not None and part.seq > since:
                            take(part.record)
                        committed.update(part.attempts)
        journal.known.add_records(learned, only_new=True)
        journal.committed |= committed

    @staticmethod
    def _reused(
        journal: _Journal,
        batch: tuple[Message, ...],
        in_batch: set[str],
        compaction: int,
        pending: set[str],
        superseded: set[str],
    ) -> tuple[list[Message], list[int]]:
        """For a batch holding messages the journal has: (the messages to write, the record
        number of each message of the batch, -1 where it gets a new one); the uncommitted
        attempts whose records it reuses are added to `pending`. An uncommitted attempt's
        records are reused only by a retry of its compaction that holds every one of them:
        committing the retry commits the whole attempt. An uncommitted attempt one of whose
        messages gets a new record here is superseded: its records are never reused again (a
        batch reusing its other records would commit it, and readers would then show that
        message at its older number, not the one reported): those go to `superseded` (the
        journal's own set is left to the caller)."""
        done = journal.committed
        partial: set[str | None] = set()
        if journal.known.uncommitted(done):
            partial = {a for i, a in journal.known.items() if a is not None and a not in done and i not in in_batch}
        seqs: list[int] = []
        fresh: list[Message] = []
        for m in batch:
            known = journal.known.get(m.id)
            if (
                known is not None
                and known[1] == m.json_crc()
                and (
                    known[2] is None
                    or known[2] in journal.committed
                    or (
                        known[3] == compaction
                        and known[2] not in partial
                        and known[2] not in journal.superseded
                        and known[2] not in superseded
                    )
                )
            ):
                seqs.append(known[0])
                if known[2] is not None and known[2] not in journal.committed:
                    pending.add(known[2])
            else:
                if known is not None and known[2] is not None and known[2] not in journal.committed:
                    superseded.add(known[2])
                seqs.append(-1)
                fresh.append(m)
        return fresh, seqs

    @staticmethod
    def _prune(journal: _Journal, kept: Sequence[str]) -> None:
        """Past `_KNOWN` remembered records, forget those of attempts committed before `kept`
        (retries repeat the latest attempts and uncommitted ones)."""
        if journal.known.positions <= _KNOWN:  # (bounds both figures below, indexing nothing)
            return
        if len(journal.known) <= _KNOWN and journal.known.garbage <= _KNOWN:
            return
        keep = set(kept)
        done = journal.committed

        def kept_attempt(a: str | None) -> bool:
            return a is not None and (a in keep or a not in done)

        if all(kept_attempt(run[0]) for run in journal.known.runs) and journal.known.garbage <= _KNOWN:
            return  # every record would be kept: the copy (a second index of them all) would be the same
        journal.known = journal.known.kept(kept_attempt)

    @contextlib.contextmanager
    def _at_end(
        self, path: Path, journal: _Journal, agent_id: str, expect: JournalRef | None, events: list[Any]
    ) -> Iterator[tuple[int, bytes, str]]:
        """The journal's file opened and locked, its end checked (a torn tail moved aside) and
        matched to `expect` (`_expect`): `(fd, head, journal id)`, the file closed afterwards.
        An `OSError` within, the caller's included, becomes an `OffloadError` naming the step."""
        try:
            fd = self._open_locked(path)
        except OSError as exc:
            raise _offload_error(path, exc, "open") from exc
        try:
            self._check_tail(fd, path, journal, agent_id, events)
            head, jid = self._expect(fd, path, journal, agent_id, expect, events)
            yield fd, head, jid
        except OSError as exc:
            raise _offload_error(path, exc, "check the end of") from exc
        finally:
            os.close(fd)

    def _commit_sync(
        self,
        journal: _Journal,
        events: list[Any],
        agent_id: str,
        path: Path,
        attempts: tuple[str, ...],
        expect: JournalRef | None,
    ) -> bool:
        with self._at_end(path, journal, agent_id, expect, events) as (fd, head, jid):
            wanted = [a for a in attempts if a not in journal.committed]
            if head or not wanted:  # a new file holds no attempt to commit
                return False
            line = _commit_line(wanted, jid, journal.seq)

            def write() -> bytes:
                write_all(fd, line)
                return line[len(line) // 2 :]  # (its second copy)

            _write_synced(fd, path, journal, write, archive=False)
            journal.committed.update(wanted)
            self._prune(journal, wanted)
            return True

    def _peek_next_seq(self, path: Path, journal: _Journal) -> int:
        try:
            fd = os.open(path, _READ_FLAGS)
        except FileNotFoundError:
            return journal.seq + 1
        except OSError as exc:
            raise _offload_error(path, exc, "open") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            high = 0
            for offset, line in _lines_back(fd, _last_newline(fd, os.fstat(fd).st_size)):
                try:
                    high = _decode_line(line, f"{path}: byte {offset}").seq
                except OffloadCorrupted:
                    parts = _fused_lines(line, f"{path}: byte {offset}")
                    if not parts:
                        continue
                    high = parts[-1].seq
                break
            return max(high, journal.seq) + 1
        except OSError as exc:
            raise _offload_error(path, exc, "read") from exc
        finally:
            os.close(fd)

    # -- verify and repair --------------------------------------------------------------------
    async def verify(self, agent_id: str) -> JournalReport:
        """Read the whole journal and report what is in it and what is damaged; changes nothing."""
        path = self.path_for(agent_id)
        scan = await trio.to_thread.run_sync(self._scan_sync, path, _bigjson.BIG)  # texts not built whole
        return _report(path, scan)

    async def repair(self, agent_id: str) -> JournalReport:
        """Rewrite the journal keeping every valid line as it is (uncommitted attempts and
        control lines included), after appending every damaged line and a torn tail to the
        side file `<agent_id>.jsonl.damaged` (fsync'd first). The clean journal replaces the
        old one atomically. Returns the report of the journal before the repair, with
        `moved` bytes."""
        path = self.path_for(agent_id)
        with self._hold(agent_id) as journal:
            async with journal.lock:
                events: list[Any] = []
                try:
                    return await run_bounded(self._repair_sync, journal, events, path, limit=self.write_timeout)
                except trio.TooSlowError:
                    raise OffloadError(f"offload journal {path}: the repair did not finish in time") from None
                finally:
                    for kind, data in events:
                        self._emit(kind, agent_id, **data)

    def _repair_sync(self, journal: _Journal, events: list[Any], path: Path) -> JournalReport:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            return _report(path, _scan(b"", path))
        except OSError as exc:
            raise _offload_error(path, exc, "open") from exc
        try:
            refuse_linked(fd, path)
            fcntl.flock(fd, fcntl.LOCK_EX)
            with open(fd, "rb", closefd=False) as f:
                data = f.read()
            scan = _scan(data, path, max_chars=_bigjson.BIG)
            if not scan.damaged and not scan.torn:
                return _report(path, scan)
            bad = {d.offset for d in scan.damaged}
            chunks = [(d.offset, data[d.offset : d.offset + d.length - 1], d.reason) for d in scan.damaged]
            end = len(data) - scan.torn
            if scan.torn:
                chunks.append((end, data[end:], "torn record (no newline)"))
            kept: list[bytes] = []
            offset = 0
            while offset < end:
                nl = data.index(b"\n", offset) + 1
                if offset in scan.fused:  # two lines: the newline between them put back
                    cut = scan.fused[offset]
                    kept += (data[offset:cut], b"\n", data[cut + 1 : nl])
                elif offset not in bad:
                    kept.append(data[offset:nl])
                else:
                    kept.append(_twin(data, offset, nl, end))
                offset = nl
            if scan.torn and _newline_flipped(data[end:]):  # a whole last line: its newline put back
                kept.append(data[end:-1] + b"\n")
            side = path.with_name(path.name + ".damaged")
            moved = _move_aside(side, path, chunks)
            atomic_write(path, b"".join(kept))
            journal.forget_file()
            events.append((JOURNAL_REPAIRED, {"path": str(path), "moved": moved, "lines": len(chunks)}))
            return attrs.evolve(_report(path, scan), moved=moved, side_file=side)
        except OSError as exc:
            raise _offload_error(path, exc, "repair") from exc
        finally:
            os.close(fd)

    # -- the transcript -----------------------------------------------------------------------
    async def write_transcript(self, agent_id: str) -> Path:
        """Bring the Markdown transcript `<agent_id>.md` beside the journal up to date and
        return its path. It is for people and for a model's file tools; the journal stays the
        source of truth. Kept off the compaction path: call it when a transcript is wanted.
        The first call of a store rewrites the file (atomically, through a new temp file);
        later calls only append, unless the file is no longer the one this store wrote."""
        path = self.path_for(agent_id)
        with self._hold(agent_id) as journal:  # kept while the records are read
            records = await self.records(agent_id)
            async with journal.lock:
                return await trio.to_thread.run_sync(self._write_transcript_sync, journal, path, records)

    def _write_transcript_sync(self, journal: _Journal, path: Path, records: list[JournalRecord]) -> Path:
        md = path.with_suffix(".md")
        try:
            fd = -1
            if journal.transcribed:
                try:
                    fd = os.open(md, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
                except FileNotFoundError:
                    fd = -1
                if fd >= 0:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:  # a planted hard link: replace it
                        os.close(fd)
                        fd = -1
            if fd < 0:
                journal.transcribed = 0
            fresh = [r for r in records if r.seq > journal.transcribed]
            batches: list[list[JournalRecord]] = []
            for r in fresh:
                if not batches or batches[-1][-1].compaction != r.compaction:
                    batches.append([])
                batches[-1].append(r)
            data = [p for b in batches for p in transcript_pieces(b[0].compaction, [(r.seq, r.message) for r in b])]
            if fd < 0:
                atomic_write(md, data)
            else:
                try:
                    if data:
                        write_pieces(fd, data)
                        os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError as exc:
            raise _offload_error(md, exc, "transcript write") from exc
        if records:
            journal.transcribed = max(journal.transcribed, records[-1].seq)
        return md

    # -- reading ----------------------------------------------------------------------------
    async def records(self, agent_id: str, *, max_chars: int | None = None) -> list[JournalRecord]:
        """Every committed record in seq order, each message id once (its first committed
        record). Damaged lines are skipped, counted in a `journal_damaged` event.

        `max_chars`: a message whose text is longer comes as a copy holding the first
        `max_chars` characters, its record's `clipped` the number left out. A huge text is
        then never built whole (for showing a record within a budget: recall does)."""
        path = self.path_for(agent_id)
        if max_chars is not None:
            integer(max_chars, "max_chars", minimum=0)
        scan = await trio.to_thread.run_sync(self._scan_sync, path, max_chars)
        if scan.damaged:
            self._emit(JOURNAL_DAMAGED, agent_id, path=str(path), damaged=len(scan.damaged), torn=scan.torn)
        return scan.records

    def _scan_sync(self, path: Path, max_chars: int | None = None) -> _Scan:
        return _scan(self._read_sync(path), path, max_chars=max_chars)

    @staticmethod
    def _read_sync(path: Path) -> bytes:
        try:
            fd = os.open(path, _READ_FLAGS)
        except FileNotFoundError:
            return b""
        except OSError as exc:
            raise _offload_error(path, exc, "open") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            with open(fd, "rb", closefd=False) as f:
                return f.read()
        except OSError as exc:
            raise _offload_error(path, exc, "read") from exc
        finally:
            os.close(fd)

    async def read(self, agent_id: str) -> list[Message]:
        """Every committed offloaded message, in order, once."""
        return [r.message for r in await self.records(agent_id)]

    async def read_range(
        self, agent_id: str, first_seq: int, last_seq: int, *, max_chars: int | None = None
    ) -> list[JournalRecord]:
        """The committed records with `first_seq <= seq <= last_seq` (`max_chars`: as `records`).
        Answered from the index: only those records' lines are read."""
        if max_chars is not None:
            integer(max_chars, "max_chars", minimum=0)
        first = max(-(2**62), min(2**62, integer(first_seq, "first_seq", minimum=None)))  # SQLite's range
        last = max(-(2**62), min(2**62, integer(last_seq, "last_seq", minimum=None)))
        found = await self._from_index(agent_id, lambda conn: _index.span_range(conn, first, last), max_chars)
        if found is not None:
            return found
        return [r for r in await self.records(agent_id, max_chars=max_chars) if first <= r.seq <= last]

    async def last_records(self, agent_id: str, n: int, *, max_chars: int | None = None) -> list[JournalRecord]:
        """The last `n` committed records, in seq order (`max_chars`: as `records`); answered from
        the index: only their lines are read."""
        integer(n, "n", minimum=0)
        if max_chars is not None:
            integer(max_chars, "max_chars", minimum=0)
        most = min(n, 2**62)  # (SQLite's range: more is all)
        found = await self._from_index(agent_id, lambda conn: _index.span_last(conn, most), max_chars)
        if found is not None:
            return found
        records = await self.records(agent_id, max_chars=max_chars)
        return records[max(0, len(records) - n) :] if n else []

    async def extent(self, agent_id: str) -> JournalExtent:
        """How many committed records the journal holds, their first and last numbers and the
        compactions they came from, from the index (no record is read)."""
        path = self.path_for(agent_id)
        events: list[tuple[str, dict[str, Any]]] = []
        try:
            got = await trio.to_thread.run_sync(self._indexed_sync, path, _index.extent, events)
        finally:
            self._index_events(agent_id, path, events)
        if got is None:
            records = await self.records(agent_id)
            compactions = (await self.verify(agent_id)).compactions if records else 0
            return JournalExtent(len(records), *(_ends(records)), compactions)
        count, first, last, compactions, _ = got
        return JournalExtent(count, first, last, compactions)

    async def check_index(self, agent_id: str) -> IndexReport:
        """Check the journal's index against a whole read of the journal: SQLite's own checks of
        the file and its full-text table, and the visible records and compactions counted both
        ways. An index found wrong is rebuilt (with a `journal_index_rebuilt` event). Counts
        that differ because the journal grew between the read and the index's catch-up (an
        append meanwhile) are compared again, after a new read (`_CHECK_TRIES` reads at most)."""
        path = self.path_for(agent_id)
        events: list[tuple[str, dict[str, Any]]] = []
        try:
            for tries_left in reversed(range(_CHECK_TRIES)):
                report = await self.verify(agent_id)
                checked = await trio.to_thread.run_sync(self._check_index_sync, path, report, events, tries_left > 0)
                if checked is not None:
                    return checked
            raise AssertionError("unreachable: the last try returns a report")
        finally:
            self._index_events(agent_id, path, events)

    def _check_index_sync(
        self, path: Path, report: JournalReport, events: list[Any], again_if_grown: bool = False
    ) -> IndexReport | None:
        """The index checked against `report` (a whole read of the journal). None, with
        `again_if_grown`, when the counts differ only because the journal grew since the read:
        the caller reads it again (the index caught up to the newer end)."""
        where = _index.index_path(path)
        if not self.index:
            return IndexReport(where, True, (), 0, False, "the index is turned off (OffloadStore(index=False))")
        before = len(events)
        got = self._indexed_sync(
            path, lambda conn: (_index.check(conn), _index.extent(conn), _index.lines(conn)), events
        )
        if got is None:
            why = "the index cannot be used here; searches read the whole journal"
            return IndexReport(where, True, (), 0, False, why)
        problems, (count, _, _, compactions, _), lines = got
        problems = list(problems)
        # every record line, hidden ones too: a line damaged in place after it was indexed (a
        # record of a batch not committed yet) is shown by the index once its batch commits
        read = report.records + report.uncommitted + report.duplicates
        if (count, compactions, lines) != (report.records, report.compactions, read):
            if again_if_grown and _size(path) != report.size:  # appended to meanwhile: not the index's fault
                return None
            problems.append(
                f"the index counts {count} records from {compactions} compaction(s) of {lines} record lines, "
                f"the journal {report.records} from {report.compactions} of {read}"
            )
        rebuilt = any(kind == "rebuild" for kind, _ in events[before:])  # (not a damaged line's event)
        if problems:
            self._index_conns.close(path)
            _index.remove(path)
            events.append(("rebuild", {"reason": "; ".join(problems)}))
            got = self._indexed_sync(path, _index.extent, events)
            rebuilt = True
            count = got[0] if got is not None else 0
        return IndexReport(where, not problems, tuple(problems), count, rebuilt)

    # -- the index ----------------------------------------------------------------------------
    def _index_soon(self, agent_id: str, path: Path) -> None:
        if not self.index:
            return
        try:
            token: trio.lowlevel.TrioToken | None = trio.lowlevel.current_trio_token()
        except RuntimeError:
            token = None
        if len(self._tokens) >= _JOURNALS_KEPT * 16:  # bounded: a forgotten one only misses a rebuild's event
            self._tokens.clear()
        self._tokens[path] = (agent_id, token)
        self._indexer.poke(path)

    def _index_in_background(self, path: Path, stopped: Callable[[], bool]) -> None:
        """The background thread's work: bring the index up to the journal's end (no lock: the
        journal only grows; a reader catches up the rest under its lock), unless `stopped()`."""
        events: list[tuple[str, dict[str, Any]]] = []
        try:
            fd = os.open(path, _READ_FLAGS)
        except OSError:
            return
        try:
            end = _last_newline(fd, os.fstat(fd).st_size)
            conn = _index.connect(path, events, path in self._index_seen)
            self._saw_index(path)
            try:
                _index.catch_up(conn, fd, path, end, events, stopped)
            finally:
                conn.close()
        finally:
            os.close(fd)
            agent_id, token = self._tokens.get(path, ("", None))
            if events and token is not None:
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(self._index_events, agent_id, path, events)

    def _saw_index(self, path: Path) -> None:
        if len(self._index_seen) >= _JOURNALS_KEPT * 16:  # bounded: a forgotten one is only not reported missing
            self._index_seen.clear()
        self._index_seen.add(path)

    def _index_events(self, agent_id: str, path: Path, events: Sequence[tuple[str, dict[str, Any]]]) -> None:
        for kind, data in events:
            if kind == "rebuild":
                self._emit(JOURNAL_INDEX_REBUILT, agent_id, path=str(_index.index_path(path)), reason=data["reason"])
            else:
                self._emit(kind, agent_id, **data)

    def _indexed_sync(self, path: Path, query: Callable[[Any], Any], events: list[Any], fd_too: bool = False) -> Any:
        """`query(connection)` on the journal's index brought up to the journal's end (most of
        it before the shared lock is taken, the rest under it, while `query` runs); None when
        there is no journal, or the index cannot be used (the caller then scans). An index that
        SQLite finds damaged is removed and built again, once."""
        if not self.index:
            return None
        try:
            return self._indexed_once(path, query, events, fd_too)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError):  # locked, busy, disk full: not the file's fault
                logger.debug("offload: the index of %s cannot be used (%s); reading the journal", path, exc)
                return None
            self._index_conns.close(path)
            _index.remove(path)
            self._index_seen.discard(path)  # reported here, not again as missing
            events.append(("rebuild", {"reason": f"the index was damaged ({exc})"}))
            try:
                return self._indexed_once(path, query, events, fd_too)
            except sqlite3.Error as again:
                logger.debug("offload: the index of %s cannot be used (%s); reading the journal", path, again)
                return None

    def _indexed_once(self, path: Path, query: Callable[[Any], Any], events: list[Any], fd_too: bool) -> Any:
        try:
            fd = os.open(path, _READ_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _offload_error(path, exc, "open") from exc
        try:
            with self._index_conns.use(path, events, path in self._index_seen) as conn:
                self._saw_index(path)
                mark = int(conn.execute("SELECT v FROM meta WHERE k = 'mark'").fetchone()[0])
                end = _last_newline(fd, os.fstat(fd).st_size)
                if end - mark > _index.LOCKED_CATCH_UP:  # most of a long way before the lock, writers go on
                    _index.catch_up(conn, fd, path, end, events)
                fcntl.flock(fd, fcntl.LOCK_SH)
                size = os.fstat(fd).st_size
                end = _last_newline(fd, size)
                _index.catch_up(conn, fd, path, end, events)
                damaged = int(conn.execute("SELECT v FROM meta WHERE k = 'damaged'").fetchone()[0])
                if damaged:
                    events.append((JOURNAL_DAMAGED, {"path": str(path), "damaged": damaged, "torn": size - end}))
                got = query(conn)
                return (got, fd) if fd_too else got
        except IndexUnavailable as exc:
            logger.debug("offload: the index of %s cannot be used (%s); reading the journal", path, exc)
            return None
        except sqlite3.Error:
            if fd_too:
                os.close(fd)
            raise
        except OSError as exc:
            raise _offload_error(path, exc, "read") from exc
        finally:
            if not fd_too:
                os.close(fd)

    def _spans_sync(
        self, path: Path, query: Callable[[Any], list[_index.Span]], max_chars: int | None, events: list[Any]
    ) -> list[JournalRecord] | None:
        got = self._indexed_sync(path, query, events, fd_too=True)
        if got is None:
            return None
        spans, fd = got
        try:
            out = []
            for seq, line in _index.iter_spans(fd, spans):
                record = _decode_record_at(line, f"{path}: record {seq}", max_chars)
                if record is not None:
                    out.append(record)
            _index.counted("records", len(spans))
            return out
        except OSError as exc:
            raise _offload_error(path, exc, "read") from exc
        finally:
            os.close(fd)

    async def _from_index(
        self, agent_id: str, query: Callable[[Any], list[_index.Span]], max_chars: int | None
    ) -> list[JournalRecord] | None:
        path = self.path_for(agent_id)
        if not self.index:
            return None
        events: list[tuple[str, dict[str, Any]]] = []
        try:
            found: list[JournalRecord] | None = await trio.to_thread.run_sync(
                self._spans_sync, path, query, max_chars, events, abandon_on_cancel=True
            )
        finally:
            self._index_events(agent_id, path, events)
        if found is None and not path.exists():
            return []
        return found

    async def search(
        self, agent_id: str, query: str, limit: int = 10, *, max_chars: int | None = None
    ) -> list[JournalRecord]:
        """Visible records holding words of `query` (case-insensitive; an identifier with
        `/ . _ -` counts whole and by its parts), best first by BM25: rare words outweigh common
        ones, the query's words in a row rank first, a summary's score counts half, ties go to the
        lower number; at most `limit`. The index answers it (`docs/search.md`); without one (the
        store made with `index=False`, a directory it cannot write, SQLite failing) the journal is
        read in a worker thread and ranked alike (`best_matches`: the same records, in the same
        order; past `SCAN_RANKED_BYTES`, from estimates of two figures, see `_search_sync`). A
        cancel returns at once (the thread, which only reads, finishes on its own). `max_chars`:
        as `records`."""
        path = self.path_for(agent_id)
        integer(limit, "search limit")
        if max_chars is not None:
            integer(max_chars, "max_chars", minimum=0)
        words = query_words(query[:MAX_QUERY_CHARS])
        if not words:
            return []
        text, most = query[:MAX_QUERY_CHARS], min(limit, 2**62)  # (SQLite's range: more is all)
        found = await self._from_index(agent_id, lambda conn: _index.search(conn, text, most), max_chars)
        if found is not None:
            return found
        hits, scan = await trio.to_thread.run_sync(
            self._search_sync, path, text, limit, max_chars, abandon_on_cancel=True
        )
        if scan.damaged:
            self._emit(JOURNAL_DAMAGED, agent_id, path=str(path), damaged=len(scan.damaged), torn=scan.torn)
        return hits

    def _search_sync(
        self, path: Path, query: str, limit: int, max_chars: int | None
    ) -> tuple[list[JournalRecord], _Scan]:
        """A search without the index, ranked as the index ranks it (BM25). A journal of up to
        `SCAN_RANKED_BYTES`: every line read, every record's words counted, the same ranking.
        A larger one: only the lines holding a word the query can match are read (as before the
        index), and the two figures that need every record, how many there are and their mean
        length, are estimated (`_estimates`): the same records, ranked alike but for near ties.
        (Every record's words: 2.3 s and 167 MB for a 32 MB journal of 88k records, 29 s and
        1.5 GB for 1M records, where reading the matching lines takes 1-2 s.)"""
        data = self._read_sync(path)
        if len(data) <= SCAN_RANKED_BYTES:
            scan = _scan(data, path)
            return [_clipped(r, max_chars) for r in best_matches(scan.records, query, limit)], scan
        words = sorted(wanted_words(query))
        most = None if max_chars is None else max(max_chars, TEXT_CHARS)  # (what the index reads of each)
        scan = _scan(data, path, _search_spans(data, words), max_chars=most)
        found = best_matches(scan.records, query, limit, _estimates(data))
        return [_clipped(r, max_chars) for r in found], scan


SCAN_RANKED_BYTES = 32 * 1024 * 1024
"""The largest journal a search without the index ranks by BM25 (see `OffloadStore._search_sync`)."""


_SAMPLE = 2_000  # lines `_estimates` decodes at most


def _estimates(data: bytes) -> tuple[int, float]:
    """A journal's records and their mean length in words (as the index counts them), for a
    search without the index: its message lines counted (hidden and repeated records too: a
    few, against thousands), and the mean over `_SAMPLE` of them spread over the file."""
    end = data.rfind(b"\n") + 1
    count = data.count(b'\n{"message":', 0, end) + data.startswith(b'{"message":')
    lengths: list[int] = []
    starts: set[int] = set()
    for k in range(_SAMPLE):
        at = k * end // _SAMPLE
        start = 0 if at == 0 else data.find(b"\n", at, end) + 1  # (0: no newline after `at`)
        if (at and not start) or start >= end or start in starts or not data.startswith(b'{"message":', start):
            continue
        starts.add(start)
        try:
            record = _decode_at(data, start, data.index(b"\n", start), "a sampled line", TEXT_CHARS)[0].record
        except OffloadCorrupted:
            continue
        if record is not None:
            lengths.append(len(tokens(record_text(record.message))))
    return count, (sum(lengths) / len(lengths) if lengths else 1.0)


def _clipped(record: JournalRecord, max_chars: int | None) -> JournalRecord:
    """`record` as a read with `max_chars` gives it (see `JournalRecord.clipped`)."""
    content = record.message.content
    if max_chars is None or not isinstance(content, str) or len(content) <= max_chars:
        return record
    message = record.message.evolve(content=content[:max_chars])
    return attrs.evolve(record, message=message, clipped=len(content) - max_chars)


def _decode_record_at(line: bytes, where: str, max_chars: int | None) -> JournalRecord | None:
    try:
        return _decode_at(line, 0, len(line), where, max_chars)[0].record
    except OffloadCorrupted:
        return None  # the index named a line the journal no longer holds as it was: skipped


def _ends(records: Sequence[JournalRecord]) -> tuple[int, int]:
    return (records[0].seq, records[-1].seq) if records else (0, 0)


def _inode(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _report(path: Path, scan: _Scan) -> JournalReport:
    return JournalReport(
        path=path,
        journal=scan.journal,
        records=len(scan.records),
        compactions=scan.compactions,
        uncommitted=scan.uncommitted,
        duplicates=scan.duplicates,
        damaged=scan.damaged,
        torn=scan.torn,
        size=scan.size,
    )


__all__ = [
    "ATTEMPTS_KEY",
    "JOURNAL_KEY",
    "AppendResult",
    "Damage",
    "IndexReport",
    "JournalExtent",
    "JournalRecord",
    "JournalRef",
    "JournalReport",
    "OffloadStore",
    "md_code",
    "md_fenced",
    "new_attempt_id",
    "new_journal_id",
]
