"""The PostgreSQL store: every agent's journal and checkpoint in one database (extra `postgres`).

`PostgresStore(url)` keeps the file store's promises in tables instead of files:

- **Journal.** The journal protocol (docs/journal.md: exactly-once attempts and commits,
  stable addresses, damage contained) in tables: `cmdc_records` (one row per record, `(agent_id,
  seq)` its address, the message's exact JSON bytes and their CRC-32, checked on every read),
  `cmdc_journals` (the agent's journal id and highest number, taken `FOR UPDATE`, so numbers
  only grow, even across writers), `cmdc_attempts` (an attempt's rows are visible once it is
  committed).
- **Search.** `body` (the text a person would search: content, tool names and arguments, its
  first `SEARCH_PREFIX_CHARS` characters without base64 runs, so a vector always fits) feeds
  a `tsvector` per record in `cmdc_search`, with a GIN index, queried with the `simple`
  configuration (no stemming: the words match as the file store matches them). The vectors are
  written after the journal batch commits, by the store's indexer thread (see
  `PostgresStore.index`); a search reads the records past the agent's `indexed_seq` directly,
  so it finds every committed record whatever the indexer's lag. The work is bounded whatever the
  journal's size: at most `SEARCH_CANDIDATES` records holding every query word, then as many
  holding any, are ranked by BM25, each word's rarity kept per agent in `cmdc_terms` (see
  `PostgresStore.search`). The indexer empties the GIN index's pending list after each batch
  (every lookup reads all of it). The store runs `ANALYZE`
  on the search and record tables after indexing many records (see `ANALYZE_MIN`): without
  statistics the planner reads a freshly filled journal by its primary key, not the index.
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
`cmdc._redact`. psycopg's own log records go to cmdc's logger (`_DriverLog`).
"""

from __future__ import annotations

import logging
import math
import re
import secrets
import threading
import time
import zlib
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import orjson
import psycopg
import psycopg_pool
import trio

from ..._check import flag, integer, seconds
from ..._redact import REDACTED, journal_label, redact_url, scrub, secrets_of
from ...errors import (
    ConfigError,
    InvalidMessage,
    JournalLost,
    StoreRefused,
    StoreUnavailable,
)
from ...events import INDEX_FAILED, INDEX_RETRY, Event, EventSink, emit, log_event, logger
from ...message import Message
from ...state import validate_agent_id
from .. import bigjson as _bigjson
from .. import search as _ranking
from ..fs import run_bounded
from ..protocol import OnNumbered, Store
from ..records import ATTEMPTS_KEY as ATTEMPTS_KEY  # (importable from here, as before the split)
from ..records import AppendResult, JournalExtent, JournalRecord, JournalRef, StoreReport
from ..search import MAX_QUERY_CHARS, MAX_QUERY_WORDS
from .checkpoints import CheckpointRows, PostgresCheckpoints
from .leases import LeaseRows
from .schema import _MIGRATIONS as _MIGRATIONS  # (importable from here, as before the split)
from .schema import SCHEMA_VERSION as SCHEMA_VERSION
from .schema import migrate

SEARCH_CANDIDATES = 500
"""Records a search ranks at most per stage (see `PostgresStore.search`)."""
SEARCH_DF_MAX = 100_000
"""Records a search counts at most for a word's rarity (a word in more is common anyway)."""
_AVERAGE_SAMPLE = 256  # latest records whose mean length in words BM25 uses
SEARCH_UNINDEXED_MAX = 50_000
"""A search reads at most this many record numbers past the agent's `indexed_seq` directly (the
indexer's usual lag is the last batch); past that, it indexes them first."""
SEARCH_NARROW_BELOW = 50_000
"""Journals with at most this many records are searched through their agent's index lexeme."""
_COPY_TYPES = ["text", "int8", "text", "text", "int4", "float8", "text", "int8", "bytea", "text"]
_INDEX_LOCK_CLASS = 0x636D6469  # with the agent's hash: the lock indexers of one agent take turns on ("cmdi")
_WORD = re.compile(r"\w+")


def _lexeme(word: str) -> str:
    """`word` as one quoted lexeme of a `to_tsquery` text (never an operator)."""
    return "'" + word.replace("'", "''").replace("\\", "\\\\") + "'"


def _ranked_words(raw: bytes) -> tuple[list[str], bool] | None:
    """A row's message as search ranks it (its words as the file store indexes them, whether it
    is a summary), read with one `orjson.loads` (a huge one through the message decoder); None
    for a row that cannot be read (the decoder skips it too)."""
    try:
        if len(raw) > _ranking.TEXT_CHARS:
            message = _bigjson.message_from_json(raw, _ranking.TEXT_CHARS)[0]
            return _ranking.tokens(_ranking.record_text(message)), message.is_summary
        obj = orjson.loads(raw)
        content = obj.get("content", "")
        if not isinstance(content, str):
            message = Message.from_dict(obj)
            return _ranking.tokens(_ranking.record_text(message)), message.is_summary
        parts = [content]
        for call in obj.get("tool_calls", []):
            parts += (call["name"], orjson.dumps(call.get("arguments", {})).decode())
        summary = (obj.get("metadata") or {}).get("cmdc.kind") == "summary"
        return _ranking.tokens("\n".join(parts)), summary
    except (orjson.JSONDecodeError, InvalidMessage, ValueError, TypeError, KeyError, AttributeError):
        return None


def _vector_counts(vector: str, terms: Sequence[str]) -> tuple[int, list[int]]:
    """A search vector's length (its positions: the words the text held) and how often it
    holds each of `terms`, from its text form (`'word':3,17 'other':5 'cmdc agent=a'`). A
    lexeme holding `':` or a comma of its own counts a little long: this bounds a score, it
    does not make one."""
    length = vector.count("':") + vector.count(",")
    counts = []
    for term in terms:
        key = "'" + term.replace("'", "''") + "':"
        at = vector.find(key)
        while at > 0 and vector[at - 1] != " ":
            at = vector.find(key, at + 1)
        if at < 0:
            counts.append(0)
            continue
        end = vector.find(" ", at + len(key))
        counts.append(vector.count(",", at + len(key), len(vector) if end < 0 else end) + 1)
    return length, counts


class _Bound:
    """The most a candidate can score, from its search vector: each word's occurrences and the
    vector's length are those the file store's index counts for plain words (the sum is
    `cmdc.store.search.bm25`'s, term by term in the same order, so a bound equals the score when they
    are); a word the configuration splits counts as if it held it without end, and the phrase
    as often as its rarest word. A summary only scores less."""

    def __init__(
        self,
        terms: Sequence[str],
        single: Collection[str],
        phrase: str | None,
        n: int,
        frequency: Callable[[str], int],
        average: float,
    ) -> None:
        queries = [*terms, *([phrase] if phrase is not None else [])]
        weights = []
        for q in queries:
            value = math.log((n - frequency(q) + 0.5) / (frequency(q) + 0.5))
            weights.append(value if value > 0 else 1e-6)
        index = {t: i for i, t in enumerate(terms)}
        # per query: its weight and which counts bound its hits (None: no bound, hits without end)
        self._parts: list[tuple[float, list[int] | None]] = []
        for q, weight in zip(queries, weights, strict=True):
            words = q.split() if q is phrase else [q]
            known = [index[w] for w in words if w in single and w in index]
            self._parts.append((weight, known if len(known) == len(words) else None))
        self._average = max(average, 1e-9)

    def __call__(self, tfs: Sequence[int], length: int) -> float:
        k1, b = _ranking.K1, _ranking.B
        norm = k1 * (1 - b + b * length / self._average)
        score = 0.0
        for weight, known in self._parts:
            if known is None:
                score += weight * (k1 + 1)
                continue
            hits = min(tfs[i] for i in known)
            if hits:
                score += weight * hits * (k1 + 1) / (hits + norm)
        return score


T = TypeVar("T")

LINKS_MAX = 10_000
"""Recorded losses of one agent's journal a check follows at most (a chain that long, or a cycle
a hostile row could make, ends the walk: the state's journal is then taken as lost)."""
SEARCH_PREFIX_CHARS = 65_536
"""Characters of a record's searchable text that go into its search vector. PostgreSQL refuses a
vector over 1 MB; a vector costs at most about 6.5 bytes per character of text (a lexeme of one
4-byte character, its entry, position and separator), so this prefix always fits, whatever the
text. A record's words past it are not found by a search (its whole text is still journaled)."""
SEARCH_SCAN_CHARS = 1_000_000
"""Characters of a record's text scanned for base64 runs (`BASE64_RUN`) before the prefix is taken."""
BASE64_RUN = 256
"""A run of at least this many base64 characters (a pasted image's data URL, a blob) is left out
of the search vector: it holds no word anyone searches, only thousands of random tokens."""
_SEARCHED = (
    "left(regexp_replace(left({r}.body, " + str(SEARCH_SCAN_CHARS) + "), "
    "'[A-Za-z0-9+/=_-]{{" + str(BASE64_RUN - 1) + "}}[A-Za-z0-9+/=_-]+', ' ', 'g'), "  # a count is at most 255
    + str(SEARCH_PREFIX_CHARS)
    + ")"
)
_VECTOR = (
    "(to_tsvector('simple', " + _SEARCHED + ") || array_to_tsvector(ARRAY['cmdc agent=' || {r}.agent_id]))"
)
"""A record's search vector: the words of its bounded text (`_SEARCHED`), and the agent as a
lexeme no text can produce (it holds a space), so the GIN index can find one agent's matches
without reading other agents' rows."""
_RETRIED_STATES = frozenset({"57P01", "57P02", "57P03", "53300"})
"""Server errors retried as a lost connection is: the server shutting down or starting, too
many connections. Every other server error (a limit, a data error) is deterministic."""


def connection_lost(exc: BaseException) -> bool:
    """Whether `exc` means the connection (or the server) went away, so that the same operation
    may well succeed on a new connection: a pool that found none, a client-side
    `OperationalError` (no SQLSTATE), a connection-class (08) state or one of `_RETRIED_STATES`.
    A deterministic error (`program_limit_exceeded`, a data error...) is not."""
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _RETRIED_STATES


def retryable(exc: BaseException) -> bool:
    """Whether the same operation may well succeed if tried again: a lost connection
    (`connection_lost`), or a transaction the server rolled back for its own reasons (a
    serialization failure, a deadlock: SQLSTATE class 40). Every operation is idempotent."""
    return connection_lost(exc) or (isinstance(exc, psycopg.Error) and (exc.sqlstate or "").startswith("40"))
INDEX_BATCH = 5_000
"""Records the indexer puts in `cmdc_search` per transaction."""
INDEX_RETRIES = 8
"""Times the background indexer tries a batch again after losing its connection, before it
leaves the agent for later."""
INDEX_RETRY_DELAY = 0.1
INDEX_RETRY_MAX_DELAY = 5.0
"""The indexer's backoff: `INDEX_RETRY_DELAY` seconds, doubled at each retry, at most this
(about 16 s over all 8 retries)."""
INDEX_LAG_MAX = 20_000
"""Records a journal may hold past its indexed mark: a batch that leaves more (its writer outruns
the indexer) is indexed in part by its writer, as many as it wrote or as the excess, whichever
is fewer, so the lag stays within this bound."""
ANALYZE_MIN = 10_000
"""Records this store indexes before it runs `ANALYZE` on the search and record tables: the
first time past this many, then each time past as many as the search table held at its last
analysis (each time its size doubles). Without statistics on freshly filled tables the planner
reads a large journal's search rows through their primary key (every row of the agent) instead
of the GIN index: hundreds of milliseconds a search at a million records, against one. The
server's autovacuum analyzes them too, but only a minute or more later."""


_SECRETS: tuple[str, ...] = ()
"""The secret values of every store URL this process made a store for (`cmdc._redact`), longest
first: taken out of the driver's log records, which do not know which store they concern.
Replaced whole (under `_SECRETS_LOCK`), so the driver's threads read it without a lock."""
_SECRETS_LOCK = threading.Lock()


def _remember_secrets(url: str) -> None:
    global _SECRETS
    found = secrets_of(url)
    if found and not set(found) <= set(_SECRETS):
        with _SECRETS_LOCK:
            _SECRETS = tuple(sorted(set(_SECRETS) | set(found), key=len, reverse=True))


class _DriverLog(logging.Handler):
    """psycopg's and psycopg_pool's log records ("error connecting in 'pool-1'", "discarding
    closed connection"), passed on to the logger `cmdc.postgres.driver` without the URLs'
    secrets. With no logging configured, Python prints a library's warnings to stderr; through
    cmdc's logger (a `NullHandler`) nothing is printed unless the application asked for logs."""

    target = logging.getLogger("cmdc.postgres.driver")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if not self.target.isEnabledFor(record.levelno):
                return
            text = record.getMessage()
            for secret in _SECRETS:
                text = text.replace(secret, REDACTED)
            self.target.log(record.levelno, "%s: %s", record.name, text)
        except Exception:  # logging never breaks the store
            return


def _quiet_driver() -> None:
    """Route the driver's loggers through `_DriverLog`, unless the application gave the
    `psycopg` logger handlers of its own (then its set-up is kept as it is)."""
    driver = logging.getLogger("psycopg")
    if driver.handlers:
        return
    driver.addHandler(_DriverLog())
    driver.propagate = False


_quiet_driver()


def is_postgres_url(value: object) -> bool:
    return isinstance(value, str) and value.startswith(("postgresql://", "postgres://"))


def redact(url: str) -> str:
    """The URL without its secrets, for messages and reprs (`cmdc._redact.redact_url`)."""
    return redact_url(url)


def _search_text(message: Message) -> str:
    """The record's `body`: what its search vector is made of (`_searchable`)."""
    parts = [message.text]
    for call in message.tool_calls:
        parts += [call.name, orjson.dumps(call.to_dict()["arguments"]).decode()]
    text = _searchable(" ".join(parts) if len(parts) > 1 else parts[0])  # a huge text is not copied for nothing
    return text.replace("\x00", " ") if "\x00" in text else text


_BASE64 = re.compile(f"[A-Za-z0-9+/=_-]{{{BASE64_RUN},}}")
_BASE64_CHARS = re.compile(r"[A-Za-z0-9+/=_-]*")


def _searchable(text: str) -> str:
    """The first `SEARCH_PREFIX_CHARS` characters of `text` once its base64 runs (`BASE64_RUN`)
    are each replaced by a space. The work is bounded by the prefix and the runs it skips: the
    rest of a huge text is not read."""
    if len(text) <= BASE64_RUN:
        return text
    out: list[str] = []
    pos, left, n = 0, SEARCH_PREFIX_CHARS, len(text)
    while left > 0 and pos < n:
        end = min(n, pos + left)
        run = _BASE64.search(text, pos, end)
        if run is None:
            out.append(text[pos:end])
            left -= end - pos
            pos = end
            continue
        out.append(text[pos : run.start()])
        out.append(" ")
        left -= run.start() - pos + 1
        tail = _BASE64_CHARS.match(text, run.end())
        pos = tail.end() if tail is not None else run.end()  # the run goes on past the window
    return "".join(out)


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


class PostgresStore(CheckpointRows, LeaseRows):
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
        self._averages: dict[str, tuple[int, float]] = {}  # agent -> (seq, mean record length in words)
        self.background_index = flag(background_index, "background_index")
        # the indexer: a plain thread that exists while it has work (agents to index, or the
        # scan for a backlog left by an earlier process), started and ended under `_index_lock`
        self._index_lock = threading.Lock()
        self._index_queue: dict[str, int] = {}  # agents to index, in order: requests so far
        self._index_scan = False
        self._index_stop = False
        self._index_thread: threading.Thread | None = None
        self._index_wake = threading.Event()  # set by aclose: a retrying indexer stops waiting
        if on_event is not None and not callable(on_event):
            raise ConfigError(f"on_event must be a callable taking an Event, got {on_event!r:.80}")
        self.on_event = on_event
        # `ANALYZE` (see `ANALYZE_MIN`): records indexed since the last one, the search table's
        # rows then; both under `_index_lock`
        self._unanalyzed = 0
        self._analyzed_rows = 0
        self._can_clean = True  # whether this role may clean the GIN index's pending list (`_clean_pending`)

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
            with conn.transaction():  # what the server knows of the search table's statistics
                row = conn.execute(
                    "SELECT c.reltuples, coalesce(s.n_mod_since_analyze, 0) FROM pg_class c "
                    "LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = 'cmdc_search'::regclass"
                ).fetchone()
        if row is not None:
            with self._index_lock:
                self._analyzed_rows = max(0, int(row[0]))  # -1: never analyzed
                self._unanalyzed = max(self._unanalyzed, int(row[1]))

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
        with self._index_lock:
            self._index_stop = True
            thread = self._index_thread
        self._index_wake.set()
        if thread is not None:
            await trio.to_thread.run_sync(thread.join, self.timeout)
        await trio.to_thread.run_sync(self._pool.close)
        with self._index_lock:
            self._index_stop = False
            self._index_queue.clear()
        self._index_wake.clear()
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

    # -- the search index ---------------------------------------------------------------------------
    # A journal batch commits its records without search vectors: computing them and updating
    # the GIN index cost several times the rest of the write. The indexer puts them in
    # `cmdc_search` once the batch is committed (at once with `append(commit=True)`; otherwise
    # after `commit` or the checkpoint that commits it: a compaction's attempt is indexed when
    # the compaction ends, not while it runs), a batch of records per transaction, and moves
    # the agent's `indexed_seq` past them in the same transaction. A search reads `cmdc_search` up to
    # `indexed_seq` through the index and the few records past it directly, with the same
    # vector and rank: the lag only costs a search time, never a result.
    async def index(self, agent_id: str | None = None) -> int:
        """Index the agent's records (every agent's, with None) that are not yet in the search
        index, now; return how many. The background indexer does this on its own."""
        if agent_id is not None:
            validate_agent_id(agent_id)
        agents = [agent_id] if agent_id is not None else await self._run(self._backlog_sync)
        done = 0
        for agent in agents:
            more = True
            while more:  # a batch per operation: each within `timeout`
                n, more = await self._run(self._index_sync, agent, INDEX_BATCH, write=True)
                done += n
        try:
            await self._run(self._analyze_sync, write=True)
        except (StoreUnavailable, StoreRefused, psycopg.Error) as exc:  # the index is done; the statistics wait
            logger.warning("cmdc PostgreSQL store: ANALYZE: %s: %s", type(exc).__name__, self._scrub(exc))
        return done

    def _analyze_sync(self, conn: psycopg.Connection[Any]) -> bool:
        """`ANALYZE` the search and record tables when this store has indexed enough records
        since it last did (see `ANALYZE_MIN`); return whether it did. A lock held by another
        analysis (another store's) skips this one and keeps the count, so the next batch tries
        again (autovacuum's gives way). A role that does not own the tables gets the server's
        warning and no statistics (autovacuum still makes them)."""
        with self._index_lock:
            count = self._unanalyzed
            if count < max(ANALYZE_MIN, self._analyzed_rows):
                return False
            self._unanalyzed = 0  # claimed: a concurrent caller does not analyze again
        try:
            with conn.transaction():
                conn.execute("SET LOCAL lock_timeout = '2s'")  # autovacuum gives way after 1 s
                conn.execute("ANALYZE cmdc_search, cmdc_records")
                row = conn.execute("SELECT reltuples FROM pg_class WHERE oid = 'cmdc_search'::regclass").fetchone()
        except BaseException as exc:
            with self._index_lock:
                self._unanalyzed += count
            if isinstance(exc, psycopg.errors.LockNotAvailable):
                return False  # another analysis of these tables runs now
            raise
        with self._index_lock:
            self._analyzed_rows = max(0, int(row[0])) if row is not None else 0
        return True

    @staticmethod
    def _backlog_sync(conn: psycopg.Connection[Any]) -> list[str]:
        with conn.transaction():
            return [str(a) for (a,) in conn.execute("SELECT agent_id FROM cmdc_journals WHERE indexed_seq < seq")]

    def _clean_pending(self, conn: psycopg.Connection[Any]) -> None:
        """Move the GIN index's pending list into its tree (`gin_clean_pending_list`), in the
        indexer's transaction: a search reads the whole list, and the server's own clean-ups
        (at `gin_pending_list_limit`, by autovacuum) give way to each other, so it grew to
        thousands of pages (25 ms a lookup at a million records). A role that does not own the
        index cannot: the list is then left to the server."""
        if not self._can_clean:
            return
        try:
            with conn.transaction():  # a savepoint: the batch stands whatever happens here
                conn.execute("SELECT gin_clean_pending_list('cmdc_search_words'::regclass)")
        except psycopg.errors.InsufficientPrivilege:
            self._can_clean = False

    def _index_sync(self, conn: psycopg.Connection[Any], agent_id: str, batch: int) -> tuple[int, bool]:
        """Index the agent's next records past its `indexed_seq` (at most `batch`), in one
        transaction; return how many, and whether more are left. Every record up to the
        journal's committed `seq` has committed (they commit together). Indexers of one agent
        take turns (an advisory lock), so none computes vectors another is writing; the
        vectors are inserted once whatever happens (ON CONFLICT), and the mark only grows."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_INDEX_LOCK_CLASS, agent_id))
            row = conn.execute("SELECT indexed_seq, seq FROM cmdc_journals WHERE agent_id = %s", (agent_id,)).fetchone()
            if row is None or int(row[0]) >= int(row[1]):
                return 0, False
            lo, top = int(row[0]), int(row[1])
            done = conn.execute(
                "WITH b AS (SELECT r.agent_id, r.seq, "
                + _VECTOR.format(r="r")
                + " AS words FROM cmdc_records r WHERE r.agent_id = %s AND r.seq > %s AND r.seq <= %s "
                "ORDER BY r.seq LIMIT %s), "
                "i AS (INSERT INTO cmdc_search (agent_id, seq, words) SELECT * FROM b ON CONFLICT DO NOTHING "
                "RETURNING words), "
                "t AS (INSERT INTO cmdc_terms (agent_id, word, n) SELECT %s, u.lexeme, count(*) "
                "FROM i, unnest(i.words) u GROUP BY u.lexeme "
                "ON CONFLICT (agent_id, word) DO UPDATE SET n = cmdc_terms.n + excluded.n) "
                "SELECT count(*), max(seq) FROM b",
                (agent_id, lo, top, batch, agent_id),
            ).fetchone()
            assert done is not None
            n = int(done[0])
            if n:
                self._clean_pending(conn)
            more = n >= batch  # else every number up to `top` is covered (gaps hold no record)
            conn.execute(
                "UPDATE cmdc_journals SET indexed_seq = greatest(indexed_seq, %s) WHERE agent_id = %s",
                (int(done[1]) if more else top, agent_id),
            )
        with self._index_lock:
            self._unanalyzed += n
        return n, more

    def _index_later(self, agents: Collection[str], *, scan: bool = False) -> None:
        """Queue agents (and with `scan`, the search for a backlog) for the indexer thread,
        starting it when none runs."""
        with self._index_lock:
            if self._index_stop:
                return
            for agent in agents:
                self._index_queue[agent] = self._index_queue.get(agent, 0) + 1
            self._index_scan = self._index_scan or scan
            if self._index_thread is None:
                self._index_thread = threading.Thread(target=self._indexer, name="cmdc-postgres-indexer", daemon=True)
                self._index_thread.start()

    def _indexer(self) -> None:
        """The indexer thread: one batch at a time, until nothing is queued or the store closes.
        A batch that lost its connection (`connection_lost`) is tried again after a backoff
        (`INDEX_RETRIES` times at most, an `index_retry` event each); any other failure, or
        the last retry's, leaves the agent for later (the next batch of that agent, or the
        next store that opens the database, indexes it) with an `index_failed` event. Searches
        find its records meanwhile."""
        failures = 0  # in a row, for the agent at the queue's head
        while True:
            with self._index_lock:
                scan = self._index_scan
                agent = None if scan or not self._index_queue else next(iter(self._index_queue))
                asked = 0 if agent is None else self._index_queue[agent]
                if self._index_stop or (agent is None and not scan):
                    self._index_thread = None
                    return
                self._index_scan = False
            try:
                with self._pool.connection() as conn:
                    if scan:
                        found = self._backlog_sync(conn)
                        with self._index_lock:
                            for a in found:
                                self._index_queue.setdefault(a, 0)
                        continue
                    assert agent is not None
                    more = self._index_sync(conn, agent, INDEX_BATCH)[1]
                    try:
                        self._analyze_sync(conn)
                    except psycopg.Error as exc:  # the index is fine; the planner's statistics wait
                        logger.warning("cmdc PostgreSQL indexer: ANALYZE: %s: %s", type(exc).__name__, self._scrub(exc))
            except Exception as exc:  # the thread must not die with work queued
                failures += 1
                if retryable(exc) and failures <= INDEX_RETRIES:
                    delay = min(INDEX_RETRY_MAX_DELAY, INDEX_RETRY_DELAY * 2 ** (failures - 1))
                    self._index_event(INDEX_RETRY, agent, attempt=failures, delay=delay, error=type(exc).__name__)
                    with self._index_lock:
                        self._index_scan = self._index_scan or scan  # the scan is tried again too
                    self._index_wake.wait(delay)  # aclose cuts the wait short
                    continue
                logger.warning("cmdc PostgreSQL indexer: %s: %s (left for later)", type(exc).__name__, self._scrub(exc))
                self._index_event(INDEX_FAILED, agent, attempts=failures, error=type(exc).__name__)
                more = False
            failures = 0
            if agent is not None and not more:
                with self._index_lock:  # unless asked again meanwhile (a batch committed since)
                    if self._index_queue.get(agent) == asked:
                        del self._index_queue[agent]

    def _index_event(self, kind: str, agent: str | None, **data: Any) -> None:
        """An indexer event: to `on_event`, if given, and to the log (never raises)."""
        event = Event(kind, agent, data)
        emit(self.on_event, event)
        log_event(event)

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
        rows = [(m.id, *_message_bytes(m), _search_text(m)) for m in messages]
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
        if lag > INDEX_LAG_MAX:  # the writer outruns the indexer: it indexes as much as it wrote
            try:
                left = min(len(fresh), lag - INDEX_LAG_MAX)
                while left > 0:
                    n, more = self._index_sync(conn, agent_id, min(left, INDEX_BATCH))
                    left = left - n if more else 0
            except psycopg.Error as exc:  # the batch has committed: the indexing is left for later
                logger.warning("cmdc PostgreSQL indexer: %s: %s (left for later)", type(exc).__name__, self._scrub(exc))
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

    _VISIBLE = (
        "SELECT r.seq, r.compaction, r.ts, r.message, r.crc FROM cmdc_records r "
        "JOIN cmdc_attempts a ON a.agent_id = r.agent_id AND a.attempt = r.attempt AND a.committed "
        "WHERE r.agent_id = %s"
    )

    @staticmethod
    def _decode(rows: Sequence[tuple[Any, ...]], max_chars: int | None = None) -> tuple[list[JournalRecord], list[int]]:
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

    def _records_sync(self, conn: psycopg.Connection[Any], agent_id: str, lo: int, hi: int) -> list[tuple[Any, ...]]:
        with conn.transaction():
            query = self._VISIBLE + " AND r.seq BETWEEN %s AND %s ORDER BY r.seq"
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
        return (await trio.to_thread.run_sync(self._decode, rows[::-1], max_chars))[0]

    def _last_sync(self, conn: psycopg.Connection[Any], agent_id: str, n: int) -> list[tuple[Any, ...]]:
        with conn.transaction():
            query = self._VISIBLE + " ORDER BY r.seq DESC LIMIT %s"
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
            span = self._VISIBLE.replace("r.seq, r.compaction, r.ts, r.message, r.crc", wanted)
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
        return (await trio.to_thread.run_sync(self._decode, rows, max_chars))[0]

    async def search(
        self, agent_id: str, query: str, limit: int = 10, *, max_chars: int | None = None
    ) -> list[JournalRecord]:
        """Visible records holding words of `query` (case-insensitive; its first 64 distinct
        words; an identifier with `/ . _ -` counts whole and by its parts), best first, at most
        `limit`, ranked as the file store ranks them (`cmdc.store.search.bm25`: rare words outweigh
        common ones, an exact identifier or the query's words in a row rank first, a summary's
        score counts half).

        The work is bounded, whatever the journal's size or the words' frequency: the GIN
        index gives the candidates, at most `SEARCH_CANDIDATES` records holding *every* query
        word, then at most `SEARCH_CANDIDATES` more holding *any* of them, read from their
        search vectors alone; each word's rarity is read from `cmdc_terms` (a word the search
        configuration splits is counted through the index, up to `SEARCH_DF_MAX` records). The
        candidates are ranked by BM25 over their words as the file store's index reads them,
        their messages read best bound first (`_Bound`: the score a vector allows), a batch at a
        time, until no candidate left can beat the last of the best: most searches read one
        batch. A journal of at most `SEARCH_NARROW_BELOW` records is searched through its
        agent's lexeme in the index, so other agents' matches are never read; a larger one by
        its words alone. Records not in the index yet (the indexer's lag) are matched directly,
        with the same vector; more than `SEARCH_UNINDEXED_MAX` of them are indexed first. When
        more records match than the candidates, the ones ranked are those the index hands out
        first, not necessarily the best of all: a more specific query narrows it."""
        validate_agent_id(agent_id)
        integer(limit, "search limit")
        if max_chars is not None:
            integer(max_chars, "max_chars", minimum=0)
        text = query[:MAX_QUERY_CHARS]
        if not _ranking.query_terms(text)[0] or not limit:
            return []
        args = (agent_id, text, limit, max_chars)
        found: list[JournalRecord] | None = await self._run(self._search_decoded, *args)
        while found is None:  # its writers keep the lag lower: this ends
            await self.index(agent_id)
            found = await self._run(self._search_decoded, *args)
        return found

    _HOLDS_WORD = (
        "SELECT EXISTS (SELECT 1 FROM cmdc_search WHERE agent_id = %(agent)s "
        "AND words @@ {match}) OR EXISTS (SELECT 1 FROM cmdc_records r "
        "WHERE r.agent_id = %(agent)s AND r.seq > (SELECT indexed_seq FROM cmdc_journals WHERE agent_id = %(agent)s) "
        "AND " + _VECTOR.format(r="r").replace("{", "{{").replace("}", "}}") + " @@ to_tsquery('simple', %(q)s))"
    )

    def _holds_word(self, conn: psycopg.Connection[Any], agent_id: str, word: str, narrow: bool) -> bool:
        """Whether any record of the agent holds `word` (as the file store's index tells it);
        `narrow`: through the agent's lexeme, as `_search_sync` chooses."""
        args = {"agent": agent_id, "q": _lexeme(word), "mine": f"'cmdc agent={agent_id}'"}
        match = "(to_tsquery('simple', %(q)s) && %(mine)s::tsquery)" if narrow else "to_tsquery('simple', %(q)s)"
        row = conn.execute(self._HOLDS_WORD.format(match=match), args).fetchone()
        return bool(row and row[0])

    def _search_decoded(
        self,
        conn: psycopg.Connection[Any],
        agent_id: str,
        text: str,
        limit: int,
        max_chars: int | None,
    ) -> list[JournalRecord] | None:
        """The search, in one worker thread's turn: the query's terms (a word no record holds
        by its forms), the words' rarity (`cmdc_terms`), the candidates (`_candidates`), and the
        best of them by BM25 over their words as the file store's index reads them. A
        candidate's message is read only while it can still rank among the best: the candidates
        are taken best bound first (`_bound`), a batch at a time, until the next one's bound
        cannot beat the last of the `limit` best found."""
        with conn.transaction():
            # one snapshot: the mark, the word counts, the vectors and the records agree (the
            # indexer moves the mark and adds the vectors and their counts in one transaction);
            # no parallel workers: starting one costs more than the few hundred rows it would share
            conn.execute(
                "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY; "
                "SET LOCAL max_parallel_workers_per_gather = 0"
            )
            size = conn.execute("SELECT seq FROM cmdc_journals WHERE agent_id = %s", (agent_id,)).fetchone()
            narrow = size is None or int(size[0]) <= SEARCH_NARROW_BELOW
            terms, phrase = _ranking.query_terms(text, lambda word: self._holds_word(conn, agent_id, word, narrow))
            terms = terms[:MAX_QUERY_WORDS]
            # a word's forms are one group (they share its stem): the records holding every word in
            # some form come first, then those holding any; a phrase term only ranks (its words find it)
            groups: dict[str, list[str]] = {}
            for term in terms:
                if " " not in term:
                    groups.setdefault(_ranking.stem(term), []).append(_lexeme(term))
            every = " & ".join(g[0] if len(g) == 1 else "(" + " | ".join(g) + ")" for g in groups.values())
            some = " | ".join(lexeme for g in groups.values() for lexeme in g)
            return self._search_snapshot(conn, agent_id, every, some, terms, phrase, limit, max_chars)

    def _search_snapshot(
        self,
        conn: psycopg.Connection[Any],
        agent_id: str,
        every: str,
        some: str,
        terms: list[str],
        phrase: str | None,
        limit: int,
        max_chars: int | None,
    ) -> list[JournalRecord] | None:
        quoted = [_lexeme(t) for t in terms]
        args = {"agent": agent_id, "terms": terms, "quoted": quoted}
        total = conn.execute(self._MARK_AND_COUNTS, args).fetchone()
        if total is None:
            return []
        top, indexed = int(total[0]), int(total[1])
        if top - indexed > SEARCH_UNINDEXED_MAX:
            return None  # a backlog (left by a process that died): the caller indexes it first
        counted = {t: min(int(c), SEARCH_DF_MAX) for t, c in zip(terms, total[2], strict=True) if c is not None}
        single = set(counted)  # the words the configuration keeps as one lexeme each
        average = self._average_length(conn, agent_id, top)
        late, bounds = self._candidates(conn, agent_id, every, some, terms, indexed, top)
        docs = [(row, _ranked_words(bytes(row[3]))) for row in late]  # past the mark: read whole
        kept = [(row, doc) for row, doc in docs if doc is not None]

        def count(term: str) -> int:
            """The records holding `term` (or the phrase): in the index, then past the mark."""
            tsq = " <-> ".join(_lexeme(w) for w in term.split())
            row = conn.execute(self._FREQUENCY, {"agent": agent_id, "q": tsq, "cap": SEARCH_DF_MAX}).fetchone()
            if " " in term:
                return (int(row[0]) if row else 0) + sum(1 for _, doc in kept if _ranking.holds_phrase(doc[0], term))
            return (int(row[0]) if row else 0) + sum(1 for _, doc in kept if term in doc[0])

        for term in terms:
            if term in counted:  # past the mark: counted among the candidates
                counted[term] += sum(1 for _, doc in kept if term in doc[0])
            else:
                counted[term] = count(term)
        n = max(top, len(kept) + len(bounds))

        def frequency(term: str) -> int:
            if term not in counted:  # the phrase: counted once some candidate holds it
                counted[term] = count(term)
            return counted[term]

        def scored(pairs: list[tuple[Any, tuple[list[str], bool]]]) -> list[tuple[float, int, Any]]:
            # the phrase adds nothing to a record that does not hold it: left out, the same scores
            held = phrase if phrase is not None and any(_ranking.holds_phrase(d[0], phrase) for _, d in pairs) else None
            values = _ranking.bm25([doc for _, doc in pairs], terms, held, n, frequency, average)
            return [(-value, int(row[0]), row) for (row, _), value in zip(pairs, values, strict=True)]

        best = scored(kept)
        # the phrase's bound, while it is not counted, as if no record held it (its rarest possible)
        bound = _Bound(terms, single, phrase, n, lambda t: counted.get(t, 0), average)
        order = sorted((-bound(tfs, length), seq) for seq, length, tfs in bounds)
        want = limit + 8  # a few spare, should one be damaged
        batch = 32
        while order:
            best.sort(key=lambda s: s[:2])
            if len(best) >= want and order[0] > best[want - 1][:2]:
                break  # no candidate left can rank among the best
            seqs = [seq for _, seq in order[:batch]]
            del order[:batch]
            batch = min(batch * 2, SEARCH_CANDIDATES)
            rows = conn.execute(self._VISIBLE + " AND r.seq = ANY(%s)", (agent_id, seqs), binary=True).fetchall()
            fetched = [(row, _ranked_words(bytes(row[3]))) for row in rows]
            best += scored([(row, doc) for row, doc in fetched if doc is not None])
        best.sort(key=lambda s: s[:2])
        return self._decode([row for _, _, row in best[:want]], max_chars)[0][:limit]

    _MARK_AND_COUNTS = (
        "SELECT j.seq, j.indexed_seq, ARRAY(SELECT CASE WHEN to_tsquery('simple', u.quoted)::text = u.quoted THEN "
        "coalesce((SELECT c.n FROM cmdc_terms c WHERE c.agent_id = %(agent)s AND c.word = u.term), 0) END "
        "FROM unnest(%(terms)s::text[], %(quoted)s::text[]) WITH ORDINALITY AS u(term, quoted, i) ORDER BY u.i) "
        "FROM cmdc_journals j WHERE j.agent_id = %(agent)s"
    )
    """The agent's journal mark, and each query word's count of its indexed records holding it,
    from `cmdc_terms`; NULL for a word the search configuration does not keep as that one lexeme
    (an identifier it splits, a character it drops): that one is counted through the index
    (`_FREQUENCY`)."""

    _FREQUENCY = (
        "SELECT count(*) FROM (SELECT 1 FROM cmdc_search WHERE agent_id = %(agent)s "
        "AND words @@ to_tsquery('simple', %(q)s) LIMIT %(cap)s) f"
    )

    def _average_length(self, conn: psycopg.Connection[Any], agent_id: str, seq: int) -> float:
        """The mean length in words of the agent's records, from its latest `_AVERAGE_SAMPLE`
        (learned again when the journal grew by a tenth)."""
        known = self._averages.get(agent_id)
        if known is not None and seq - known[0] <= max(64, known[0] // 10):
            return known[1]
        rows = conn.execute(
            "SELECT seq, 0, 0, message, crc FROM cmdc_records WHERE agent_id = %s ORDER BY seq DESC LIMIT %s",
            (agent_id, _AVERAGE_SAMPLE),
            binary=True,
        ).fetchall()
        sample = self._decode(rows, _ranking.TEXT_CHARS)[0]
        lengths = [len(_ranking.tokens(_ranking.record_text(r.message))) for r in sample]
        average = sum(lengths) / len(lengths) if lengths else 1.0
        if len(self._averages) > 10_000:
            self._averages.clear()
        self._averages[agent_id] = (seq, average)
        return average

    # The candidates in the index, by their vectors alone (each one's length and occurrences of
    # the query words are read from its text form, `_vector_counts`); the message is read later,
    # if the candidate can rank among the best.
    _INDEXED = (
        "SELECT s.seq, s.words::text, {stage} FROM cmdc_search s WHERE s.agent_id = %(agent)s "
        "AND s.seq <= %(indexed)s AND s.words @@ {match} {extra}LIMIT %(cap)s"
    )
    _NOT_EVERY = "AND NOT s.words @@ to_tsquery('simple', %(every)s) "
    # Those past the mark (not indexed yet: the indexer's lag, a batch or so), matched by the
    # same vector, visible ones only, read whole.
    _LATE = (
        "SELECT r.seq, r.compaction, r.ts, r.message, r.crc FROM cmdc_records r "
        "JOIN cmdc_attempts a ON a.agent_id = r.agent_id AND a.attempt = r.attempt AND a.committed, "
        "LATERAL (SELECT " + _VECTOR.format(r="r") + " AS words) v "
        "WHERE r.agent_id = %(agent)s AND r.seq > %(indexed)s AND v.words @@ to_tsquery('simple', %(q)s) "
        "ORDER BY r.seq LIMIT %(cap)s"
    )

    def _candidates(
        self,
        conn: psycopg.Connection[Any],
        agent_id: str,
        every: str,
        some: str,
        terms: list[str],
        indexed: int,
        top: int,
    ) -> tuple[list[Any], list[tuple[int, int, list[int]]]]:
        """The rows past the mark holding any query word (whole, at most `SEARCH_CANDIDATES`),
        and the indexed candidates as (seq, length, occurrences of each word): at most
        `SEARCH_CANDIDATES` holding every word, then as many more holding any. A small journal
        is searched through its agent's lexeme in the index: other agents' matches are never
        read, and the lexeme's own entries are few. A large one by its words alone (its
        lexeme's entries would cost more to read than the other agents' matches the filter
        drops, which its own matches outnumber)."""
        cap = SEARCH_CANDIDATES
        late: list[Any] = []
        if top > indexed:
            past = {"agent": agent_id, "indexed": indexed, "q": some, "cap": cap}
            late = conn.execute(self._LATE, past, binary=True).fetchall()
        narrow = top <= SEARCH_NARROW_BELOW
        match = "to_tsquery('simple', %({q})s)"
        if narrow:
            match = f"({match} && %(mine)s::tsquery)"
        args: dict[str, Any] = {
            "every": every,
            "agent": agent_id,
            "indexed": indexed,
            "mine": f"'cmdc agent={agent_id}'",  # agent ids hold no quote or backslash
            "cap": cap,
        }
        if every == some:
            one = self._INDEXED.format(match=match.format(q="every"), extra="", stage=0)
            found = conn.execute(one, args).fetchall()
        else:  # those holding every word, then as many more holding any (one statement: one round trip)
            args["some"] = some
            both = (
                "(" + self._INDEXED.format(match=match.format(q="every"), extra="", stage=0) + ") UNION ALL ("
                + self._INDEXED.format(match=match.format(q="some"), extra=self._NOT_EVERY, stage=1) + ")"
            )
            rows = conn.execute(both, args).fetchall()
            found = [r for r in rows if r[2] == 0]
            found += [r for r in rows if r[2] == 1][: cap - len(found)]
        return late, [(int(row[0]), *_vector_counts(str(row[1]), terms)) for row in found]

    async def verify(self, agent_id: str) -> StoreReport:
        """Check every row of the agent's journal (its checksum, its message)."""
        validate_agent_id(agent_id)
        journal, rows, compactions, uncommitted = await self._run(self._verify_sync, agent_id)
        records, damaged = await trio.to_thread.run_sync(self._decode, rows, _bigjson.BIG)  # texts not built whole
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
            rows = conn.execute(self._VISIBLE + " ORDER BY r.seq", (agent_id,), binary=True).fetchall()
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
