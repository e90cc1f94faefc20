"""Journal rows as the PostgreSQL store reads them back, shared by the journal's reads
(`store.py`) and the search (`search.py`): the query of an agent's visible rows and the decoder
that checks each row's checksum and message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import InvalidMessage
from .. import bigjson as _bigjson
from ..records import JournalRecord

VISIBLE = (
    "SELECT r.seq, r.compaction, r.ts, r.message, r.crc FROM cmdc_records r "
    "JOIN cmdc_attempts a ON a.agent_id = r.agent_id AND a.attempt = r.attempt AND a.committed "
    "WHERE r.agent_id = %s"
)
"""An agent's visible rows (those of committed attempts) as `decode` reads them; the agent is
its one parameter, and more conditions follow with `AND`."""


def decode(rows: Sequence[tuple[Any, ...]], max_chars: int | None = None) -> tuple[list[JournalRecord], list[int]]:
    """The rows' records and the seqs of damaged rows. A huge message is read in short
    steps (`cmdc.store.bigjson`); `max_chars`: texts cut as `records` says."""
    records: list[JournalRecord] = []
    damaged: list[int] = []
    for seq, compaction, ts, data, crc in rows:
        raw = bytes(data)
        if _bigjson.crc32(raw, 0, len(raw)) != crc:
            damaged.append(int(seq))
            continue
        try:
            message, clipped = _bigjson.message_from_json(raw, max_chars)
        except (InvalidMessage, ValueError, TypeError):
            damaged.append(int(seq))
            continue
        records.append(JournalRecord(int(seq), int(compaction), float(ts), message, clipped=clipped))
    return records, damaged


__all__ = ["VISIBLE", "decode"]
