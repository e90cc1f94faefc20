"""The PostgreSQL store's search index: derived from the journal, never its source of truth.

A journal batch commits its records without search vectors: computing them and updating the GIN
index cost several times the rest of the write. The indexer puts them in `cmdc_search` once the
batch is committed (at once with `append(commit=True)`; otherwise after `commit` or the
checkpoint that commits it: a compaction's attempt is indexed when the compaction ends, not
while it runs), a batch of records per transaction, keeps each word's count of records per agent
in `cmdc_terms` in the same transaction, and moves the agent's `indexed_seq` past them. A search
(`search.py`) reads `cmdc_search` up to `indexed_seq` through the index and the few records past
it directly, with the same vector: the lag only costs a search time, never a result.

Here: the vector a record gets (`VECTOR`, from the `body` text `search_text` makes), the
indexer thread and its batches (`IndexRows`), the GIN index's pending list, and `ANALYZE` of the
search and record tables once enough records were indexed (`ANALYZE_MIN`).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
import psycopg
import trio

from ...errors import StoreRefused, StoreUnavailable
from ...events import INDEX_FAILED, INDEX_RETRY, Event, EventSink, emit, log_event, logger
from ...message import Message
from ...state import validate_agent_id
from .driver import retryable

T = TypeVar("T")

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
SEARCHED = (
    "left(regexp_replace(left({r}.body, " + str(SEARCH_SCAN_CHARS) + "), "
    "'[A-Za-z0-9+/=_-]{{"
    + str(BASE64_RUN - 1)
    + "}}[A-Za-z0-9+/=_-]+', ' ', 'g'), "  # a count is at most 255
    + str(SEARCH_PREFIX_CHARS)
    + ")"
)
VECTOR = "(to_tsvector('simple', " + SEARCHED + ") || array_to_tsvector(ARRAY['cmdc agent=' || {r}.agent_id]))"
"""A record's search vector: the words of its bounded text (`SEARCHED`), and the agent as a
lexeme no text can produce (it holds a space), so the GIN index can find one agent's matches
without reading other agents' rows."""
_INDEX_LOCK_CLASS = 0x636D6469  # with the agent's hash: the lock indexers of one agent take turns on ("cmdi")
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


def search_text(message: Message) -> str:
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


class IndexRows:
    """`PostgresStore`'s search index: `index()`, the indexer thread that fills it after each
    committed batch, and the statistics the planner needs to use it (`ANALYZE`)."""

    if TYPE_CHECKING:  # given by `PostgresStore`
        _pool: Any
        timeout: float
        background_index: bool
        on_event: EventSink | None

        async def _run(self, fn: Callable[..., T], *args: Any, write: bool = False) -> T: ...

        def _scrub(self, exc: BaseException | str) -> str: ...

    def _setup_index(self) -> None:
        """The indexer's state: a plain thread that exists while it has work (agents to index,
        or the scan for a backlog left by an earlier process), started and ended under
        `_index_lock`; and what `ANALYZE` waits for."""
        self._index_lock = threading.Lock()
        self._index_queue: dict[str, int] = {}  # agents to index, in order: requests so far
        self._index_scan = False
        self._index_stop = False
        self._index_thread: threading.Thread | None = None
        self._index_wake = threading.Event()  # set by aclose: a retrying indexer stops waiting
        # `ANALYZE` (see `ANALYZE_MIN`): records indexed since the last one, the search table's
        # rows then; both under `_index_lock`
        self._unanalyzed = 0
        self._analyzed_rows = 0
        self._can_clean = True  # whether this role may clean the GIN index's pending list (`_clean_pending`)

    def _read_statistics(self, conn: psycopg.Connection[Any]) -> None:
        """What the server knows of the search table's statistics (when the store opens)."""
        with conn.transaction():
            row = conn.execute(
                "SELECT c.reltuples, coalesce(s.n_mod_since_analyze, 0) FROM pg_class c "
                "LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = 'cmdc_search'::regclass"
            ).fetchone()
        if row is not None:
            with self._index_lock:
                self._analyzed_rows = max(0, int(row[0]))  # -1: never analyzed
                self._unanalyzed = max(self._unanalyzed, int(row[1]))

    async def _stop_indexer(self) -> None:
        """Stop the indexer after the batch it is on (waiting `timeout` at most), and forget
        what was queued: the next store that opens the database indexes it."""
        with self._index_lock:
            self._index_stop = True
            thread = self._index_thread
        self._index_wake.set()
        if thread is not None:
            await trio.to_thread.run_sync(thread.join, self.timeout)

    def _indexer_stopped(self) -> None:
        """Ready to start again (the store's pool is closed)."""
        with self._index_lock:
            self._index_stop = False
            self._index_queue.clear()
        self._index_wake.clear()

    def _keep_up(self, conn: psycopg.Connection[Any], agent_id: str, written: int, lag: int) -> None:
        """After a committed batch of `written` records that left the journal `lag` records past
        its indexed mark: a writer that outruns the indexer (past `INDEX_LAG_MAX`) indexes as
        much as it wrote, or the excess, whichever is fewer."""
        if lag <= INDEX_LAG_MAX:
            return
        try:
            left = min(written, lag - INDEX_LAG_MAX)
            while left > 0:
                n, more = self._index_sync(conn, agent_id, min(left, INDEX_BATCH))
                left = left - n if more else 0
        except psycopg.Error as exc:  # the batch has committed: the indexing is left for later
            logger.warning("cmdc PostgreSQL indexer: %s: %s (left for later)", type(exc).__name__, self._scrub(exc))

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
                + VECTOR.format(r="r")
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


__all__ = [
    "ANALYZE_MIN",
    "BASE64_RUN",
    "INDEX_BATCH",
    "INDEX_LAG_MAX",
    "INDEX_RETRIES",
    "INDEX_RETRY_DELAY",
    "INDEX_RETRY_MAX_DELAY",
    "SEARCH_PREFIX_CHARS",
    "SEARCH_SCAN_CHARS",
    "VECTOR",
    "IndexRows",
    "search_text",
]
