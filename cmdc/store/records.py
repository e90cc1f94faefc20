"""What every store's journal hands out: records, results, references, reports.

The rules these values carry are stated once, in docs/journal.md."""

from __future__ import annotations

import secrets
from pathlib import Path

import attrs

from ..message import Message

ATTEMPTS_KEY = "cmdc.attempts"
"""Summary metadata: the journal attempts a summary depends on (committed together with it)."""
JOURNAL_KEY = "cmdc.journal"
"""Summary metadata: the id of the journal that holds what the summary replaced."""


def new_journal_id() -> str:
    return "j" + secrets.token_hex(8)


def new_attempt_id() -> str:
    return "k" + secrets.token_hex(8)


@attrs.frozen
class JournalRecord:
    """One message record of an offload journal."""

    seq: int
    compaction: int
    timestamp: float
    message: Message
    attempt: str | None = None
    journal: str | None = None
    clipped: int = 0
    """Characters of the message's text left out: a read with `max_chars` gives a message
    whose text is longer than that as a copy holding its first `max_chars` characters (for
    showing; not to be journaled again)."""


@attrs.frozen
class JournalRef:
    """What a state knows of its journal: the journal's id and the highest record number the
    state's summaries name. `append(expect=...)` checks the file against it."""

    journal: str | None = None
    seq: int = 0


@attrs.frozen
class AppendResult:
    """What an append did: `written` records are new; `first_seq..last_seq` cover the whole
    batch, including messages already in the journal (their records are reused). `pending`:
    the attempts a commit must name for the batch to become visible (empty once it is). A batch
    whose every message is new (`written == len(seqs)`) is numbered `first_seq`, `first_seq + 1`,
    ... in its order: every store keeps this (the compaction's ledger relies on it)."""

    path: Path
    first_seq: int
    last_seq: int
    written: int
    journal: str | None = None
    attempt: str | None = None
    pending: tuple[str, ...] = ()
    seqs: tuple[int, ...] = ()  # each message's record number, in the batch's order


@attrs.frozen
class JournalExtent:
    """What a journal holds, as its index counts it: committed records, the first and last
    record numbers (0 when empty), and the compactions they came from."""

    records: int
    first_seq: int
    last_seq: int
    compactions: int



@attrs.frozen
class StoreReport:
    """What `verify` found in one agent's journal: visible records, committed compactions,
    records of attempts never committed, damaged records (their numbers, or -1 where none
    can be read); after a `repair`, how much damage it moved aside (`moved`: rows for the
    PostgreSQL store, bytes for the file store)."""

    agent_id: str
    journal: str | None
    records: int
    compactions: int
    uncommitted: int
    damaged: tuple[int, ...]
    moved: int = 0

    @property
    def clean(self) -> bool:
        return not self.damaged


__all__ = [
    "ATTEMPTS_KEY",
    "JOURNAL_KEY",
    "AppendResult",
    "JournalExtent",
    "JournalRecord",
    "JournalRef",
    "StoreReport",
    "new_attempt_id",
    "new_journal_id",
]
