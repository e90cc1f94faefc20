"""The offload store: a durable, append-only journal of evicted messages, one file per agent.

`<root>/<agent_id>.jsonl` holds one JSON object per line::

    {"message":{...},"compaction":0,"ts":1718000000.0,"seq":1,"crc":"89abcdef"}

Each line starts with the fixed head `{"message":` (checked literally) and ends with the fixed
suffix `,"crc":"xxxxxxxx"}`; `crc` is the CRC-32 of every byte between them. So a flipped byte
anywhere is detected while the line stays plain JSON, and the checksum of a message's encoding,
computed once when it entered the state, is reused rather than recomputed at offload time.
Bytes after the last newline are a torn record (a crash mid-write): readers skip them and the
next writer truncates them. A complete line that fails its checksum is never guessed at:
it raises `OffloadCorrupted`. `<root>/<agent_id>.md` is a transcript for people, written on
request by `write_transcript` (it is derived from the journal, so it stays off the hot path).
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import attrs
import orjson
import trio

from ._fs import fsync_dir, make_dirs, run_bounded, write_all
from ._search import MAX_QUERY_CHARS, query_words, search_records
from .errors import ConfigError, InvalidMessage, OffloadCorrupted, OffloadError
from .message import Message
from .state import validate_agent_id

_BLOCK = 64 * 1024
_SUFFIX_LEN = 18  # len(',"crc":"xxxxxxxx"}')
_SUFFIX = re.compile(rb',"crc":"([0-9a-f]{8})"\}')
_KEYS = frozenset({"seq", "compaction", "ts", "message", "crc"})
_WORD = re.compile(r"\w+")
_WRITE_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW


@attrs.frozen
class JournalRecord:
    """One line of an offload journal."""

    seq: int
    compaction: int
    timestamp: float
    message: Message


@attrs.frozen
class AppendResult:
    """What an append did: `written` records are new; `first_seq..last_seq` cover the whole
    batch, including messages a retried batch had already written."""

    path: Path
    first_seq: int
    last_seq: int
    written: int


@attrs.define
class _Journal:
    """What a store knows about one agent's journal; guarded by `lock`."""

    lock: trio.Lock = attrs.field(factory=trio.Lock)
    next_seq: int = 0  # 0: unknown until the tail has been read
    identity: tuple[int, int, int] | None = None  # (dev, ino, size) right after our last write
    last_ids: list[str] = attrs.field(factory=list)  # the last batch: message ids ...
    last_seqs: list[int] = attrs.field(factory=list)  # ... and their seqs
    failed: str | None = None
    transcribed: int = 0  # last seq written to the Markdown transcript by this store


def _offload_error(path: Path, exc: OSError, doing: str) -> OffloadError:
    text = os.strerror(exc.errno) if exc.errno else str(exc)
    return OffloadError(f"offload journal {path}: {doing} failed: {text}")


_HEAD = b'{"message":'
_GROUP = 4096  # pieces per write: about 600 KiB of ~400-character messages


def _encode_records(first_seq: int, compaction: int, ts: float, messages: Sequence[bytes]) -> bytes:
    """Journal lines, newlines included, from already encoded messages."""
    const = b',"compaction":%d,"ts":%s,"seq":' % (compaction, orjson.dumps(ts))
    out: list[bytes] = []
    for k, data in enumerate(messages):
        tail = b"%s%d" % (const, first_seq + k)
        out += (_HEAD, data, tail, b',"crc":"%08x"}\n' % zlib.crc32(tail, zlib.crc32(data)))
    return b"".join(out)


def _record_pieces(first_seq: int, compaction: int, ts: float, messages: Sequence[Message]) -> list[bytes]:
    """The pieces of journal lines for `messages`. The message comes first in each line, so its
    cached encoding and checksum are used as they are: nothing is re-encoded or re-hashed."""
    const = b',"compaction":%d,"ts":%s,"seq":%%d' % (compaction, orjson.dumps(ts))
    crc32 = zlib.crc32
    pieces: list[bytes] = []
    add = pieces.extend
    for seq, m in enumerate(messages, first_seq):
        data, crc = m._json, m._json_crc  # cached when the message entered its State
        if data is None or crc is None:
            data, crc = m.to_json(), m.json_crc()
        tail = const % seq
        add((_HEAD, data, tail, b',"crc":"%08x"}\n' % crc32(tail, crc)))
    return pieces


def _write_pieces(fd: int, pieces: list[bytes]) -> int:
    """Write `pieces` in order, joined a few thousand at a time; return the bytes written."""
    total = 0
    for start in range(0, len(pieces), _GROUP):
        data = b"".join(pieces[start : start + _GROUP])
        write_all(fd, data)
        total += len(data)
    return total


def _decode_record(line: bytes, where: str) -> JournalRecord:
    """Parse one complete line (without its newline); any damage raises `OffloadCorrupted`."""
    m = _SUFFIX.fullmatch(line, len(line) - _SUFFIX_LEN) if len(line) > _SUFFIX_LEN else None
    if m is None:
        raise OffloadCorrupted(f"{where}: no checksum at the end of the line")
    if not line.startswith(_HEAD) or int(m[1], 16) != zlib.crc32(line[len(_HEAD) : -_SUFFIX_LEN]):
        raise OffloadCorrupted(f"{where}: checksum mismatch")
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise OffloadCorrupted(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict) or set(obj) != _KEYS:
        raise OffloadCorrupted(f"{where}: not a journal record")
    seq, compaction, ts = obj["seq"], obj["compaction"], obj["ts"]
    if type(seq) is not int or seq < 1 or type(compaction) is not int or compaction < 0:
        raise OffloadCorrupted(f"{where}: bad seq or compaction number")
    if type(ts) not in (int, float):
        raise OffloadCorrupted(f"{where}: bad timestamp")
    try:
        message = Message.from_dict(obj["message"])
    except (InvalidMessage, TypeError, ValueError) as exc:
        raise OffloadCorrupted(f"{where}: bad message ({exc})") from None
    return JournalRecord(seq=seq, compaction=compaction, timestamp=float(ts), message=message)


def _parse_journal(data: bytes, path: Path) -> list[JournalRecord]:
    lines = data.split(b"\n")
    lines.pop()  # b"" after the last newline, or a torn record: skipped
    by_id: dict[str, JournalRecord] = {}
    last = 0
    for number, line in enumerate(lines, 1):
        where = f"{path}: line {number}"
        record = _decode_record(line, where)
        if record.seq <= last:
            raise OffloadCorrupted(f"{where}: seq {record.seq} does not follow {last}")
        last = record.seq
        # A message written again (a compaction retried after a failure, in a new process) is
        # seen once, at its latest record: the one the summary that replaced it names.
        by_id.pop(record.message.id, None)
        by_id[record.message.id] = record
    return list(by_id.values())


def _pread_exact(fd: int, n: int, offset: int) -> bytes:
    data = os.pread(fd, n, offset)
    if len(data) != n:
        raise OSError(errno.EIO, os.strerror(errno.EIO))
    return data


def _read_tail(fd: int, size: int, path: Path) -> tuple[int, int]:
    """Read backwards from `size`, a block at a time, only as far as the last complete line.
    Return (offset just past the last newline, seq of that line); (0, 0) if there is none."""
    chunks: list[bytes] = []
    pos, cut, start = size, -1, 0
    while pos > 0:
        n = min(_BLOCK, pos)
        pos -= n
        chunk = _pread_exact(fd, n, pos)
        chunks.append(chunk)
        hi = n
        if cut < 0:
            i = chunk.rfind(b"\n")
            if i < 0:
                continue
            cut, hi = pos + i + 1, i
        j = chunk.rfind(b"\n", 0, hi)
        if j >= 0:
            start = pos + j + 1
            break
    if cut < 0:
        return 0, 0
    data = b"".join(reversed(chunks))
    line = data[start - pos : cut - 1 - pos]
    return cut, _decode_record(line, f"{path}: last complete line (byte {start})").seq


_BACKTICKS = re.compile(r"`+")


def _longest_backticks(text: str) -> int:
    return max((len(run) for run in _BACKTICKS.findall(text)), default=0)


def md_code(text: str) -> str:
    """`text` as inert inline Markdown code on one line, whatever backticks it holds."""
    text = " ".join(text.split())
    fence = "`" * (_longest_backticks(text) + 1)
    return f"{fence} {text} {fence}" if text else "` `"


def md_fenced(text: str) -> str:
    """`text` in a fenced code block longer than any backtick run inside it: headings, HTML,
    links and fences in it stay inert text."""
    fence = "`" * max(3, _longest_backticks(text) + 1)
    return f"{fence}text\n{text.rstrip(chr(10))}\n{fence}\n"


def _transcript(compaction: int, records: Sequence[tuple[int, Message]]) -> bytes:
    """Markdown for people: only the headings are Markdown; every text that came from a model, a
    tool or a user is fenced or inline code, so nothing in it renders (a `# Title`, `<script>`)."""
    out = [f"## Compaction {compaction} — records {records[0][0]}\N{EN DASH}{records[-1][0]}\n"]
    for seq, msg in records:
        head = f"### {seq} · {msg.role}"
        if msg.tool_call_id is not None:
            head += f" (call {md_code(msg.tool_call_id)}{', error' if msg.is_error else ''})"
        out.append(head + "\n")
        for call in msg.tool_calls:
            args = orjson.dumps(call.to_dict()["arguments"]).decode()
            out.append(f"- tool call {md_code(call.name)} (id {md_code(call.id)}): {md_code(args)}\n")
        if msg.text:
            out.append(md_fenced(msg.text))
    return ("\n".join(out) + "\n").encode()


class OffloadStore:
    """Append-only journals under `root`, one per agent; see the module docstring."""

    def __init__(self, root: str | os.PathLike[str], *, write_timeout: float = 60.0) -> None:
        if isinstance(write_timeout, bool) or not isinstance(write_timeout, (int, float)) or not write_timeout > 0:
            raise ConfigError(f"write_timeout must be a positive number of seconds, got {write_timeout!r}")
        self.root = Path(root)
        self.write_timeout = float(write_timeout)
        self._journals: dict[str, _Journal] = {}

    def __repr__(self) -> str:
        return f"OffloadStore({str(self.root)!r})"

    def path_for(self, agent_id: str) -> Path:
        """The journal's path; raises `ConfigError` for an unsafe agent id."""
        return self.root / f"{validate_agent_id(agent_id)}.jsonl"

    # -- writing ----------------------------------------------------------------------------
    async def append(self, agent_id: str, messages: Sequence[Message], *, compaction: int = 0) -> AppendResult:
        """Append `messages` durably (fsync'd before this returns). Messages of the previous
        batch that are repeated (a retried compaction) are not written again."""
        path = self.path_for(agent_id)
        if type(compaction) is not int or compaction < 0:
            raise ConfigError(f"compaction must be a non-negative integer, got {compaction!r}")
        batch = tuple(messages)
        for i, msg in enumerate(batch):
            if not isinstance(msg, Message):
                raise InvalidMessage(f"messages[{i}] is a {type(msg).__name__}, not a Message")
        journal = self._journals.setdefault(agent_id, _Journal())
        async with journal.lock:
            if journal.failed is not None:
                raise OffloadError(journal.failed)
            # A cancelled caller waits for the write to finish, but not past write_timeout.
            try:
                return await run_bounded(self._append_sync, journal, path, batch, compaction, limit=self.write_timeout)
            except trio.TooSlowError:
                journal.failed = (
                    f"offload journal {path}: an append did not finish within {self.write_timeout} s "
                    "(the disk stalls); later appends are refused"
                )
                raise OffloadError(journal.failed) from None

    def _append_sync(self, journal: _Journal, path: Path, batch: tuple[Message, ...], compaction: int) -> AppendResult:
        if not batch:
            first = journal.next_seq or self._peek_next_seq(path)
            return AppendResult(path=path, first_seq=first, last_seq=first - 1, written=0)
        ids = [m.id for m in batch]
        if len(set(ids)) != len(ids):  # a message repeated within the batch: written once
            unique = dict(zip(ids, batch, strict=True))
            ids, batch = list(unique), tuple(unique.values())
        last_ids, last_seqs = journal.last_ids, journal.last_seqs
        known: dict[str, int] = {}
        if last_ids and ids[: len(last_ids)] == last_ids:
            # A retried batch (perhaps grown): what the last one wrote is not written again.
            fresh = batch[len(last_ids) :]
        elif last_ids and not set(last_ids).isdisjoint(ids):
            known = dict(zip(last_ids, last_seqs, strict=True))
            fresh = tuple(m for m in batch if m.id not in known)
        else:
            fresh, last_seqs = batch, []
        first = self._write_batch(journal, path, fresh, compaction) if fresh else 0
        if known:
            new = dict(zip([m.id for m in fresh], range(first, first + len(fresh)), strict=True))
            seqs = [known[i] if i in known else new[i] for i in ids]
        else:  # ids == the reused prefix + the fresh messages
            seqs = [*last_seqs, *range(first, first + len(fresh))]
        journal.last_ids, journal.last_seqs = ids, seqs
        return AppendResult(path=path, first_seq=min(seqs), last_seq=max(seqs), written=len(fresh))

    def _peek_next_seq(self, path: Path) -> int:
        try:
            fd = os.open(path, _READ_FLAGS)
        except FileNotFoundError:
            return 1
        except OSError as exc:
            raise _offload_error(path, exc, "open") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            return _read_tail(fd, os.fstat(fd).st_size, path)[1] + 1
        except OSError as exc:
            raise _offload_error(path, exc, "read") from exc
        finally:
            os.close(fd)

    def _open_for_append(self, path: Path) -> int:
        try:
            return os.open(path, _WRITE_FLAGS, 0o600)
        except FileNotFoundError:
            make_dirs(path.parent)
            return os.open(path, _WRITE_FLAGS, 0o600)

    def _write_batch(self, journal: _Journal, path: Path, fresh: Sequence[Message], compaction: int) -> int:
        """Write `fresh` as seq next.., fsync, and return the first seq (under both locks)."""
        doing = "open"
        try:
            fd = self._open_for_append(path)
        except OSError as exc:
            raise _offload_error(path, exc, doing) from exc
        try:
            doing = "lock"
            fcntl.flock(fd, fcntl.LOCK_EX)
            doing = "recovery"
            st = os.fstat(fd)
            size = st.st_size
            new_file = journal.identity is None or journal.identity[:2] != (st.st_dev, st.st_ino)
            if journal.identity != (st.st_dev, st.st_ino, size):
                # First append of this store, or someone else wrote: read the tail (O(1)).
                if size == 0:
                    os.fchmod(fd, 0o600)
                rfd = os.open(path, _READ_FLAGS)
                try:
                    cut, last_seq = _read_tail(rfd, size, path)
                finally:
                    os.close(rfd)
                if cut < size:  # a torn last record
                    os.ftruncate(fd, cut)
                    size = cut
                journal.next_seq = last_seq + 1
                journal.identity = (st.st_dev, st.st_ino, size)
            first = journal.next_seq
            ts = time.time()
            pieces = _record_pieces(first, compaction, ts, fresh)
            doing = "write"
            try:
                written = _write_pieces(fd, pieces)
            except OSError:
                try:
                    os.ftruncate(fd, size)
                except OSError as exc2:
                    journal.failed = f"{_offload_error(path, exc2, 'truncate after a failed write')}"
                raise
            doing = "fsync"
            try:
                os.fsync(fd)
                # The journal is an archive, rarely read: let its pages go back to the system.
                os.posix_fadvise(fd, size, written, os.POSIX_FADV_DONTNEED)
                if new_file:
                    fsync_dir(path.parent)
            except OSError as exc:
                journal.failed = f"{_offload_error(path, exc, 'fsync')}; later appends are refused"
                raise
            journal.next_seq = first + len(fresh)
            journal.identity = (st.st_dev, st.st_ino, size + written)
            return first
        except OSError as exc:
            raise _offload_error(path, exc, doing) from exc
        finally:
            os.close(fd)

    async def write_transcript(self, agent_id: str) -> Path:
        """Bring the Markdown transcript `<agent_id>.md` beside the journal up to date and
        return its path. It is for people and for a model's file tools; the journal stays the
        source of truth. Kept off the compaction path: call it when a transcript is wanted.
        The first call of a store rewrites the file (atomically); later calls only append."""
        path = self.path_for(agent_id)
        journal = self._journals.setdefault(agent_id, _Journal())
        records = await self.records(agent_id)
        async with journal.lock:
            return await trio.to_thread.run_sync(self._write_transcript_sync, journal, path, records)

    def _write_transcript_sync(self, journal: _Journal, path: Path, records: list[JournalRecord]) -> Path:
        md = path.with_suffix(".md")
        fresh = [r for r in records if r.seq > journal.transcribed]
        batches: list[list[JournalRecord]] = []
        for r in fresh:
            if not batches or batches[-1][-1].compaction != r.compaction:
                batches.append([])
            batches[-1].append(r)
        data = b"".join(_transcript(b[0].compaction, [(r.seq, r.message) for r in b]) for b in batches)
        try:
            if journal.transcribed == 0:
                tmp = md.with_name(f".{md.name}.tmp")
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
                try:
                    os.fchmod(fd, 0o600)
                    write_all(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, md)
            elif data:
                fd = os.open(md, _WRITE_FLAGS, 0o600)
                try:
                    write_all(fd, data)
                finally:
                    os.close(fd)
        except OSError as exc:
            raise _offload_error(md, exc, "transcript write") from exc
        if records:
            journal.transcribed = records[-1].seq
        return md

    # -- reading ----------------------------------------------------------------------------
    async def records(self, agent_id: str) -> list[JournalRecord]:
        """Every record in seq order, each message id once (its latest record)."""
        path = self.path_for(agent_id)
        return await trio.to_thread.run_sync(self._records_sync, path)

    def _records_sync(self, path: Path) -> list[JournalRecord]:
        try:
            fd = os.open(path, _READ_FLAGS)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _offload_error(path, exc, "open") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            with open(fd, "rb", closefd=False) as f:
                data = f.read()
        except OSError as exc:
            raise _offload_error(path, exc, "read") from exc
        finally:
            os.close(fd)
        return _parse_journal(data, path)

    async def read(self, agent_id: str) -> list[Message]:
        """Every offloaded message, in order, once."""
        return [r.message for r in await self.records(agent_id)]

    async def read_range(self, agent_id: str, first_seq: int, last_seq: int) -> list[JournalRecord]:
        """The records with `first_seq <= seq <= last_seq`."""
        return [r for r in await self.records(agent_id) if first_seq <= r.seq <= last_seq]

    async def search(self, agent_id: str, query: str, limit: int = 10) -> list[JournalRecord]:
        """Records matching words of `query` (case-insensitive), best first: most distinct
        query words present, then most occurrences, then lowest seq. Scored in a worker thread,
        in small bites (`cmdc._search`); the query counts up to its first 64 distinct words."""
        self.path_for(agent_id)
        if type(limit) is not int or limit < 1:
            raise ConfigError(f"search limit must be an integer >= 1, got {limit!r}")
        if not query_words(query[:MAX_QUERY_CHARS]):
            return []
        return await search_records(await self.records(agent_id), query, limit)


__all__ = ["AppendResult", "JournalRecord", "OffloadStore"]
