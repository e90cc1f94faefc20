"""The PostgreSQL store: every agent's journal and checkpoint in one database (extra `postgres`).

`PostgresStore(url)` keeps the file store's promises in tables instead of files:

- **Journal.** The journal protocol (docs/journal.md: exactly-once attempts and commits,
  stable addresses, damage contained) in tables: `cmdc_records` (one row per record, `(agent_id,
  seq)` its address, the message's exact JSON bytes and their CRC-32, checked on every read),
  `cmdc_journals` (the agent's journal id and highest number, taken `FOR UPDATE`, so numbers
  only grow, even across writers), `cmdc_attempts` (an attempt's rows are visible once it is
  committed).
- **Search.** `body` (the text a person would search: content, tool names and arguments, its
  first `SEARCH_PREFIX_CHARS` characters without base64 runs) is written with the record; the
  search index derived from it (`cmdc_search`, `cmdc_terms`, the indexer thread, `ANALYZE`) is
  `indexer.py`, the ranked search over it `search.py` (`PostgresStore.index`,
  `PostgresStore.search`). A search finds every committed record whatever the indexer's lag.
- **Loss and repair.** A lost journal's successor is recorded in `cmdc_journal_links`;
  `repair` moves damaged rows to `cmdc_damaged`.
- **Checkpoints.** `cmdc_checkpoints` holds `State.to_json()` per agent. Saving a state also
  commits, in the same transaction, the journal attempts its summaries name: a compaction's
  batch and the state that points at it become visible together.
- **Schema.** Versioned in `cmdc_meta`; `open` creates or migrates it under an advisory lock.

The driver is psycopg 3 with its connection pool. psycopg's async API runs on asyncio, so each
operation runs in a worker thread (`trio.to_thread.run_sync`), one pooled connection per
operation; a caller cancelled mid-operation waits for it (bounded by `timeout`), so a write is
never half-known. A lost connection (`connection_lost`: no connection from the pool, a client-side
`OperationalError`, a connection-class SQLSTATE, the server shutting down) or a transaction the
server rolled back (a deadlock, a serialization failure) is retried `retries` times with backoff;
every operation is idempotent, so a retry loses and duplicates nothing. Past that, the caller
gets `StoreUnavailable`. Any other server error (a limit, a rejected value) would
only fail again: it is not retried, and the caller gets `StoreRefused`.

What the store shows of its URL (reprs, errors, logs, `location`) never holds its secrets: see
`cmdc._redact`. psycopg's own log records go to cmdc's logger (`driver.py`).

This module is the journal: append, commit, reads, verify and repair; the store's parts are
`schema.py` (tables and migrations), `driver.py` (errors and logs of the driver), `rows.py` (rows
read back), `indexer.py`, `search.py`, `checkpoints.py` and `leases.py`.
"""

from __future__ import annotations

import secrets
import time
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import psycopg
import psycopg_pool
import trio

from ..._check import flag, integer, seconds
from ..._redact import journal_label, redact_url, scrub
from ...errors import (
    ConfigError,
    InvalidMessage,
    JournalLost,
    StoreRefused,
    StoreUnavailable,
)
from ...events import EventSink, logger
from ...message import Message
from ...state import validate_agent_id
from .. import bigjson as _bigjson
from ..fs import run_bounded
from ..protocol import OnNumbered, Store
from ..records import ATTEMPTS_KEY as ATTEMPTS_KEY  # (importable from here, as before the split)
from ..records import AppendResult, JournalExtent, JournalRecord, JournalRef, StoreReport
from .checkpoints import CheckpointRows, PostgresCheckpoints
from .driver import _remember_secrets, is_postgres_url, redact, retryable
from .driver import connection_lost as connection_lost  # (importable from here, as before the split)
from .indexer import ANALYZE_MIN as ANALYZE_MIN
from .indexer import BASE64_RUN as BASE64_RUN
from .indexer import INDEX_BATCH as INDEX_BATCH
from .indexer import INDEX_LAG_MAX as INDEX_LAG_MAX
from .indexer import INDEX_RETRIES as INDEX_RETRIES
from .indexer import INDEX_RETRY_DELAY as INDEX_RETRY_DELAY
from .indexer import INDEX_RETRY_MAX_DELAY as INDEX_RETRY_MAX_DELAY
from .indexer import SEARCH_PREFIX_CHARS as SEARCH_PREFIX_CHARS
from .indexer import SEARCH_SCAN_CHARS as SEARCH_SCAN_CHARS
from .indexer import IndexRows, search_text
from .leases import LeaseRows
from .rows import VISIBLE, decode
from .schema import _MIGRATIONS as _MIGRATIONS  # (importable from here, as before the split)
from .schema import SCHEMA_VERSION as SCHEMA_VERSION
from .schema import migrate
from .search import SEARCH_CANDIDATES as SEARCH_CANDIDATES
from .search import SEARCH_DF_MAX as SEARCH_DF_MAX
from .search import SEARCH_NARROW_BELOW as SEARCH_NARROW_BELOW
from .search import SEARCH_UNINDEXED_MAX as SEARCH_UNINDEXED_MAX
from .search import SearchRows

_COPY_TYPES = ["text", "int8", "text", "text", "int4", "float8", "text", "int8", "bytea", "text"]

T = TypeVar("T")

LINKS_MAX = 10_000
"""Recorded losses of one agent's journal a check follows at most (a chain that long, or a cycle
a hostile row could make, ends the walk: the state's journal is then taken as lost)."""


def _message_bytes(message: Message) -> tuple[bytes, int]:
    data, crc = message._json, message._json_crc  # cached when the message entered its State
    if data is None or crc is None:
        data, crc = message.to_json(), message.json_crc()
    return data, crc


def _wanted(expect: JournalRef | None) -> tuple[str | None, int] | None:
    """What a caller's state knows of its journal: (journal id, highest record number it names)."""
    if expect is None:
        return None
    if not isinstance(expect, JournalRef):
        raise ConfigError(f"expect must be a JournalRef, got {expect!r:.80}")
    journal, seq = expect.journal, expect.seq
    if journal is not None and not isinstance(journal, str):
        raise ConfigError(f"expect.journal must be a journal id or None, got {journal!r:.80}")
    return journal, integer(seq, "expect.seq", minimum=0)


class PostgresStore(IndexRows, SearchRows, CheckpointRows, LeaseRows):
    """Journals and checkpoints in a PostgreSQL database; see the module docstring.

    Use `await PostgresStore.open(url)` (or `async with`), and `aclose()` when done.
    `pool_size`: connections at most; `retries`: attempts after a lost connection;
    `timeout`: seconds one operation may take, retries included (a stalled server gives
    `StoreUnavailable`, not a hang); `background_index`: fill the search index in a thread of
    this store after each journal batch commits (otherwise only `index()` fills it; a search
    finds every committed record either way). The indexer retries a batch that lost its
    connection (`INDEX_RETRIES` times, with backoff up to `INDEX_RETRY_MAX_DELAY` s), each
    time with an `index_retry` event; past that, or on any other error, it leaves the agent for
    later with an `index_failed` event. `on_event`: a sink for those events (called from the
    indexer's thread: it must be thread-safe and quick); they are also logged (`log_event`).

    A store shared by several runtimes is `shared` (its runtimes lease every agent name by
    default: see `open_runtime`)."""

    shared: bool = True  # one database, many processes: runtimes lease names on it by default

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 8,
        retries: int = 3,
        timeout: float = 60.0,
        background_index: bool = True,
        on_event: EventSink | None = None,
    ) -> None:
        if not is_postgres_url(url):
            raise ConfigError(f"a PostgreSQL store needs a postgresql:// URL, got {redact_url(str(url))!r:.80}")
        integer(pool_size, "pool_size")
        self.url = url
        _remember_secrets(url)
        self.retries = integer(retries, "retries", minimum=0)
        self.timeout = seconds(timeout, "timeout")
        self.checkpoints = PostgresCheckpoints(self)
        self._pool = psycopg_pool.ConnectionPool(
            url, min_size=1, max_size=pool_size, open=False, kwargs={"autocommit": False}, timeout=self.timeout
        )
        self._opened = False
        self._start_lock = trio.Lock()
        self._held: dict[str, tuple[str, int]] = {}  # leases held through this store: agent -> (owner, token)
        self.background_index = flag(background_index, "background_index")
        self._setup_index()
        self._setup_search()
        if on_event is not None and not callable(on_event):
            raise ConfigError(f"on_event must be a callable taking an Event, got {on_event!r:.80}")
        self.on_event: EventSink | None = on_event

    def __repr__(self) -> str:
        return f"PostgresStore({redact(self.url)!r})"

    @classmethod
    async def open(cls, url: str, **options: Any) -> PostgresStore:
        """Connect and create or migrate the schema."""
        store = cls(url, **options)
        await store.start()
        return store

    async def start(self) -> None:
        """Open the pool and create or migrate the schema (once; later calls return at once)."""
        async with self._start_lock:
            if self._opened:
                return
            try:
                await trio.to_thread.run_sync(self._start_sync)
            except psycopg.Error as exc:
                raise StoreUnavailable(f"PostgreSQL store {redact(self.url)}: cannot open: {self._scrub(exc)}") from exc
            self._opened = True
            if self.background_index:
                self._index_later((), scan=True)  # a backlog an earlier process left

    def _start_sync(self) -> None:
        self._probe()
        self._pool.open(wait=True, timeout=self.timeout)
        with self._pool.connection() as conn:
            migrate(conn)
            self._read_statistics(conn)

    def _probe(self) -> None:
        """One direct connection first, with `retries` bounded attempts: an unreachable server
        (a typo in the URL, a server down) fails in a second or two, not after the pool spent
        `timeout` seconds reconnecting in the background and logging each failure."""
        options: dict[str, Any] = {}
        if "connect_timeout" not in self.url:  # libpq would wait for the OS's TCP timeout
            options["connect_timeout"] = max(2, min(30, int(self.timeout)))
        delay = 0.05
        deadline = time.monotonic() + self.timeout
        for attempt in range(self.retries + 1):
            try:
                psycopg.connect(self.url, autocommit=True, **options).close()
                return
            except psycopg.OperationalError:
                if attempt == self.retries or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 4, 2.0)

    async def aclose(self) -> None:
        """Stop the indexer after the batch it is on (what is left is indexed by the next
        store that opens the database; searches find it meanwhile), then close the pool."""
        await self._stop_indexer()
        await trio.to_thread.run_sync(self._pool.close)
        self._indexer_stopped()
        self._opened = False

    async def __aenter__(self) -> PostgresStore:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def location(self, agent_id: str) -> str:
        """How summaries, reports, events and spans name the agent's journal: the database's
        label (host, port and name: no user, password or option; see `cmdc._redact`) and the
        agent, the same whatever credentials the URL carries."""
        return f"{journal_label(self.url)}#journal/{validate_agent_id(agent_id)}"

    def _scrub(self, exc: BaseException | str) -> str:
        """An error's text without the URL's secrets (a driver's message may quote them)."""
        return scrub(str(exc), self.url)

    # -- running operations -----------------------------------------------------------------------
    async def _run(self, fn: Callable[..., T], *args: Any, write: bool = False) -> T:
        if not self._opened:  # opened on first use (a Compactor(store="postgresql://...") does that)
            await self.start()
        try:
            if write:  # a cancelled caller waits for the write (bounded): it is never half-known
                result: T = await run_bounded(self._retrying, fn, *args, limit=self.timeout)
                return result
            return await trio.to_thread.run_sync(self._retrying, fn, *args)
        except trio.TooSlowError:
            raise StoreUnavailable(f"PostgreSQL store {redact(self.url)}: no answer within {self.timeout} s") from None

    def _retrying(self, fn: Callable[..., T], *args: Any) -> T:
        deadline = time.monotonic() + self.timeout
        delay = 0.05
        for attempt in range(self.retries + 1):
            try:
                with self._pool.connection() as conn:
                    return fn(conn, *args)
            except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
                if not retryable(exc):  # the same operation would fail again: not retried
                    raise StoreRefused(
                        f"PostgreSQL store {redact(self.url)}: {type(exc).__name__}"
                        f"{f' (SQLSTATE {exc.sqlstate})' if isinstance(exc, psycopg.Error) and exc.sqlstate else ''}: "
                        f"{self._scrub(exc)}"[:2_000]
                    ) from exc
                if attempt == self.retries or time.monotonic() + delay > deadline:
                    raise StoreUnavailable(
                        f"PostgreSQL store {redact(self.url)}: {type(exc).__name__}: {self._scrub(exc)} "
                        f"(after {attempt + 1} attempts)"
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 4, 2.0)
        raise AssertionError("unreachable")

    # -- the journal --------------------------------------------------------------------------------
    async def append(
        self,
        agent_id: str,
        messages: Sequence[Message],
        *,
        compaction: int = 0,
        attempt: str | None = None,
        commit: bool = True,
        expect: JournalRef | None = None,
        on_numbered: OnNumbered | None = None,
    ) -> AppendResult:
        """Journal `messages` as one batch of `attempt` (a new one when None), durably (the
        transaction has committed when this returns). With `commit` the batch is visible at
        once; otherwise it becomes visible with `commit(agent_id, [attempt])` or with a
        checkpoint of a state whose summary names the attempt. Messages already journaled for
        the agent (same id, same content) keep their records; the same id with other content
        raises `InvalidMessage`. `expect`: what the caller's state knows of the journal (an
        object with `journal` and `seq`, e.g. a `JournalRef`): a journal that vanished, was
        replaced since (another id, not its successor) or holds fewer numbers than the state
        names raises `JournalLost` before anything is written, after recording the loss (a
        successor journal numbering on past both): the retry writes the whole batch."""
        validate_agent_id(agent_id)
        integer(compaction, "compaction", minimum=0)
        if attempt is not None and (not isinstance(attempt, str) or not 1 <= len(attempt) <= 64):
            raise ConfigError(f"attempt must be a short string, got {attempt!r:.80}")
        batch = tuple(messages)
        for i, msg in enumerate(batch):
            if not isinstance(msg, Message):
                raise InvalidMessage(f"messages[{i}] is a {type(msg).__name__}, not a Message")
        unique = list({m.id: m for m in batch}.values())
        attempt = attempt or "k" + secrets.token_hex(8)
        seqs: dict[str, int]
        want = _wanted(expect)
        done = await self._run(self._append_sync, agent_id, unique, compaction, attempt, commit, want, write=True)
        if isinstance(done, JournalLost):
            raise done
        journal, seqs, written, pending = done
        if written and commit and self.background_index:  # a batch to commit later: indexed then
            self._index_later([agent_id])
        numbers = [seqs[m.id] for m in unique]
        first = min(numbers) if numbers else 0
        last = max(numbers) if numbers else -1
        location = self.location(agent_id)
        # the file store's result names a file; here the "path" is the journal's location string
        result = AppendResult(
            path=location,  # type: ignore[arg-type]
            first_seq=first,
            last_seq=last,
            written=written,
            journal=journal,
            attempt=attempt,
            pending=tuple(pending),
            seqs=tuple(numbers),
        )
        if on_numbered is not None and written:  # numbered and durable at once: told just before returning
            try:
                on_numbered(result)
            except Exception:
                logger.exception("postgres: an append's on_numbered callback failed (agent %s)", agent_id)
        return result

    @staticmethod
    def _journal_row(conn: psycopg.Connection[Any], agent_id: str) -> tuple[str, int, str | None, bool]:
        """The agent's journal (id, highest record number, the journal it took over from,
        whether it was created just now), locked until the transaction ends."""
        select = "SELECT journal, seq, follows FROM cmdc_journals WHERE agent_id = %s FOR UPDATE"
        row = conn.execute(select, (agent_id,)).fetchone()
        created = False
        if row is None:
            created = (
                conn.execute(
                    "INSERT INTO cmdc_journals (agent_id, journal) VALUES (%s, %s) ON CONFLICT DO NOTHING "
                    "RETURNING journal",
                    (agent_id, "j" + secrets.token_hex(8)),
                ).fetchone()
                is not None
            )
            row = conn.execute(select, (agent_id,)).fetchone()
        assert row is not None
        return str(row[0]), int(row[1]), (None if row[2] is None else str(row[2])), created

    def _check_expected(
        self,
        conn: psycopg.Connection[Any],
        agent_id: str,
        row: tuple[str, int, str | None, bool],
        want: tuple[str | None, int] | None,
    ) -> JournalLost | None:
        """None when the journal is the one the caller's state names (or its successor);
        otherwise record the loss (a successor journal that follows the lost one and numbers
        on past every record either side handed out) and return the error to raise once the
        transaction has committed, as the file store does: the retry writes its whole batch
        and no record number is reused."""
        if want is None or want[0] is None:
            return None
        expected, expected_seq = want[0], want[1]  # a journal id: not None
        journal, top, follows, created = row
        if journal == expected and expected_seq <= top:
            return None
        if (
            journal != expected
            and not created
            and (follows == expected or self._descends(conn, agent_id, journal, expected))
        ):
            return None  # a successor of the journal the state names
        if created:
            why = "vanished"
        elif journal != expected:
            why = f"replaced by journal {journal}"
        else:
            why = f"truncated: it ends at record {top}, the state names records up to {expected_seq}"
        successor, seq = "j" + secrets.token_hex(8), max(top, expected_seq)
        conn.execute(
            "UPDATE cmdc_journals SET journal = %s, seq = %s, follows = %s WHERE agent_id = %s",
            (successor, seq, expected, agent_id),
        )
        conn.execute(
            "INSERT INTO cmdc_journal_links (agent_id, journal, follows) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
            (agent_id, successor, expected),
        )
        return JournalLost(
            f"journal of {agent_id!r} in {redact(self.url)}: journal {expected} {why}; "
            f"going on as journal {successor} from record {seq + 1}",
            expected=expected,
            found=None if created else journal,
            expected_seq=expected_seq,
            found_seq=top,
            why=why,
        )

    @staticmethod
    def _descends(conn: psycopg.Connection[Any], agent_id: str, journal: str, lost: str) -> bool:
        """Whether `journal` took over from `lost`, directly or through other successors (the
        losses were recorded: they are not reported again). At most `LINKS_MAX` links are read
        and each journal is visited once, so a cycle ends the walk."""
        rows = conn.execute(
            "SELECT journal, follows FROM cmdc_journal_links WHERE agent_id = %s LIMIT %s", (agent_id, LINKS_MAX)
        ).fetchall()
        parents = {str(j): str(f) for j, f in rows}
        seen: set[str] = set()
        while journal in parents and journal not in seen:
            seen.add(journal)
            journal = parents[journal]
            if journal == lost:
                return True
        return False

    def _append_sync(
        self,
        conn: psycopg.Connection[Any],
        agent_id: str,
        messages: list[Message],
        compaction: int,
        attempt: str,
        commit: bool,
        want: tuple[str | None, int] | None,
    ) -> tuple[str, dict[str, int], int, list[str]] | JournalLost:
        # encoded here, in the worker thread: a huge message is long calls the trio thread must not make
        rows = [(m.id, *_message_bytes(m), search_text(m)) for m in messages]
        with conn.transaction():
            self._fence(conn, agent_id)
            row = self._journal_row(conn, agent_id)
            journal, top = row[0], row[1]
            lost = self._check_expected(conn, agent_id, row, want)
            if lost is not None:
                return lost  # raised by the caller, once the loss is recorded
            ids = [r[0] for r in rows]
            row_attempt = conn.execute(
                "INSERT INTO cmdc_attempts (agent_id, attempt, committed) VALUES (%s, %s, %s) "
                "ON CONFLICT (agent_id, attempt) "
                "DO UPDATE SET committed = cmdc_attempts.committed OR excluded.committed RETURNING committed",
                (agent_id, attempt, commit),
            ).fetchone()
            assert row_attempt is not None
            ts = time.time()
            known: dict[str, tuple[int, int, str]] = {}
            # A batch of new messages (the usual case) is written without looking each one up:
            # unless its first or last message is journaled already (a retried batch), the COPY
            # runs in a savepoint, and the unique index on message ids rejects it if any other
            # one is; then each is looked up and only the new ones are written.
            fresh = self._fresh(rows, known, agent_id, journal, attempt, compaction, ts, top)
            written = False
            if fresh and not self._known(conn, agent_id, [ids[0], ids[-1]]):
                try:
                    with conn.transaction():  # a savepoint
                        self._copy(conn, fresh)
                    written = True
                except psycopg.errors.UniqueViolation:
                    pass
            if fresh and not written:
                known = self._known(conn, agent_id, ids)
                fresh = self._fresh(rows, known, agent_id, journal, attempt, compaction, ts, top)
                if fresh:
                    self._copy(conn, fresh)
            seqs = {mid: known[mid][0] for mid in ids if mid in known}
            seqs.update((r[6], r[1]) for r in fresh)
            lag = 0
            if fresh:
                marked = conn.execute(
                    "UPDATE cmdc_journals SET seq = %s WHERE agent_id = %s RETURNING seq - indexed_seq",
                    (fresh[-1][1], agent_id),
                ).fetchone()
                assert marked is not None
                lag = int(marked[0])
            reused = sorted({known[mid][2] for mid in ids if mid in known})
            if commit and reused:
                conn.execute(
                    "UPDATE cmdc_attempts SET committed = true WHERE agent_id = %s AND attempt = ANY(%s)",
                    (agent_id, reused),
                )
            pending: list[str] = []
            if not commit and not reused:
                pending = [] if row_attempt[0] else [attempt]
            elif not commit:
                pending = [
                    str(a)
                    for (a,) in conn.execute(
                        "SELECT attempt FROM cmdc_attempts WHERE agent_id = %s AND attempt = ANY(%s) AND NOT committed",
                        (agent_id, [*reused, attempt]),
                    )
                ]
        self._keep_up(conn, agent_id, len(fresh), lag)  # a writer that outruns the indexer helps it
        return journal, seqs, len(fresh), pending

    @staticmethod
    def _known(conn: psycopg.Connection[Any], agent_id: str, ids: list[str]) -> dict[str, tuple[int, int, str]]:
        """The agent's records of these message ids: id -> (seq, crc, attempt)."""
        rows = conn.execute(
            "SELECT message_id, seq, crc, attempt FROM cmdc_records WHERE agent_id = %s AND message_id = ANY(%s)",
            (agent_id, ids),
        )
        return {str(mid): (int(seq), int(crc), str(att)) for mid, seq, crc, att in rows}

    @staticmethod
    def _fresh(
        rows: list[tuple[str, bytes, int, str]],
        known: dict[str, tuple[int, int, str]],
        agent_id: str,
        journal: str,
        attempt: str,
        compaction: int,
        ts: float,
        top: int,
    ) -> list[tuple[Any, ...]]:
        """The rows to write: the messages not in `known`, numbered on from `top`. A known id
        with other content raises `InvalidMessage`."""
        fresh: list[tuple[Any, ...]] = []
        for mid, data, crc, body in rows:
            if mid in known:
                if known[mid][1] != crc:
                    raise InvalidMessage(f"message {mid} is already journaled for {agent_id!r} with other content")
                continue
            top += 1
            fresh.append((agent_id, top, journal, attempt, compaction, ts, mid, crc, data, body))
        return fresh

    @staticmethod
    def _copy(conn: psycopg.Connection[Any], fresh: list[tuple[Any, ...]]) -> None:
        with conn.cursor().copy(
            "COPY cmdc_records (agent_id, seq, journal, attempt, compaction, ts, message_id, crc, "
            "message, body) FROM STDIN (FORMAT BINARY)"  # binary: a huge bytea is not escaped
        ) as copy:
            copy.set_types(_COPY_TYPES)
            for row in fresh:
                copy.write_row(row)

    async def commit(self, agent_id: str, attempts: Sequence[str], *, expect: JournalRef | None = None) -> bool:
        """Make the batches of `attempts` visible; return whether any was not already."""
        validate_agent_id(agent_id)
        wanted = [a for a in dict.fromkeys(attempts) if isinstance(a, str)]
        if not wanted:
            return False
        done = await self._run(self._commit_sync, agent_id, wanted, _wanted(expect), write=True)
        if isinstance(done, JournalLost):
            raise done
        if done and self.background_index:
            self._index_later([agent_id])
        return bool(done)

    def _commit_sync(
        self, conn: psycopg.Connection[Any], agent_id: str, attempts: list[str], want: tuple[str | None, int] | None
    ) -> bool | JournalLost:
        with conn.transaction():
            self._fence(conn, agent_id)
            if want is not None and want[0] is not None:
                lost = self._check_expected(conn, agent_id, self._journal_row(conn, agent_id), want)
                if lost is not None:
                    return lost  # raised by the caller, once the loss is recorded
            cur = conn.execute(
                "UPDATE cmdc_attempts SET committed = true WHERE agent_id = %s AND attempt = ANY(%s) AND NOT committed",
                (agent_id, attempts),
            )
            return cur.rowcount > 0

    def _records_sync(self, conn: psycopg.Connection[Any], agent_id: str, lo: int, hi: int) -> list[tuple[Any, ...]]:
        with conn.transaction():
            query = VISIBLE + " AND r.seq BETWEEN %s AND %s ORDER BY r.seq"
            return conn.execute(query, (agent_id, lo, hi), binary=True).fetchall()  # binary: bytea not hex

    async def records(self, agent_id: str, *, max_chars: int | None = None) -> list[JournalRecord]:
        """Every visible record in seq order, each message once. Damaged rows are skipped.
        `max_chars`: a longer text comes cut to that many characters, the record's `clipped`
        counting the rest (see docs/journal.md)."""
        return await self.read_range(agent_id, 1, 2**62, max_chars=max_chars)

    async def read(self, agent_id: str) -> list[Message]:
        return [r.message for r in await self.records(agent_id)]

    async def last_records(self, agent_id: str, n: int, *, max_chars: int | None = None) -> list[JournalRecord]:
        """The last `n` visible records, in seq order (`max_chars`: as `records`)."""
        validate_agent_id(agent_id)
        integer(n, "n", minimum=0)
        if max_chars is not None:
            integer(max_chars, "max_chars", minimum=0)
        if not n:
            return []
        rows = await self._run(self._last_sync, agent_id, n)
        return (await trio.to_thread.run_sync(decode, rows[::-1], max_chars))[0]

    def _last_sync(self, conn: psycopg.Connection[Any], agent_id: str, n: int) -> list[tuple[Any, ...]]:
        with conn.transaction():
            query = VISIBLE + " ORDER BY r.seq DESC LIMIT %s"
            return conn.execute(query, (agent_id, n), binary=True).fetchall()

    async def extent(self, agent_id: str) -> JournalExtent:
        """How many visible records the journal holds, their first and last numbers and the
        compactions they came from (counted as `verify` counts them; no message is decoded)."""
        validate_agent_id(agent_id)
        count, first, last, compactions = await self._run(self._extent_sync, agent_id)
        return JournalExtent(count, first, last, compactions)

    def _extent_sync(self, conn: psycopg.Connection[Any], agent_id: str) -> tuple[int, int, int, int]:
        with conn.transaction():
            wanted = "count(*), coalesce(min(r.seq), 0), coalesce(max(r.seq), 0)"
            span = VISIBLE.replace("r.seq, r.compaction, r.ts, r.message, r.crc", wanted)
            row = conn.execute(f"SELECT *, ({self._COMPACTIONS}) FROM ({span}) s", (agent_id, agent_id)).fetchone()
            assert row is not None
            return int(row[0]), int(row[1]), int(row[2]), int(row[3])

    async def read_range(
        self, agent_id: str, first_seq: int, last_seq: int, *, max_chars: int | None = None
    ) -> list[JournalRecord]:
        """The visible records with `first_seq <= seq <= last_seq` (`max_chars`: as `records`)."""
        validate_agent_id(agent_id)
        if max_chars is not None:
            integer(max_chars, "max_chars", minimum=0)
        rows = await self._run(self._records_sync, agent_id, int(first_seq), int(last_seq))
        return (await trio.to_thread.run_sync(decode, rows, max_chars))[0]

    async def verify(self, agent_id: str) -> StoreReport:
        """Check every row of the agent's journal (its checksum, its message)."""
        validate_agent_id(agent_id)
        journal, rows, compactions, uncommitted = await self._run(self._verify_sync, agent_id)
        records, damaged = await trio.to_thread.run_sync(decode, rows, _bigjson.BIG)  # texts not built whole
        return StoreReport(agent_id, journal, len(records), compactions, uncommitted, tuple(damaged))

    _COMPACTIONS = (
        "SELECT count(*) FROM (SELECT b.compaction, "
        "lag(b.compaction, 1, 0) OVER (ORDER BY b.first) AS prev FROM "
        "(SELECT min(r.compaction) AS compaction, min(r.seq) AS first FROM cmdc_records r "
        "JOIN cmdc_attempts a ON a.agent_id = r.agent_id AND a.attempt = r.attempt AND a.committed "
        "WHERE r.agent_id = %s GROUP BY r.attempt) b) c WHERE c.compaction > 0 AND c.compaction <> c.prev"
    )
    """Compactions: committed batches whose compaction number moves from the previous batch's
    (capped, masked and clipped results are batches numbered with the current one)."""

    def _verify_sync(self, conn: psycopg.Connection[Any], agent_id: str) -> tuple[str | None, list[Any], int, int]:
        with conn.transaction():
            row = conn.execute("SELECT journal FROM cmdc_journals WHERE agent_id = %s", (agent_id,)).fetchone()
            rows = conn.execute(VISIBLE + " ORDER BY r.seq", (agent_id,), binary=True).fetchall()
            # Compactions: committed batches whose compaction number moves from the previous
            # batch's (capped, masked and clipped results are batches numbered with the current one)
            counts = conn.execute(
                f"SELECT ({self._COMPACTIONS}), "
                "(SELECT count(*) FROM cmdc_records r JOIN cmdc_attempts a "
                "ON a.agent_id = r.agent_id AND a.attempt = r.attempt AND NOT a.committed WHERE r.agent_id = %s)",
                (agent_id, agent_id),
            ).fetchone()
        assert counts is not None
        return (None if row is None else str(row[0])), rows, int(counts[0]), int(counts[1])

    async def repair(self, agent_id: str) -> StoreReport:
        """Move every damaged row of the agent's journal (a checksum that does not match, a
        message that cannot be read; committed or not) to `cmdc_damaged`, as it was, in one
        transaction; every valid row stays as it is, at its number (numbers are never reused).
        Returns the report of the journal before the repair, with `moved` rows."""
        validate_agent_id(agent_id)
        before = await self.verify(agent_id)
        moved = await self._run(self._repair_sync, agent_id, write=True)
        return attrs.evolve(before, moved=moved)

    def _repair_sync(self, conn: psycopg.Connection[Any], agent_id: str) -> int:
        with conn.transaction():
            # the journal row's lock keeps appends out while the rows are checked
            conn.execute("SELECT 1 FROM cmdc_journals WHERE agent_id = %s FOR UPDATE", (agent_id,))
            bad: list[tuple[int, str]] = []
            with conn.cursor(name="cmdc_repair") as cur:  # a server-side cursor: rows in bounded batches
                cur.execute("SELECT seq, message, crc FROM cmdc_records WHERE agent_id = %s ORDER BY seq", (agent_id,))
                for seq, data, crc in cur:
                    raw = bytes(data)
                    if zlib.crc32(raw) != crc:
                        bad.append((int(seq), "checksum mismatch"))
                        continue
                    try:
                        Message.from_json(raw)
                    except (InvalidMessage, ValueError, TypeError) as exc:
                        bad.append((int(seq), f"unreadable message: {exc}"[:200]))
            for seq, reason in bad:
                conn.execute(
                    "INSERT INTO cmdc_damaged (agent_id, seq, journal, attempt, compaction, ts, message_id, crc, "
                    "message, reason, moved_at) SELECT agent_id, seq, journal, attempt, compaction, ts, message_id, "
                    "crc, message, %s, %s FROM cmdc_records WHERE agent_id = %s AND seq = %s "
                    "ON CONFLICT (agent_id, seq) DO NOTHING",
                    (reason, time.time(), agent_id, seq),
                )
                conn.execute("DELETE FROM cmdc_records WHERE agent_id = %s AND seq = %s", (agent_id, seq))
                conn.execute(  # its words' counts go with it
                    "WITH d AS (DELETE FROM cmdc_search WHERE agent_id = %s AND seq = %s RETURNING words) "
                    "UPDATE cmdc_terms c SET n = c.n - 1 FROM d, unnest(d.words) u "
                    "WHERE c.agent_id = %s AND c.word = u.lexeme",
                    (agent_id, seq, agent_id),
                )
        return len(bad)

    async def transcript(self, agent_id: str) -> str:
        """The journal as Markdown, for people (the file store writes the same beside its journal)."""
        from ..transcript import transcript_pieces

        records = await self.records(agent_id)

        def render() -> str:  # in a worker: a journal holding a huge text is long calls
            batches: list[list[JournalRecord]] = []
            for r in records:
                if not batches or batches[-1][-1].compaction != r.compaction:
                    batches.append([])
                batches[-1].append(r)
            pieces = [p for b in batches for p in transcript_pieces(b[0].compaction, [(r.seq, r.message) for r in b])]
            return "".join(p.decode() for p in pieces)  # each piece is whole characters: one big copy, not two

        return await trio.to_thread.run_sync(render)


if TYPE_CHECKING:  # mypy checks that the PostgreSQL store satisfies the protocol
    _POSTGRES_STORE: type[Store] = PostgresStore

__all__ = ["PostgresCheckpoints", "PostgresStore", "StoreRefused", "StoreUnavailable", "is_postgres_url", "migrate"]
