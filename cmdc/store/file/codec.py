"""The file store's line encoder: a batch of messages as journal lines (the format: docs/journal.md),
built a few hundred at a time from templates, their CRC-32 suffixes computed from the messages'
cached checksums, and written in joined chunks of bounded size."""

from __future__ import annotations

import contextlib
import functools
import os
import struct
import sys
import zlib
from array import array
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import orjson

from ...message import Message
from ..fs import JOIN_MAX, joined, write_all, writev_all

_HEAD = b'{"message":'
_CRC_KEY = b',"crc":"'
_LINE_END = b'"}\n' + _HEAD  # a message line's end, and the head of the next one
_LINE_PIECES = 2  # pieces a message line is built of (see `_record_lines`)
_LINES_AT_ONCE = 512  # records an append builds the lines of at a time (~300 kB: they stay in the caches)
_PARTS_PER_WRITE = 4  # parts of `_LINES_AT_ONCE` lines (joined, ~300 kB each) written by one writev
_JOIN = 400  # pieces joined per write (~120 kB): a small buffer malloc reuses (a megabyte is mapped
# and unmapped each time, page faults included: the whole write took ~1.5x as long)


def _encode_records(first_seq: int, compaction: int, ts: float, messages: Sequence[bytes]) -> bytes:
    """Journal lines in the older format (no attempt: committed as written), from encoded
    messages. Kept to write and test journals of that format."""
    const = b',"compaction":%d,"ts":%s,"seq":' % (compaction, orjson.dumps(ts))
    out: list[bytes] = []
    for k, data in enumerate(messages):
        tail = b"%s%d" % (const, first_seq + k)
        out += (_HEAD, data, tail, b',"crc":"%08x"}\n' % zlib.crc32(tail, zlib.crc32(data)))
    return b"".join(out)


def _record_lines(
    first_seq: int, compaction: int, ts: float, messages: Sequence[Message], attempt: str, journal: str
) -> tuple[list[bytes], array[int], int]:
    """The journal lines of `messages` in pieces (`_LINE_PIECES` a line after the first: the
    message's JSON, then the rest of the line with the head of the next one), each message's
    JSON checksum, and the size of the longest JSON (the other pieces are short). The message
    comes first in each line, so its cached encoding and checksum are used as they are:
    nothing is re-encoded or re-hashed. No Python step per record: the rest of every line is
    one fixed-width template repeated (record numbers of one width), its numbers and checksum
    digits put in by a few strided slice assignments, and it is cut into lines by one
    `struct.unpack`."""
    if not messages:
        return [], array("I"), 0
    last_seq = first_seq + len(messages) - 1
    width = len(str(first_seq))
    if len(str(last_seq)) != width:  # numbers of two widths: each part on its own, then joined
        cut = 10**width - first_seq
        one, crcs, longest = _record_lines(first_seq, compaction, ts, messages[:cut], attempt, journal)
        two, more, longer = _record_lines(10**width, compaction, ts, messages[cut:], attempt, journal)
        one[-1] += _HEAD
        crcs.extend(more)
        return one + two[1:], crcs, max(longest, longer)
    cached: list[Any] = list(map(_CACHED_CRC, messages))  # cached when the message entered its State
    data: list[bytes] = list(map(_CACHED_JSON, messages))  # cached with the checksum
    try:
        crcs = array("I", cached)
        if None in data:
            raise TypeError
    except TypeError:  # messages never encoded (or with no checksum): encoded now, nothing kept on them
        data = list(map(_ENCODE, messages))  # (a C loop over the method: no Python step of ours per record)
        cached = list(map(zlib.crc32, data))
        crcs = array("I", cached)
    n = len(messages)
    if n < _TABLES_FROM:  # a few records: a call or two each costs less than the tables' fixed cost
        return _few_record_lines(first_seq, compaction, ts, attempt, journal, data, cached, crcs)
    before = b',"compaction":%d,"ts":%s,"seq":' % (compaction, orjson.dumps(ts))
    after = b',"attempt":"%s","journal":"%s"' % (attempt.encode(), journal.encode())
    pieces: list[bytes] = [_HEAD] * (_LINE_PIECES * n + 1)
    pieces[1::_LINE_PIECES] = data
    summed = len(before) + width + len(after)  # the checksummed bytes after the message's JSON
    rest = bytearray((before + b"0" * width + after + _CRC_KEY + b"0" * 8 + _LINE_END) * n)
    step = len(rest) // n
    for k in range(width):  # the k-th digit of every record number
        rest[len(before) + k :: step] = _digit_column(first_seq, n, 10 ** (width - 1 - k))
    digits = _line_sums(crcs, rest, len(before), width, summed, step).hex().encode()
    at = summed + len(_CRC_KEY)
    for k in range(8):
        rest[at + k :: step] = digits[k::8]
    pieces[2::_LINE_PIECES] = _cutter(f"{step}s", n).unpack(rest)
    pieces[-1] = pieces[-1][: -len(_HEAD)]
    return pieces, crcs, max(map(len, data))


def _few_record_lines(
    first_seq: int,
    compaction: int,
    ts: float,
    attempt: str,
    journal: str,
    data: list[bytes],
    cached: list[int],
    crcs: array[int],
) -> tuple[list[bytes], array[int], int]:
    """`_record_lines` of a few records (`data`: their messages' JSON; `cached`, `crcs`: its checksums), in five
    pieces a line (the JSON, the tail, the checksum's key, its digits, the line's end with the
    next head), one formatting and one CRC call per record: the same bytes."""
    n = len(data)
    const = b',"compaction":%d,"ts":%s,"seq":%%d,"attempt":"%s","journal":"%s"' % (
        compaction,
        orjson.dumps(ts),
        attempt.encode(),
        journal.encode(),
    )
    tails = list(map(const.__mod__, range(first_seq, first_seq + n)))
    sums = array("I", map(zlib.crc32, tails, cached))  # each line's: its JSON's, carried on over the tail
    if sys.byteorder == "little":
        sums.byteswap()  # big-endian bytes: their hex is the checksum's digits
    digits = struct.unpack("8s" * n, sums.tobytes().hex().encode())
    pieces = [_CRC_KEY] * (5 * n + 1)
    pieces[0] = _HEAD
    pieces[1::5] = data
    pieces[2::5] = tails
    pieces[4::5] = digits
    pieces[5::5] = [_LINE_END] * n
    pieces[-1] = _LINE_END[: -len(_HEAD)]
    return pieces, crcs, max(map(len, data))


_MASK = 0xFFFFFFFF


def _raw(data: bytes, register: int) -> int:
    """The CRC-32 register after `data`, from `register`, without zlib's inversions: linear in
    the register and in the data (over GF(2)), which `_line_sums` relies on."""
    return ~zlib.crc32(data, ~register & _MASK) & _MASK


@functools.lru_cache(maxsize=64)
def _sum_tables(length: int, digit_at: int, width: int) -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """For tails of `length` bytes with a `width`-digit number at `digit_at`: `bytes.translate`
    tables giving, byte by byte, what each byte of the register carried in (4 lanes), and
    what each digit (`width` lanes, relative to "0"), add to the register after the tail.
    Table `4 * lane + k` gives byte `k` of the 32-bit contribution."""
    zeros = bytes(length)
    carried = [[_raw(zeros, v << 8 * lane) for v in range(256)] for lane in range(4)]
    digits = []
    for k in range(width):
        column = [0] * 256
        for v in range(48, 58):
            column[v] = _raw(bytes(digit_at + k) + bytes((v ^ 48,)) + bytes(length - digit_at - k - 1), 0)
        digits.append(column)

    def tables(lanes: list[list[int]]) -> tuple[bytes, ...]:
        return tuple(bytes(c >> 8 * k & 0xFF for c in lane) for lane in lanes for k in range(4))

    return tables(carried), tables(digits)


def _line_sums(crcs: array[int], rest: bytearray, digit_at: int, width: int, summed: int, step: int) -> bytes:
    """The checksum of each line, as big-endian bytes: the CRC-32 carried on from each
    message's checksum (`crcs`) over its tail (the first `summed` bytes of each `step` of
    `rest`, all alike but for a `width`-digit number at `digit_at`). CRC-32 is affine in its
    register and its data, so every line's is that of a tail numbered 0...0, changed by what
    differs (the register carried in, the digits), each a byte-wise table lookup over the batch
    (`bytes.translate`), summed by XOR-ing the batch's bytes as one big integer: a few C calls
    whatever the batch's size, where a `zlib.crc32` call per line cost ~0.2 µs a record."""
    n = len(crcs)
    carried, digit_tables = _sum_tables(summed, digit_at, width)
    register = crcs.tobytes() if sys.byteorder == "little" else _swapped(crcs)
    zeroed = rest[:digit_at] + b"0" * width + rest[digit_at + width : summed]  # a tail numbered 0...0
    base = _raw(bytes(summed), _MASK) ^ _raw(bytes(zeroed), 0) ^ _MASK  # zlib's inversions, and the tail
    columns = [rest[digit_at + k :: step] for k in range(width)]
    out = bytearray(4 * n)
    for k in range(4):  # byte k of every line's checksum
        total = int.from_bytes(bytes(((base >> 8 * k) & 0xFF,)) * n, "little")
        for lane in range(4):
            total ^= int.from_bytes(register[lane::4].translate(carried[4 * lane + k]), "little")
        for d, column in enumerate(columns):
            total ^= int.from_bytes(column.translate(digit_tables[4 * d + k]), "little")
        out[3 - k :: 4] = total.to_bytes(n, "little")
    return bytes(out)


def _swapped(values: array[int]) -> bytes:
    copy = array("I", values)
    copy.byteswap()
    return copy.tobytes()


def _digit_column(first: int, n: int, place: int) -> bytes:
    """The digit at `place` (1, 10, 100, ...) of the numbers `first` .. `first + n - 1`, one
    ASCII byte each: consecutive numbers' digits run in steps of `place` equal digits, so the
    column is a slice of a repeated pattern of the ten digits (a few calls, whatever `n`)."""
    offset = first % place  # how far into its run of equal digits `first` is
    digit = first // place % 10
    if place >= n:  # at most two runs
        head = min(n, place - offset)
        return bytes((48 + digit,)) * head + bytes((48 + (digit + 1) % 10,)) * (n - head)
    cycle = b"".join(bytes((48 + d,)) * place for d in range(10))
    start = digit * place + offset
    return (cycle * ((start + n) // len(cycle) + 1))[start : start + n]


@functools.lru_cache(maxsize=64)
def _cutter(fields: str, n: int) -> struct.Struct:
    """A `struct.Struct` of `fields` repeated `n` times (compiled once per shape)."""
    return struct.Struct(fields * n)


_CACHED_CRC = attrgetter("_json_crc")
_TABLES_FROM = 128  # records from which `_record_lines` fills a template (below: `_few_record_lines`)
_CACHED_JSON = attrgetter("_json")
_ENCODE = Message.encode_json


def _write_records(
    fd: int, first_seq: int, compaction: int, ts: float, messages: Sequence[Message], attempt: str, journal: str
) -> tuple[array[int], bytes, int]:
    """Write the journal lines of `messages` to `fd`, `_LINES_AT_ONCE` records built at a time,
    each such part joined into one buffer, `_PARTS_PER_WRITE` buffers per `writev` (the memory
    in use stays small and is reused: a whole batch at once is tens of fresh megabytes), the
    disk's writeback of what is written started as it goes (`_write_back`); return each
    record's message checksum, the last line (empty without messages) and the bytes written.
    Joined, not handed to the kernel piece by piece: it copies a few buffers of ~300 kB in a
    fraction of the time it takes over a thousand small ones (measured, CPU time of the encoding
    and writes: 10k records ~6.5 -> ~5.4 ms, 50k ~35 -> ~29 ms)."""
    crcs: array[int] = array("I")
    pieces: list[bytes] = []
    parts: list[bytes] = []  # joined parts not written yet
    written = 0
    base = os.lseek(fd, 0, os.SEEK_END) if len(messages) > _LINES_AT_ONCE * _PARTS_PER_WRITE else 0

    def flush() -> None:
        nonlocal written, parts
        written += writev_all(fd, parts)
        parts = []

    for start in range(0, len(messages), _LINES_AT_ONCE):
        part = messages[start : start + _LINES_AT_ONCE]  # (a message not encoded yet is encoded here, not kept)
        pieces, checksums, longest = _record_lines(first_seq + start, compaction, ts, part, attempt, journal)
        crcs.extend(checksums)
        if longest <= JOIN_MAX:  # (the common case) one buffer, written with the next ones
            parts.append(b"".join(pieces))
            if len(parts) >= _PARTS_PER_WRITE:
                flush()
                if start + _LINES_AT_ONCE < len(messages):  # (the last line's pages stay: the next change reads it)
                    _write_back(fd, base, written)
            continue
        flush()
        for chunk in joined(pieces, _JOIN, longest):  # a huge piece on its own
            write_all(fd, chunk)
            written += len(chunk)
    flush()
    start = len(pieces) - 1  # the last line's pieces: those after the last one ending with a head
    while start > 0 and not pieces[start - 1].endswith(_HEAD):
        start -= 1
    return crcs, (_HEAD + b"".join(pieces[start:]) if pieces else b""), written


def _write_back(fd: int, base: int, written: int) -> None:
    """Start the disk's writeback of the whole pages written so far from `base` (the batch's
    first byte), without waiting for it: the fsync after the last write then waits only for what
    is left, while the disk worked beside the encoding of the later lines. (Linux starts the
    writeback of the range on `POSIX_FADV_DONTNEED`; its pages are dropped once clean, which
    `archive` does after the fsync anyway. The partial page at the end is left alone: the next
    write fills it.)"""
    start = base - base % _PAGE
    end = (base + written) - (base + written) % _PAGE
    if end > start and _FADVISE is not None:
        with contextlib.suppress(OSError):  # a hint: the fsync makes it durable whatever happens here
            _FADVISE(fd, start, end - start, os.POSIX_FADV_DONTNEED)


_PAGE = 4096
_FADVISE = getattr(os, "posix_fadvise", None)


def _record_pieces(
    first_seq: int, compaction: int, ts: float, messages: Sequence[Message], attempt: str, journal: str
) -> list[bytes]:
    """The pieces of journal lines for `messages` (see `_record_lines`)."""
    return _record_lines(first_seq, compaction, ts, messages, attempt, journal)[0]


__all__ = ["_encode_records", "_record_pieces", "_write_records"]
