"""The file store's journal lines: decoding them (`_decode_at`, the checksums, the recovery of a
damaged newline), and the scan of a journal file (`_scan`, `_search_spans`, `_find_head`). Moved
out of `journal.py`; the format and the protocol: docs/journal.md."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson

from ...errors import InvalidMessage, OffloadCorrupted
from ...message import Message
from .. import bigjson as _bigjson
from ..records import (
    ATTEMPTS_KEY,
    JournalRecord,
)
from ..search import count_call_words
from .codec import _HEAD
from .tail import _pread_exact

_SUFFIX_LEN = 18  # len(',"crc":"xxxxxxxx"}')
_SUFFIX = re.compile(rb',"crc":"([0-9a-f]{8})"\}')
_HEADS = (_HEAD, b'{"journal":', b'{"commit":')
_ID_HEAD = b'{"message":{"id":"'  # how a message line starts (cmdc writes the id first)
_ID = re.compile(r"[jk][0-9a-f]{16}")
MAX_SEQ = 2**62
"""The highest record number a line may hold (within SQLite's integers: the index keys records by
it; `read_range` takes numbers up to it). A line numbered past it is damaged, and no writer
numbers one so."""
_LEGACY_KEYS = frozenset({"seq", "compaction", "ts", "message", "crc"})
_MESSAGE_KEYS = _LEGACY_KEYS | {"attempt", "journal"}
_JOURNAL_KEYS = frozenset({"journal", "follows", "agent", "seq", "ts", "crc"})
_COMMIT_KEYS = frozenset({"commit", "journal", "seq", "ts", "crc"})


@attrs.frozen
class Damage:
    """A damaged line: its number (1-based), byte offset and length, and what is wrong."""

    line: int
    offset: int
    length: int
    reason: str


@attrs.frozen
class _Line:
    kind: str  # "message" | "journal" | "commit"
    seq: int
    journal: str | None
    record: JournalRecord | None = None
    follows: str | None = None
    attempts: tuple[str, ...] = ()


Known = tuple[int, int, "str | None", int]  # a remembered record: seq, crc, attempt, compaction


# -- decoding ---------------------------------------------------------------------------------


def _valid_id(value: object) -> bool:
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def _decode_line(line: bytes, where: str) -> _Line:
    """Parse one complete line (without its newline); any damage raises `OffloadCorrupted`."""
    return _decode_at(line, 0, len(line), where)[0]


def _check_sum(data: bytes, start: int, end: int, where: str) -> bytes:
    """The head of the line `data[start:end]`, once its checksum is checked."""
    m = _SUFFIX.fullmatch(data, end - _SUFFIX_LEN, end) if end - start > _SUFFIX_LEN else None
    if m is None:
        raise OffloadCorrupted(f"{where}: no checksum at the end of the line")
    head = next((h for h in _HEADS if data.startswith(h, start)), None)
    if head is None or int(m[1], 16) != _bigjson.crc32(data, start + len(head), end - _SUFFIX_LEN):
        raise OffloadCorrupted(f"{where}: checksum mismatch")
    return head


def _decode_at(
    data: bytes, start: int, end: int, where: str, max_chars: int | None = None, words: Sequence[str] | None = None
) -> tuple[_Line, Counter[str] | None]:
    """Parse the complete line `data[start:end]` (without its newline); any damage raises
    `OffloadCorrupted`. With `max_chars`, a message's text comes cut to that many characters
    (the record's `clipped` says how many are left out). A message line past `_bigjson.BIG`
    bytes is read in short steps (its text never in one call); with `words`, the word counts
    of such a message are returned too (its record may hold only the head of its text)."""
    head = _check_sum(data, start, end, where)
    text: str | None = None
    total = 0
    counts: Counter[str] | None = None
    line: bytes | None = None
    if head is _HEAD and end - start > _bigjson.BIG:
        try:
            span = _bigjson.content_span(data, start + len(_HEAD), end)
            if span is not None:
                text, total, counts = _bigjson.read_text(data, span[0], span[1], max_chars, words)
                line = data[start : span[0]] + data[span[1] : end]  # the line with an empty text
        except _bigjson._BadJSON as exc:
            raise OffloadCorrupted(f"{where}: not valid JSON ({exc})") from None
    if line is None:
        line = data if start == 0 and end == len(data) else data[start:end]
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise OffloadCorrupted(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise OffloadCorrupted(f"{where}: not a journal record")
    seq, ts = obj.get("seq"), obj.get("ts")
    if type(seq) is not int or seq < 0 or seq > MAX_SEQ or type(ts) not in (int, float):
        raise OffloadCorrupted(f"{where}: bad seq or timestamp")
    if head is _HEAD:
        keys = set(obj)
        if keys != _LEGACY_KEYS and keys != _MESSAGE_KEYS:
            raise OffloadCorrupted(f"{where}: not a journal record")
        compaction, attempt, journal = obj["compaction"], obj.get("attempt"), obj.get("journal")
        if seq < 1 or type(compaction) is not int or compaction < 0:
            raise OffloadCorrupted(f"{where}: bad seq or compaction number")
        if keys == _MESSAGE_KEYS and not (_valid_id(attempt) and _valid_id(journal)):
            raise OffloadCorrupted(f"{where}: bad attempt or journal id")
        fields = obj["message"]
        if text is not None and isinstance(fields, dict):
            fields["content"] = text
        try:
            message = Message.from_dict(fields)
        except (InvalidMessage, TypeError, ValueError) as exc:
            raise OffloadCorrupted(f"{where}: bad message ({exc})") from None
        if text is None and max_chars is not None and isinstance(message.content, str):
            total = len(message.content)
            if total > max_chars:
                message = message.evolve(content=message.content[:max_chars])
        if counts is not None:
            count_call_words(message, counts)
        clipped = total - len(message.content) if max_chars is not None and isinstance(message.content, str) else 0
        record = JournalRecord(seq, compaction, float(ts), message, attempt, journal, clipped)  # type: ignore[arg-type]
        return _Line("message", seq, journal, record=record), counts
    if head == _HEADS[1]:
        follows = obj.get("follows")
        if set(obj) != _JOURNAL_KEYS or not _valid_id(obj["journal"]) or not isinstance(obj["agent"], str):
            raise OffloadCorrupted(f"{where}: not a journal line")
        if follows is not None and not _valid_id(follows):
            raise OffloadCorrupted(f"{where}: bad journal id it follows")
        return _Line("journal", seq, obj["journal"], follows=follows), None
    attempts = obj.get("commit")
    if (
        set(obj) != _COMMIT_KEYS
        or not _valid_id(obj["journal"])
        or not isinstance(attempts, list)
        or not attempts
        or not all(_valid_id(a) for a in attempts)
    ):
        raise OffloadCorrupted(f"{where}: not a commit line")
    return _Line("commit", seq, obj["journal"], attempts=tuple(attempts)), None


_NEWLINE_FLIPS = bytes(0x0A ^ (1 << k) for k in range(8))  # a newline with one bit flipped
_FUSED = re.compile(rb'"\}[' + re.escape(_NEWLINE_FLIPS) + rb']\{"')  # where such a newline joins two lines


def _fused(
    data: bytes, start: int, end: int, where: str, max_chars: int | None = None, words: Sequence[str] | None = None
) -> list[tuple[int, _Line, Counter[str] | None]]:
    """A damaged line `data[start:end]` that is two whole lines joined where a flipped bit
    changed the newline between them: both lines, decoded, as (start, line, counts); else [].
    Only a damaged line is looked at, and both halves must pass their checksums (a line's
    valid JSON never holds `"}`, a control byte or `*`/`J`, then `{"`)."""
    for cut in _fused_cuts(data, start, end):
        try:
            first = _decode_at(data, start, cut, where, max_chars, words)
            second = _decode_at(data, cut + 1, end, where, max_chars, words)
        except OffloadCorrupted:
            continue
        return [(start, *first), (cut + 1, *second)]
    return []


def _newline_flipped(tail: bytes) -> bool:
    """Whether `tail` (the end of a file, past its last newline) is a whole line whose newline
    a flipped bit changed (a torn write never ends so: after a line's end comes its newline)."""
    if not tail or tail[-1] not in _NEWLINE_FLIPS:
        return False
    try:
        _decode_at(tail, 0, len(tail) - 1, "tail")
    except OffloadCorrupted:
        return False
    return True


def _twin(data: bytes, start: int, end: int, size: int) -> bytes:
    """For the damaged line `data[start:end]` (newline included) of a journal of `size`
    bytes: the intact commit line beside it when the damaged one is its copy (as long, a few
    bits apart: see `_commit_line`), to be written in its place so the commit has two copies
    again; else b"" (the line is dropped)."""
    line = data[start:end]
    before = data.rfind(b"\n", 0, start - 1) + 1 if start else start
    after = data.find(b"\n", end, size) + 1 if end < size else end
    for other in (data[before:start], data[end:after]):
        if len(other) != len(line) or not other.startswith(_HEADS[2]):
            continue
        if (int.from_bytes(other, "big") ^ int.from_bytes(line, "big")).bit_count() > 8:
            continue
        try:
            _decode_line(other[:-1], "twin")
        except OffloadCorrupted:
            continue
        return other
    return b""


def _in_order(parts: Sequence[tuple[int, _Line, Any]], last_seq: int) -> bool:
    """Whether `parts` (from `_fused`) are lines, their records numbered on past `last_seq`."""
    for _, decoded, _ in parts:
        if decoded.kind == "message" and decoded.seq <= last_seq:
            return False
        last_seq = max(last_seq, decoded.seq)
    return bool(parts)


def _fused_cuts(data: bytes, start: int, end: int) -> Iterator[int]:
    """Where, in `data[start:end]`, a damaged newline may join two lines: the offsets of the
    changed byte, searched `_bigjson.PIECE` bytes per call (a huge line is many short calls)."""
    pos = start
    while pos < end:
        stop = min(end, pos + _bigjson.PIECE)
        for m in _FUSED.finditer(data, pos, min(end, stop + 4)):  # a match may run past the piece
            if m.start() < stop:
                yield m.start() + 2
        pos = stop


def _fused_lines(line: bytes, where: str) -> list[_Line]:
    """`_fused` of a line on its own: the two lines, or []."""
    return [decoded for _, decoded, _ in _fused(line, 0, len(line), where)]


def _decode_record(line: bytes, where: str) -> JournalRecord:
    """A message line's record; any other line or any damage raises `OffloadCorrupted`."""
    decoded = _decode_line(line, where)
    if decoded.record is None:
        raise OffloadCorrupted(f"{where}: a {decoded.kind} line, not a message record")
    return decoded.record


def _remember(known: dict[str, Known], committed: set[str], r: JournalRecord, superseded: set[str]) -> None:
    """Reading a journal back from its end: keep, for each message, the record readers show
    (its earliest record of a committed attempt; `committed` holds the attempts of the
    commit lines read so far, which follow their records), else its latest record (the one a
    retry repeats). Never an older record of an attempt nobody committed: a retry would then
    write the message again while reusing its other records, and committing those would show
    the message at a number the retry did not report. Such an attempt goes to `superseded`:
    none of its records is reused, so it is never committed."""
    prior = known.get(r.message.id)
    if prior is None or r.attempt in committed:
        known[r.message.id] = (r.seq, r.message.json_crc(), r.attempt, r.compaction)
    elif r.attempt is not None and r.attempt != prior[2]:
        superseded.add(r.attempt)


def _summary_attempts(message: Message) -> tuple[str, ...]:
    if not message.is_summary:
        return ()
    value = message.metadata.get(ATTEMPTS_KEY)
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(a for a in value if _valid_id(a))


@attrs.frozen
class _Scan:
    records: list[JournalRecord]
    journal: str | None
    compactions: int
    uncommitted: int
    duplicates: int
    damaged: tuple[Damage, ...]
    torn: int
    size: int
    counts: dict[int, Counter[str]] = attrs.field(factory=dict)  # seq -> words of a huge message
    fused: dict[int, int] = attrs.field(factory=dict)  # a line that is two (`_fused`): its offset -> the cut


_ATTEMPTS_BYTES = b'"cmdc.attempts"'
_CONTROL_HEADS = (b'{"journal":', b'{"commit":', _ATTEMPTS_BYTES)  # lines a search always decodes
_CHUNK = 1024 * 1024  # bytes a search filters at a time
_LONG_LINE = 64 * 1024  # a non-ASCII line this long is decoded rather than casefolded whole


def _line_starts(data: bytes, start: int, needle: bytes, out: set[int]) -> None:
    """Add to `out` the start (offset in the journal: `start` + ...) of each line of the
    chunk `data` holding `needle`."""
    i = data.find(needle)
    while i >= 0:
        out.add(start + data.rfind(b"\n", 0, i) + 1)
        nl = data.find(b"\n", i)
        i = data.find(needle, nl + 1) if nl >= 0 else -1


def _search_spans(data: bytes, words: Sequence[str]) -> list[tuple[int, int]]:
    """The complete lines of a journal a search must decode, in order, as (start, end without
    the newline): each line that holds one of `words` (casefolded) as a substring, every
    control line and summary (they decide which attempts are committed), and every line
    longer than a chunk (read in short steps, its words counted as it is read). Filtered a
    chunk at a time with a few C calls each: an ASCII chunk is lowered once and searched; a
    chunk with other text is casefolded line by line."""
    starts: set[int] = set()
    spans: list[tuple[int, int]] = []
    ascii_words = [w.encode() for w in words if w.isascii()]
    end = data.rfind(b"\n") + 1  # a torn last line is not a record
    start = 0
    while start < end:
        stop = data.rfind(b"\n", start, min(end, start + _CHUNK)) + 1
        if stop <= start:  # one line longer than a chunk: decoded in short steps, not filtered
            nl = _bigjson.find(data, b"\n", start, end)
            spans.append((start, nl))
            start = nl + 1
            continue
        chunk = data[start:stop]
        if chunk.isascii():  # bytes.lower() is casefold for ASCII text
            low = chunk.lower()
            for w in ascii_words:
                _line_starts(low, start, w, starts)
        else:
            offset = start
            for line in chunk.split(b"\n")[:-1]:
                if len(line) > _LONG_LINE or any(w in line.decode("utf-8", "replace").casefold() for w in words):
                    starts.add(offset)
                offset += len(line) + 1
        for head in _CONTROL_HEADS:
            _line_starts(chunk, start, head, starts)
        start = stop
    spans += ((i, data.index(b"\n", i)) for i in starts)  # short lines: within their chunk
    spans.sort()
    return spans


def _lines(data: bytes, end: int) -> Iterator[tuple[int, int]]:
    """Every complete line before `end` (just past a newline) as (start, end without the
    newline); a long line's end is found in short steps."""
    offset = 0
    while offset < end:
        nl = _bigjson.find(data, b"\n", offset, end)
        yield offset, nl
        offset = nl + 1


def _scan(
    data: bytes,
    path: Path,
    spans: Sequence[tuple[int, int]] | None = None,
    *,
    max_chars: int | None = None,
    words: Sequence[str] | None = None,
) -> _Scan:
    """Every line of a journal (or the lines `spans` names): the visible records (committed,
    each message id once, at its first committed record, in seq order) and what was skipped.
    `max_chars`: messages' texts cut to that (see `JournalRecord.clipped`); `words`: a huge
    message's word counts are kept (`_Scan.counts`)."""
    lines: list[tuple[int, _Line]] = []
    damaged: list[Damage] = []
    counted: dict[int, Counter[str]] = {}
    last_seq, journal = 0, None
    end = data.rfind(b"\n") + 1
    fused: dict[int, int] = {}
    for number, (offset, nl) in enumerate(_lines(data, end) if spans is None else spans, 1):
        try:
            decoded, counts = _decode_at(data, offset, nl, f"{path}: line {number}", max_chars, words)
            if decoded.kind == "message" and decoded.seq <= last_seq:
                raise OffloadCorrupted(f"seq {decoded.seq} does not follow {last_seq}")
        except OffloadCorrupted as exc:
            parts = _fused(data, offset, nl, f"{path}: line {number}", max_chars, words)
            if not _in_order(parts, last_seq):
                damaged.append(Damage(number, offset, nl + 1 - offset, str(exc).rsplit(": ", 1)[-1]))
                continue
            # two whole lines joined by a damaged newline: both read; a repair puts it back
            fused[offset] = parts[1][0] - 1
            damaged.append(Damage(number, offset, nl + 1 - offset, "two lines joined by a damaged newline"))
            for start, part, part_counts in parts:
                last_seq = max(last_seq, part.seq)
                journal = part.journal or journal
                lines.append((start, part))
                if part_counts is not None:
                    counted[part.seq] = part_counts
        else:
            last_seq = max(last_seq, decoded.seq)
            journal = decoded.journal or journal
            lines.append((offset, decoded))
            if counts is not None:
                counted[decoded.seq] = counts
    # Each attempt's compaction: the first commit line naming it (attempts committed together
    # are one compaction), or, for one a later summary commits, the attempt itself.
    group: dict[str | None, object] = {None: None}
    for n, (_, decoded) in enumerate(lines):
        for a in decoded.attempts:
            group.setdefault(a, n)
    # A committed batch holding a summary commits the attempts it names, and so on, wherever in
    # the journal the summary is: one committed later by a summary before it counts too (a
    # batch written into after its commit), as the index counts it.
    named: dict[str | None, list[str]] = {}
    for _, decoded in lines:
        r = decoded.record
        if r is not None and r.message.is_summary:
            named.setdefault(r.attempt, []).extend(_summary_attempts(r.message))
    todo = [a for a in named if a in group]
    while todo:
        for a in named.get(todo.pop(), ()):
            if a not in group:
                group[a] = a
                todo.append(a)
    committed = group.keys()
    seen: set[str] = set()
    records: list[JournalRecord] = []
    uncommitted = duplicates = 0
    compactions, last_number = 0, 0
    last_batch: object = None
    for _, decoded in lines:
        r = decoded.record
        if r is None:
            continue
        if r.attempt not in committed:
            uncommitted += 1
        elif r.message.id in seen:
            duplicates += 1
        else:
            seen.add(r.message.id)
            records.append(r)
            batch = group[r.attempt] if r.attempt is not None else ("legacy", r.compaction)
            if batch != last_batch:  # caps, masks and clips are batches numbered with the current
                # count: a compaction's batch is the one whose number moves (a new run's too)
                if r.compaction > 0 and r.compaction != last_number:
                    compactions += 1
                last_batch, last_number = batch, r.compaction
    return _Scan(
        records,
        journal,
        compactions,
        uncommitted,
        duplicates,
        tuple(damaged),
        len(data) - end,
        len(data),
        counted,
        fused,
    )


def _find_head(fd: int, end: int, journal: str) -> _Line | None:
    """The link line that starts `journal` (searched back from `end`, a chunk at a time; a
    line starts after a newline, and no newline is ever inside one), or None."""
    needle = b'\n{"journal":"%s"' % journal.encode()
    pos, carry = end, b""
    while pos > 0:
        n = min(_CHUNK, pos)
        pos -= n
        buf = (b"\n" if pos == 0 else b"") + _pread_exact(fd, n, pos) + carry
        base = pos - (1 if pos == 0 else 0)  # the file offset of buf[0]
        i = buf.rfind(needle)
        while i >= 0:
            start = base + i + 1
            line = os.pread(fd, 4096, start).split(b"\n", 1)[0]
            try:
                decoded = _decode_line(line, f"byte {start}")
            except OffloadCorrupted:
                decoded = None
            if decoded is not None and decoded.kind == "journal" and decoded.journal == journal:
                return decoded
            i = buf.rfind(needle, 0, i)
        carry = buf[: len(needle) - 1]
    return None
