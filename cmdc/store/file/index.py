"""The file store's index: a derived SQLite sidecar beside each journal (`<agent>.jsonl.index`,
its words in `<agent>.jsonl.words`).

It holds, for every message line of the journal up to its *mark* (a byte offset just past a
newline): the record's number, byte offset and length, message id, attempt, whether it is a
summary and whether readers see it (committed, the message's first committed record); the
committed attempts (with the batch each belongs to, for counting compactions); and, in the
second file (attached as `w`), an FTS5 table of each record's words, ranked by BM25. The two
are written beside each other by two connections, and kept paired (`_unpaired`). It is never
the source of truth:

- every reader first brings it up to the journal's end under the journal's shared lock
  (`catch_up`): what was appended since the mark is read from the journal then, so results
  are always exact, and a record of an uncommitted attempt is in the index but never visible;
- the store's writer pokes a background thread after an append or commit has changed the
  journal (never before, never on the append's own path); it indexes when the store is quiet;
- a missing, stale (another file at the path, a journal shorter than the mark, a different
  checksum of the bytes just before the mark) or damaged index (SQLite refuses it, another
  version) is rebuilt from the journal, with a `journal_index_rebuilt` event;
- a directory it cannot write in makes readers scan the journal as before (`IndexUnavailable`).

The sidecar's permissions are the journal's (0o600); a symlink or a hard link planted at its
name is removed (the file it points to is never opened) and the index is built anew. Every
call here is blocking: the store runs them in worker threads.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import inspect
import os
import re
import sqlite3
import stat
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec
import orjson

from ...errors import IndexUnavailable, InvalidMessage
from ...message import Message
from ..records import ATTEMPTS_KEY as _ATTEMPTS_KEY

# the words and the ranking both stores share (importable from here, as before they moved)
from ..search import COMPOUND as _COMPOUND
from ..search import K1 as K1
from ..search import LONGEST_COMPOUND as _LONGEST_COMPOUND
from ..search import MAX_QUERY_TERMS as MAX_QUERY_TERMS
from ..search import SUMMARY_WEIGHT as SUMMARY_WEIGHT
from ..search import TEXT_CHARS as TEXT_CHARS
from ..search import B as B
from ..search import bm25 as bm25
from ..search import holds_phrase as holds_phrase
from ..search import query_terms as query_terms
from ..search import record_text as record_text
from ..search import tokens as tokens
from .scan import _LEGACY_KEYS, _MESSAGE_KEYS, MAX_SEQ, _valid_id

if TYPE_CHECKING:
    pass

SUFFIX = ".index"
"""The sidecar's name: the journal's, with this appended."""
WORDS_SUFFIX = ".words"
"""The name of the sidecar's words (`words_path`): the journal's, with this appended."""
VERSION = 7
# 2: recs.comp (a record's compaction number: a compaction is a batch whose number moves);
# 3: FTS5 hashsize 64 MB, no index on recs.vis (the first and last visible records are found
# walking the record numbers from either end); 4: FTS5 automerge 8, recs_attempt of hidden
# records only; 5: recs_own_group; 6: the FTS5 table in a file of its own (`words_path`);
# 7: a text's words as the query's (`_body`: FTS5 kept a combining accent or a symbol in a word)
_CHUNK = 16 * 1024 * 1024  # journal bytes indexed per transaction
LOCKED_CATCH_UP = 1024 * 1024
"""Journal bytes past the mark a reader indexes under the journal's shared lock; more are indexed
before it takes the lock (writers are not held up by a long catch-up)."""
_TAIL = 64  # bytes before the mark whose checksum tells the journal is still the one indexed
_QUIET = 2.0  # seconds without a poke before the background thread indexes (the store is idle)
_LATEST = 30.0  # ... but no later than this after the first poke it has not served
_LINGER = 120.0  # an idle thread waits this long for more work before it ends
_WORD = re.compile(r"\w+")
_JOINED = re.compile(r"\w[/.-]")  # where an identifier may be

READS = {"bytes": 0, "records": 0}
"""Bytes read and records decoded for callers (tests check reads do not scan); the background
indexer's own reads are not counted (`counted`)."""
_BACKGROUND = threading.local()


def counted(kind: str, n: int) -> None:
    """Add `n` to `READS[kind]`, unless this is the background indexer's thread."""
    if not getattr(_BACKGROUND, "active", False):
        READS[kind] += n


"""Journal bytes read and records decoded through the index (for tests: reads that do not scan)."""


_NOT_WORD = re.compile(r"[^\w\x00-\x7f]+")  # (ASCII: FTS5 reads it as Python does)


def _body(folded: str) -> str:
    r"""The indexed text `folded` with every character past ASCII that is not a word character
    (Python's `\w`, as `tokens` reads a query) made a space: FTS5's tokenizer (Unicode 6.1)
    keeps combining accents (a decomposed `café`, the dot of `İ`), characters newer than
    Unicode 6.1 (most emoji) and private-use ones inside a word, so `build🥳passed` was one
    word no query found by `passed`. ASCII is read alike by both (and ASCII text left as it is: most text, no copy; on
    text of other letters alone, measured, a build took about 15% more CPU time)."""
    return folded if folded.isascii() else _NOT_WORD.sub(" ", folded)


def _quoted(term: str) -> str:
    return '"' + term.replace('"', '""') + '"'


def match_expression(terms: Sequence[str], phrase: str | None) -> str:
    """An FTS5 query matching any term, each a quoted string (never an operator); an identifier
    is matched whole in the `ids` column (see `_SEPARATORS`)."""
    parts = [_quoted(t.translate(_SEPARATORS)) for t in terms]
    if phrase is not None:
        parts.append(_quoted(phrase))
    return " OR ".join(parts)


# -- the sidecar -------------------------------------------------------------------------------

_SCHEMA = (
    "CREATE TABLE meta (k TEXT PRIMARY KEY, v)",
    "CREATE TABLE recs (seq INTEGER PRIMARY KEY, off INTEGER NOT NULL, len INTEGER NOT NULL, mid TEXT NOT NULL, "
    "attempt TEXT, summary INTEGER NOT NULL, vis INTEGER NOT NULL DEFAULT 0, grp TEXT, "
    "comp INTEGER NOT NULL DEFAULT 0)",
    "CREATE INDEX recs_mid ON recs (mid, vis)",
    # hidden records by batch: those of a batch not committed yet are all hidden (a rebuild
    # inserts most records visible, and so into no index of this)
    "CREATE INDEX recs_attempt ON recs (attempt) WHERE vis = 0",
    # the records of batches committed by a summary naming them (their group is their batch):
    # a commit line for one of them later moves them all, shown or not, to its group
    "CREATE INDEX recs_own_group ON recs (attempt) WHERE grp = attempt",
    "CREATE TABLE done (attempt TEXT PRIMARY KEY, grp TEXT NOT NULL)",
    "CREATE TABLE deps (attempt TEXT NOT NULL, dep TEXT NOT NULL)",
    "CREATE INDEX deps_attempt ON deps (attempt)",
)
_WORDS_SCHEMA = (
    "CREATE TABLE wmeta (k TEXT PRIMARY KEY, v)",
    "CREATE VIRTUAL TABLE fts USING fts5(body, ids, content='', "
    "tokenize=\"unicode61 remove_diacritics 0 tokenchars '_'\")",
)
_FTS_HASH = 64 * 1024 * 1024
"""Bytes of new terms FTS5 keeps in memory before it writes them out as a segment (its default,
1 MB, made a 8 MB chunk of the journal dozens of small segments, each merged again later: the
build took twice as long). A chunk's terms fit: one segment per transaction."""
_FTS_MERGE = 8
"""Segments of one size FTS5 lets pile up before it merges them into one (its default is 4): a
rebuild merges less often (about 10% faster), a search reads a few more segments."""
_WORDS_PAGE = 8192
_FTS_LEAF = 8000
"""The words' file's pages, and FTS5's leaves in them (`pgsz`; its default is 4050 bytes in
pages of 4 kB): a segment is half as many rows of its B-tree. Measured, a build of 1M records
went 81-84k records/s with 4 kB pages, 91-95k with 8 kB, 89-98k with 16 kB; 16 kB pages made
a small journal's words file twice the size (each of its tables takes a page at least)."""
_META_DEFAULTS = {"version": VERSION, "mark": 0, "last_seq": 0, "damaged": 0, "tail": 0, "inode": "", "count": 0}
_WORDS_DEFAULTS = {"version": VERSION, "pair": "", "mark": 0}


def index_path(journal: Path) -> Path:
    return journal.with_name(journal.name + SUFFIX)


def words_path(journal: Path) -> Path:
    """The index's words (its FTS5 table), in a file of their own: a rebuild writes them and the
    records at once, on two connections (SQLite writes a file from one at a time)."""
    return journal.with_name(journal.name + WORDS_SUFFIX)


def remove(journal: Path) -> None:
    """Remove the journal's index: both files, and SQLite's journals of them (a hot one left
    behind would be played back into the next file made at that name)."""
    for path in (index_path(journal), words_path(journal)):
        _unlink(path)


def _with_journal(path: Path) -> tuple[Path, Path]:
    """The SQLite file at `path` and its rollback journal."""
    return path, path.with_name(path.name + "-journal")


def _unlink(path: Path) -> None:
    for name in _with_journal(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def _safe(path: Path) -> str | None:
    """Why the file at `path` cannot be the index (a link; a file other users may read or write:
    what it says cannot be trusted, and its words are the journal's), after removing it; else
    None."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "a hard link" if st.st_nlink != 1 else "not a file"
        _unlink(path)  # the names only: the file a link leads to is never opened
        return f"{what} was at the index's name"
    if stat.S_IMODE(st.st_mode) & 0o077:
        _unlink(path)
        return f"the index's file was open to other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


class IndexConnection(sqlite3.Connection):
    """A connection to a journal's index, with its words attached as `w`: `words` is the words'
    file and `words_file` its (device, inode) when attached (a writer of the words opens that
    file and no other, see `_words_writer`)."""

    words: Path
    words_file: tuple[int, int]
    words_news: str | None  # what was wrong with the words' file when it was opened (made again)


def connect(journal: Path, events: list[tuple[str, dict[str, Any]]], known: bool = False) -> IndexConnection:
    """The journal's index, opened (created 0o600 when missing; remade when it is damaged or a
    link), its words' file attached. `known`: the caller saw this index before (one created now
    was missing: an event). Raises `IndexUnavailable` when it cannot be.

    The words' file is made here when missing; whether it holds the words of these records
    (the same pair token and mark) is checked by `catch_up`, which rebuilds both when not."""
    conn = _opened(index_path(journal), "meta", _create_records, events, known)
    words = words_path(journal)
    told: list[tuple[str, dict[str, Any]]] = []  # (told by `catch_up`, as the reason it rebuilds)
    try:
        _opened(words, "wmeta", _create_words, told, True, _WORDS_PAGE).close()
        conn.execute("ATTACH DATABASE ? AS w", (os.fspath(words),))
        conn.execute("PRAGMA w.cache_size=-32768")  # (an attached file has SQLite's default, 2 MB)
        st = os.stat(words)
    except (sqlite3.Error, OSError, IndexUnavailable) as exc:
        conn.close()
        raise IndexUnavailable(f"{words}: {exc}") from None
    conn.words, conn.words_file = words, (st.st_dev, st.st_ino)
    conn.words_news = f"its words file: {told[-1][1]['reason']}" if told else None
    return conn


def _opened(
    path: Path,
    table: str,
    create: Callable[[sqlite3.Connection], None],
    events: list[tuple[str, dict[str, Any]]],
    known: bool,
    page_size: int = 0,
) -> IndexConnection:
    """The SQLite file at `path`, opened (made with `create` when it has no `table`, with pages
    of `page_size` bytes when given; removed and made again when SQLite refuses it, or it is
    another version: an event). `known`: the caller saw it before (one made now was missing:
    an event)."""
    for attempt in range(2):
        try:
            why = _safe(path)
            created = not os.path.lexists(path)
            if created:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
                os.fchmod(fd, 0o600)
                os.close(fd)
            conn = sqlite3.connect(
                path, timeout=30.0, isolation_level=None, check_same_thread=False, factory=IndexConnection
            )
        except OSError as exc:
            raise IndexUnavailable(f"{path}: {exc}") from None
        try:
            if page_size:  # (before anything is written: a file made already keeps its own)
                conn.execute(f"PRAGMA page_size={int(page_size)}")
            _tune(conn)
            have = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
            if conn.execute(have, (table,)).fetchone() is None:
                _private(path)  # (SQLite makes a missing file with the umask's mode: one removed meanwhile)
                conn.execute("BEGIN IMMEDIATE")
                if conn.execute(have, (table,)).fetchone() is None:
                    create(conn)
                    if not created or why or known:
                        events.append(("rebuild", {"reason": why or "the index was missing or empty"}))
                conn.execute("COMMIT")
            else:
                version = conn.execute(f"SELECT v FROM {table} WHERE k = 'version'").fetchone()
                if version is None or version[0] != VERSION:
                    raise sqlite3.DatabaseError(f"index version {version and version[0]}, not {VERSION}")
            return conn
        except OSError as exc:
            conn.close()
            raise IndexUnavailable(f"{path}: {exc}") from None
        except sqlite3.Error as exc:
            conn.close()
            if attempt:
                raise IndexUnavailable(f"{path}: {exc}") from None
            events.append(("rebuild", {"reason": f"the index was damaged ({exc})"}))
            known = False  # the one made next is not a missing one
            _unlink(path)
    raise AssertionError("unreachable")


def _private(path: Path) -> None:
    """Make the SQLite file at `path`, and its journal when there is one, readable and writable
    by their owner alone (0600, as the journal they index): the file may have been made by
    SQLite itself (an ATTACH, or a connection, after another process removed it), with the
    umask's mode. Called before its tables are written."""
    for name in _with_journal(path):
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != 0o600:
                os.fchmod(fd, 0o600)
        finally:
            os.close(fd)


def _tune(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA journal_mode=TRUNCATE")
    conn.execute("PRAGMA synchronous=OFF")  # derived: a damaged index is rebuilt
    conn.execute("PRAGMA cache_size=-32768")  # 32 MB: a rebuild's inserts into its B-trees stay in memory


def _create_records(conn: sqlite3.Connection) -> None:
    for sql in _SCHEMA:
        conn.execute(sql)
    conn.executemany("INSERT INTO meta VALUES (?, ?)", _META_DEFAULTS.items())
    conn.execute("INSERT INTO meta VALUES ('pair', ?)", (os.urandom(8).hex(),))


def _create_words(conn: sqlite3.Connection) -> None:
    for sql in _WORDS_SCHEMA:
        conn.execute(sql)
    conn.execute("INSERT INTO fts (fts, rank) VALUES ('hashsize', ?)", (_FTS_HASH,))
    conn.execute("INSERT INTO fts (fts, rank) VALUES ('automerge', ?)", (_FTS_MERGE,))
    conn.execute("INSERT INTO fts (fts, rank) VALUES ('pgsz', ?)", (_FTS_LEAF,))
    conn.executemany("INSERT INTO wmeta VALUES (?, ?)", _WORDS_DEFAULTS.items())


def _words_writer(conn: IndexConnection) -> sqlite3.Connection:
    """A connection of its own to the words' file `conn` has attached (the words are written
    on it beside the records). A file that is no longer the one attached is damage."""
    if not _same_file(conn.words, conn.words_file):
        raise sqlite3.DatabaseError(f"{conn.words} is no longer the index's words file")
    writer = sqlite3.connect(conn.words, timeout=30.0, isolation_level=None, check_same_thread=False)
    try:
        _tune(writer)
    except BaseException:
        writer.close()
        raise
    return writer


class Connections:
    """Open indexes kept for reuse (SQLite's page cache stays warm between searches), at most
    `most`, least recently used closed first; each used by one thread at a time. One whose
    file is no longer the one at the index's name (removed, replaced) is opened again."""

    def __init__(self, most: int = 32) -> None:
        self._most = most
        self._lock = threading.Lock()
        self._open: dict[Path, tuple[IndexConnection, threading.Lock, tuple[int, int]]] = {}

    @contextlib.contextmanager
    def use(self, journal: Path, events: list[tuple[str, dict[str, Any]]], known: bool) -> Iterator[IndexConnection]:
        path = index_path(journal)
        with self._lock:
            held = self._open.pop(journal, None)
        if held is not None:
            same = _same_file(path, held[2]) and _same_file(held[0].words, held[0].words_file)
            if not same:
                with held[1]:
                    held[0].close()
                held = None
        if held is None:
            conn = connect(journal, events, known)
            try:
                st = os.stat(path)
            except OSError as exc:  # removed by another process meanwhile: this time, no index
                conn.close()
                raise IndexUnavailable(f"{path}: {exc}") from None
            held = (conn, threading.Lock(), (st.st_dev, st.st_ino))
        ok = False
        try:
            with held[1]:
                yield held[0]
            ok = True
        finally:
            spare = None
            if ok:
                with self._lock:
                    spare = self._open.pop(journal, None)  # another thread's, opened meanwhile
                    self._open[journal] = held
                    while len(self._open) > self._most:
                        _, (old, lock, _) = next(iter(self._open.items()))
                        del self._open[next(iter(self._open))]
                        with lock:
                            old.close()
            else:
                held[0].close()
            if spare is not None:
                with spare[1]:
                    spare[0].close()

    def close_all(self) -> None:
        """Close every open index (one in use is closed when its user is done with it)."""
        with self._lock:
            held, self._open = list(self._open.values()), {}
        for conn, lock, _ in held:
            with lock:
                conn.close()

    def close(self, journal: Path) -> None:
        with self._lock:
            held = self._open.pop(journal, None)
        if held is not None:
            with held[1]:
                held[0].close()


def _same_file(path: Path, file: tuple[int, int]) -> bool:
    """Whether `path` is still the regular file `file` (device, inode), with one name."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == file and stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def _meta(conn: sqlite3.Connection, table: str = "meta") -> dict[str, Any]:
    return dict(conn.execute(f"SELECT k, v FROM {table}").fetchall())


def _set_meta(conn: sqlite3.Connection, values: dict[str, Any]) -> None:
    conn.executemany("UPDATE meta SET v = ? WHERE k = ?", [(v, k) for k, v in values.items()])


def _reset(conn: sqlite3.Connection, words: sqlite3.Connection) -> None:
    """Empty the index (`conn`, in its transaction) and its words (`words`, in theirs), paired."""
    conn.execute("DELETE FROM recs")
    conn.execute("DELETE FROM done")
    conn.execute("DELETE FROM deps")
    _set_meta(conn, {k: v for k, v in _META_DEFAULTS.items() if k != "version"})
    _forget_groups(conn)
    pair = _meta(conn).get("pair") or os.urandom(8).hex()
    conn.execute("INSERT OR REPLACE INTO meta VALUES ('pair', ?)", (pair,))
    words.execute("INSERT INTO fts (fts) VALUES ('delete-all')")
    words.executemany("INSERT OR REPLACE INTO wmeta VALUES (?, ?)", [("pair", pair), ("mark", 0)])


def _unpaired(meta: dict[str, Any], words: dict[str, Any], news: str | None = None) -> str | None:
    """Why the words' file does not hold the words of the index's records, or None: it must
    carry the index's pair token (made with it) and end at its mark. A write of both commits
    the words first: a process killed between the two leaves words past the mark. `news`:
    what was found wrong with the file when it was opened (it was made again)."""
    if words.get("pair") != meta.get("pair"):
        return news or "the index's words file belongs to another index"
    if int(words.get("mark") or 0) != int(meta["mark"]):
        return f"the index's words end at byte {words.get('mark')} of the journal, its records at {meta['mark']}"
    return None


def _forget_groups(conn: sqlite3.Connection) -> None:
    conn.execute(f"DELETE FROM meta WHERE k IN ({','.join('?' * len(_GROUPS))})", _GROUPS)


def _tail_crc(fd: int, mark: int) -> int:
    start = max(0, mark - _TAIL)
    data = os.pread(fd, mark - start, start)
    counted("bytes", len(data))
    return zlib.crc32(data)


def _stale(meta: dict[str, Any], fd: int) -> str | None:
    st = os.fstat(fd)
    inode = f"{st.st_dev}:{st.st_ino}"
    mark = int(meta["mark"])
    if mark == 0:
        return None
    if meta["inode"] != inode:
        return "the journal was replaced (another file at its path)"
    if mark > st.st_size:  # (past `end` alone is an index ahead of it: another indexed what came since)
        return "the journal is shorter than the index"
    if _tail_crc(fd, mark) != int(meta["tail"]):
        return "the journal's bytes before the index's mark changed"
    return None


def catch_up(
    conn: IndexConnection,
    fd: int,
    path: Path,
    end: int,
    events: list[tuple[str, dict[str, Any]]],
    stopped: Callable[[], bool] | None = None,
) -> None:
    """Index the journal open at `fd` up to `end` (just past a newline), a transaction per chunk;
    a stale index is emptied first (event). Another process may do the same at once: each
    transaction starts from the mark it finds. `stopped()` true after a chunk: it returns early.

    An index already at `end` is found so by plain reads (SQLite's shared lock), without a
    write transaction: a search never waits for the background indexer's chunk in progress,
    nor for another reader, when there is nothing to add."""
    meta = _meta(conn)
    mark = int(meta["mark"])
    if mark >= end and _stale(meta, fd) is None and _unpaired(meta, _meta(conn, "w.wmeta")) is None:
        return
    words = _words_writer(conn)
    try:
        with (
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cmdc-index-read") as pool,
            concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cmdc-index-words") as writer,
        ):
            _catch_up(conn, words, fd, path, end, events, stopped, pool, writer)
    finally:
        words.close()


def _catch_up(
    conn: IndexConnection,
    words: sqlite3.Connection,
    fd: int,
    path: Path,
    end: int,
    events: list[tuple[str, dict[str, Any]]],
    stopped: Callable[[], bool] | None,
    pool: concurrent.futures.Executor,
    writer: concurrent.futures.Executor,
) -> None:
    """`catch_up`'s transactions: one per chunk, on the records (`conn`) and their words
    (`words`) at once. The words are written by `writer`'s thread while this one writes the
    records, and committed first: a reader never sees records whose words are not there."""
    ahead: concurrent.futures.Future[_Parsed] | None = None
    background = getattr(_BACKGROUND, "active", False)
    while True:
        _begin_records(conn)  # the records first: every writer of both takes them in this order
        try:
            words.execute("BEGIN IMMEDIATE")
            try:
                meta = _meta(conn)
                held = _meta(words, "wmeta")
                why = _stale(meta, fd) or _unpaired(meta, held, conn.words_news)
                if why is not None:
                    _reset(conn, words)
                    # the records are new or were just emptied (told already, unless their file was
                    # missing: then words indexed before, another index's, are the news)
                    told = any(kind == "rebuild" for kind, _ in events)
                    if int(meta["mark"]) or (int(held.get("mark") or 0) and not told):
                        events.append(("rebuild", {"reason": why}))
                    meta = _meta(conn)
                mark = int(meta["mark"])
                if mark >= end:
                    words.execute("COMMIT")
                    conn.execute("COMMIT")
                    return
                parsed = ahead.result() if ahead is not None else None
                if parsed is None or (parsed.mark, parsed.after) != (mark, int(meta["last_seq"])):
                    parsed = _parse_chunk(fd, path, mark, end, int(meta["last_seq"]))  # none, or another's
                # the next chunk is read and decoded while SQLite writes this one (without Python's lock)
                ahead = (
                    pool.submit(_parse_ahead, background, fd, path, parsed.stop, end, parsed.last_seq)
                    if parsed.stop < end
                    else None
                )
                written = writer.submit(_write_words, words, parsed)  # beside the records
                try:
                    _index_chunk(conn, fd, meta, parsed)
                finally:
                    concurrent.futures.wait([written])  # (its connection is not rolled back under it)
                written.result()
                words.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    words.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        if stopped is not None and stopped():
            return


def _begin_records(conn: sqlite3.Connection) -> None:
    """Begin a write transaction on the index's records, and not on its words: `BEGIN
    IMMEDIATE` would lock every attached file. A first write takes the records' lock alone
    (waiting for another writer as `BEGIN IMMEDIATE` does)."""
    conn.execute("BEGIN")
    try:
        conn.execute("UPDATE meta SET v = v WHERE k = 'version'")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise


def _write_words(words: sqlite3.Connection, parsed: _Parsed) -> None:
    """A chunk's words, and the mark they end at, in the words' transaction."""
    for insert in parsed.words:
        insert.run(words)
    words.execute("UPDATE wmeta SET v = ? WHERE k = 'mark'", (parsed.stop,))


def _parse_ahead(background: bool, fd: int, path: Path, mark: int, end: int, after: int) -> _Parsed:
    _BACKGROUND.active = background  # its reads are counted as its caller's are
    return _parse_chunk(fd, path, mark, end, after)


def _read_lines(fd: int, mark: int, end: int) -> tuple[bytes, int]:
    """The journal's bytes from `mark`: about `_CHUNK` of them, ending just past a newline."""
    size = min(_CHUNK, end - mark)
    while True:
        data = os.pread(fd, size, mark)
        counted("bytes", len(data))
        cut = data.rfind(b"\n") + 1
        if cut > 0:
            return data[:cut], mark + cut
        if mark + size >= end:
            raise OSError("the journal ends without a newline before the indexed end")
        size = min(end - mark, size * 4)


class _Parsed(NamedTuple):
    """A chunk of the journal read and decoded, not yet in the index."""

    mark: int  # where it starts
    after: int  # the last record number before it (its records must follow)
    stop: int  # where it ends (just past a newline)
    last_seq: int
    damaged: int  # its damaged lines
    recs: list[tuple[int, int, int, str, str | None, int, str | None, int]]
    words: list[_Insert]  # the inserts of its records' words (`_word_inserts`)
    deps: list[tuple[str, str]]
    commits: list[tuple[tuple[str, ...], str]]  # (attempts, group) in order
    recs_json: str | None  # `recs` as JSON (`_RECS_JSON_SQL`), or None when JSON cannot carry them


def _parse_chunk(fd: int, path: Path, mark: int, end: int, after: int) -> _Parsed:
    """The journal's lines from `mark` (about `_CHUNK` bytes of them, before `end`), decoded:
    no SQLite here (it runs in a thread of its own while the chunk before is written)."""
    from ...errors import OffloadCorrupted
    from .scan import _decode_at, _fused_cuts, _lines, _summary_attempts

    data, stop = _read_lines(fd, mark, end)
    last_seq, damaged = after, 0
    recs: list[tuple[int, int, int, str, str | None, int, str | None, int]] = []
    words: list[tuple[int, str, str]] = []
    deps: list[tuple[str, str]] = []
    commits: list[tuple[tuple[str, ...], str]] = []  # (attempts, group) in order

    view = memoryview(data)
    valid: dict[str, bool] = {}  # ids checked in this chunk (a batch's records share theirs)

    def decode(offset: int, nl: int, after: int) -> tuple[Any, ...]:
        where = f"{path}: byte {mark + offset}"
        fast = _fast_record(data, view, offset, nl, valid)
        fields: tuple[Any, ...] = ()
        deps_of: tuple[str, ...] = ()
        if fast is None:  # a control line, a huge, unusual or damaged record: the journal's own decoder
            decoded, _ = _decode_at(data, offset, nl, where, TEXT_CHARS)
            r = decoded.record
            kind, seq, attempts = decoded.kind, decoded.seq, decoded.attempts
            if r is not None:
                text = record_text(r.message)
                fields = (r.message.id, r.attempt, r.compaction, r.message.is_summary, text, r.clipped)
                deps_of = tuple(_summary_attempts(r.message))
        else:
            kind, seq, attempts = "message", fast[0], ()
            fields, deps_of = fast[1:7], fast[7]
        if kind == "message" and seq <= after:
            raise OffloadCorrupted(f"seq {seq} does not follow {after}")
        return offset, nl, kind, seq, attempts, fields, deps_of

    lines: list[tuple[Any, ...]] = []
    for offset, nl in _lines(data, len(data)):
        fast = (  # (the framing and checksum checked once, for both)
            _typed_record(data, view, offset, nl, valid, True) or _fast_record(data, view, offset, nl, valid, True)
            if _framed(data, view, offset, nl)
            else None
        )
        if fast is not None and fast[0] > last_seq:  # the common line, added here at once
            seq, mid, attempt, compaction, summary, text, _, deps_of = fast
            last_seq = seq
            recs.append((seq, mark + offset, nl - offset, mid, attempt, int(summary), None, compaction))
            folded = text.casefold()
            if ("/" in folded or "." in folded or "-" in folded) and _JOINED.search(folded):  # most hold none
                ids = [m[0] for m in _COMPOUND.finditer(folded) if len(m[0]) <= _LONGEST_COMPOUND]
                words.append((seq, _body(folded), " ".join(ids).translate(_SEPARATORS)))
            else:
                words.append((seq, _body(folded), ""))
            if attempt is None:
                recs[-1] = (*recs[-1][:6], f"legacy{compaction}", compaction)
            if deps_of:
                deps += ((attempt or "", a) for a in deps_of)
            continue
        try:
            lines = [decode(offset, nl, last_seq)]
        except OffloadCorrupted:
            lines = []
            for cut in _fused_cuts(data, offset, nl):  # two whole lines joined by a damaged newline
                try:
                    first = decode(offset, cut, last_seq)
                    lines = [first, decode(cut + 1, nl, max(last_seq, first[3]))]
                    break
                except OffloadCorrupted:
                    continue
            if not lines:
                damaged += 1
                continue
        for offset, nl, kind, seq, attempts, fields, deps_of in lines:
            last_seq = max(last_seq, seq)
            if attempts:
                commits.append((attempts, f"c{mark + offset}"))
            if kind != "message":
                continue
            mid, attempt, compaction, summary, text, clipped = fields
            grp = None if attempt is not None else f"legacy{compaction}"
            recs.append((seq, mark + offset, nl - offset, mid, attempt, int(summary), grp, int(compaction)))
            folded = text.casefold()
            ids = (
                [m[0].translate(_SEPARATORS) for m in _COMPOUND.finditer(folded) if len(m[0]) <= _LONGEST_COMPOUND]
                if ("/" in folded or "." in folded or "-" in folded) and _JOINED.search(folded)  # most hold none
                else []
            )
            if clipped:  # a huge text: its head indexed as it is, every other word once
                ids += [w.translate(_SEPARATORS) for w in _rest_words(data, offset, nl)]
            words.append((seq, _body(folded), " ".join(ids)))
            deps += ((attempt or "", a) for a in deps_of)
    counted("records", len(recs))
    return _Parsed(mark, after, stop, last_seq, damaged, recs, _word_inserts(words), deps, commits, _as_json(recs))


def _index_chunk(conn: sqlite3.Connection, fd: int, meta: dict[str, Any], parsed: _Parsed) -> None:
    """Add the records of the chunk `parsed` (read from the journal open at `fd`) to the index,
    in the caller's transaction (their words are written beside, see `_catch_up`)."""
    recs, deps, commits = parsed.recs, parsed.deps, parsed.commits
    conn.executemany("INSERT INTO deps VALUES (?, ?)", deps)
    # which records become visible: those of attempts committed now (by a commit line, or by a
    # committed summary naming them), those of attempts committed before, and legacy ones. This
    # chunk's records are inserted after that is known, visible or not (no update of each).
    fresh: list[str] = []
    regrouped = False  # records indexed before changed their batch
    for attempts, grp in commits:
        for a in attempts:
            row = conn.execute("SELECT grp FROM done WHERE attempt = ?", (a,)).fetchone()
            if row is None:
                conn.execute("INSERT INTO done VALUES (?, ?)", (a, grp))
                fresh.append(a)
            elif row[0] == a:  # committed by a summary until now: a commit line names its batch
                conn.execute("UPDATE done SET grp = ? WHERE attempt = ?", (grp, a))
                conn.execute("UPDATE recs SET grp = ? WHERE attempt = ? AND grp = attempt", (grp, a))
                regrouped = True
    new_attempts = {r[4] for r in recs if r[4] is not None}
    old = _done_among(conn, new_attempts - set(fresh))
    queue = [*fresh, *old, *([""] if any(r[4] is None and r[5] for r in recs) else [])]  # "": legacy summaries
    while queue:  # a committed summary commits the attempts it names
        a = queue.pop()
        for (dep,) in conn.execute("SELECT dep FROM deps WHERE attempt = ?", (a,)).fetchall():
            if conn.execute("SELECT 1 FROM done WHERE attempt = ?", (dep,)).fetchone() is None:
                conn.execute("INSERT INTO done VALUES (?, ?)", (dep, dep))
                fresh.append(dep)
                queue.append(dep)
    changed = [*fresh, *old]
    rows: list[tuple[int, str]] = []  # committed records: those of earlier chunks, then this one's
    group_of = "(SELECT grp FROM done d WHERE d.attempt = recs.attempt)"
    _among(conn, f"UPDATE recs SET grp = {group_of} WHERE vis = 0 AND attempt IN", changed)
    rows += _among(conn, "SELECT seq, mid FROM recs WHERE vis = 0 AND attempt IN", changed)
    # records indexed before this chunk whose batch or visibility changes (a hidden one comes
    # after the one shown instead): the compactions counted up to there are counted again
    changed_from = min((seq for seq, _ in rows), default=None) if not regrouped else 0
    if changed_from is not None and changed_from <= int(meta.get("groups_seq") or 0):
        _forget_groups(conn)
    done_now = set(changed) & new_attempts
    group = _done_groups(conn, done_now)
    rows += [(r[0], r[3]) for r in recs if r[4] is None or r[4] in done_now]
    here: set[int] = set()
    count = int(meta["count"]) + _show(conn, rows, int(meta["last_seq"]), here)
    # the records as one statement over their JSON, made beside (their batch's group and whether
    # they are shown, found by SQLite); as rows when JSON cannot carry them
    shown = orjson.dumps(sorted(here)).decode()
    if parsed.recs_json is None or _over_json(conn, _RECS_JSON_SQL, (shown, parsed.recs_json)) is None:
        conn.executemany(
            _RECS_SQL,
            [
                (r[0], r[1], r[2], r[3], r[4], r[5], r[6] if r[4] is None else group.get(r[4]), r[7], int(r[0] in here))
                for r in recs
            ],
        )
    _set_meta(
        conn,
        {
            "mark": parsed.stop,
            "last_seq": parsed.last_seq,
            "damaged": int(meta["damaged"]) + parsed.damaged,
            "tail": _tail_crc(fd, parsed.stop),
            "inode": "{0.st_dev}:{0.st_ino}".format(os.fstat(fd)),
            "count": count,
        },
    )
    _count_ahead(conn, parsed.last_seq)


def _count_ahead(conn: sqlite3.Connection, last_seq: int) -> None:
    """Go on counting the compactions (`extent`) over the visible records before the first
    hidden one, in this chunk's transaction: a rebuild counts them chunk by chunk beside its
    words, not all at its end on its caller's thread. Those records stay as they are counted:
    a record shown or hidden later is a hidden one's, or comes after one (`_show`), and a batch
    that changes its group makes `_index_chunk` forget the count."""
    groups = dict(conn.execute(f"SELECT k, v FROM meta WHERE k IN ({','.join('?' * len(_GROUPS))})", _GROUPS))
    start = int(groups.get("groups_seq") or 0)
    state = (int(groups["groups"]), groups["groups_last"], int(groups["groups_num"])) if start else None
    (hidden,) = conn.execute("SELECT min(seq) FROM recs INDEXED BY recs_attempt WHERE vis = 0").fetchone()
    end = last_seq if hidden is None else hidden - 1
    if end <= start:
        return
    rows = conn.execute(
        "SELECT seq, grp, comp FROM recs WHERE vis = 1 AND seq > ? AND seq <= ? ORDER BY seq", (start, end)
    )
    count, last, number, seq = _compactions(rows, state, start)
    if seq > start:
        values = {"groups": count, "groups_seq": seq, "groups_last": last, "groups_num": number}
        conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", values.items())


_RECS_SQL = "INSERT INTO recs (seq, off, len, mid, attempt, summary, grp, comp, vis) VALUES (?,?,?,?,?,?,?,?,?)"
_RECS_JSON_SQL = (  # the rows as one statement over their JSON: SQLite runs it without Python's lock, where
    # `executemany` takes the lock back for each row and, while the next chunk is decoded, waits
    # for it each time (measured: the records' inserts took twice their CPU time in wall time).
    # A record's group: a legacy one's own, else its batch's if committed (`done`); shown: its
    # number among the JSON array of the second argument.
    "INSERT INTO recs (seq, off, len, mid, attempt, summary, grp, comp, vis) SELECT "
    + ", ".join(f"json_extract(value, '$[{k}]')" for k in range(6))
    + ", CASE WHEN json_extract(value, '$[4]') IS NULL THEN json_extract(value, '$[6]') "
    "ELSE (SELECT grp FROM done WHERE attempt = json_extract(value, '$[4]')) END, "
    "json_extract(value, '$[7]'), json_extract(value, '$[0]') IN (SELECT value FROM json_each(?)) "
    "FROM json_each(?)"
)


def _as_json(values: Sequence[Any]) -> str | None:
    """`values` as JSON text for SQLite's `json_each`, or None when JSON cannot carry them (a
    text with a lone surrogate, or a NUL: SQLite's JSON text ends at one)."""
    try:
        blob = orjson.dumps(values)
    except TypeError:
        return None
    return None if b"\\u0000" in blob else blob.decode()  # as text: SQLite 3.45+ reads a BLOB as JSONB


class _Insert(NamedTuple):
    """An insert prepared off SQLite's thread: `sql` with `args` and then `blob` (JSON of its
    values, for `json_each`); `plain` with `executemany` over `rows` when JSON cannot carry them
    (`blob` None) or SQLite has no JSON functions."""

    sql: str
    args: tuple[Any, ...]
    blob: str | None
    plain: str
    rows: Sequence[tuple[Any, ...]]

    def run(self, conn: sqlite3.Connection) -> None:
        if self.blob is None or _over_json(conn, self.sql, (*self.args, self.blob)) is None:
            conn.executemany(self.plain, self.rows)


def _over_json(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> sqlite3.Cursor | None:
    """`conn.execute(sql, args)`, a statement over JSON (`json_each`); None when SQLite has no
    JSON functions (the caller then goes row by row). Any other error is raised."""
    try:
        return conn.execute(sql, args)
    except sqlite3.OperationalError as exc:
        if "no such" not in str(exc) or "json" not in str(exc):
            raise
        return None


_WORDS_SQL = "INSERT INTO fts (rowid, body, ids) VALUES (?, ?, ?)"
_ROWS_SQL = (  # the same rows as one statement over them as JSON: SQLite inserts them all without
    # Python's lock (`executemany` takes it back for each row, and waits for it while another
    # thread decodes)
    "INSERT INTO fts (rowid, body, ids) "
    "SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]') FROM json_each(?)"
)
_TEXTS_SQL = "INSERT INTO fts (rowid, body, ids) SELECT ? + key, value, '' FROM json_each(?)"
_PLAIN_RUN = 64  # consecutive records without identifiers sent as one array of their texts, at least


def _word_inserts(words: Sequence[tuple[int, str, str]]) -> list[_Insert]:
    """The inserts of records' words (number, text, identifiers; numbers rising) into the FTS
    table, in their order (FTS5 writes out its pending terms when a number does not rise),
    prepared beside SQLite's thread. A run of consecutive numbers without identifiers (most
    text) is sent as one JSON array of its texts, numbered from the first: SQLite reads each
    text once, where a row of three values costs it a parse of the row per value; the rest as
    rows."""
    inserts: list[_Insert] = []
    start = k = 0
    n = len(words)
    while k < n:
        end = k + 1
        if not words[k][2]:
            seq = words[k][0]
            while end < n and not words[end][2] and words[end][0] == seq + end - k:
                end += 1
        if words[k][2] or end - k < _PLAIN_RUN:
            k = end
            continue
        if start < k:
            inserts.append(_as_rows(words[start:k]))
        run = words[k:end]
        inserts.append(_Insert(_TEXTS_SQL, (run[0][0],), _as_json([w[1] for w in run]), _WORDS_SQL, run))
        start = k = end
    if start < n:
        inserts.append(_as_rows(words[start:n]))
    return inserts


def _as_rows(rows: Sequence[tuple[int, str, str]]) -> _Insert:
    return _Insert(_ROWS_SQL, (), _as_json(rows), _WORDS_SQL, rows)


_REST_WORDS = 500_000  # distinct words of a huge text's rest that are indexed at most
TOKEN_SLICE = 16 * 1024
"""Characters of text `tokens_in_slices` hands to `tokens` at once: the background indexer
holds the GIL for each regex call, so one call over a 256 KB piece (15 ms idle, 50+ ms on a
loaded machine) stalled the trio thread."""
_NOT_IDENTIFIER = re.compile(r"[^\w/.-]")  # a character no token (word or identifier) holds


def tokens_in_slices(text: str) -> Iterator[list[str]]:
    """`tokens(text)`, about `TOKEN_SLICE` characters at a time: each slice ends where no word
    or identifier runs on, so the tokens are those of the whole text, in order (a run longer
    than a slice is cut anyway)."""
    start, n = 0, len(text)
    while start < n:
        end = start + TOKEN_SLICE
        if end < n:
            m = _NOT_IDENTIFIER.search(text, end, min(n, end + TOKEN_SLICE))
            end = m.start() if m is not None else end
        yield tokens(text[start:end])
        start = end


def _rest_words(data: bytes, start: int, end: int) -> list[str]:
    """The distinct words (and identifiers) of the text of the message line `data[start:end]`
    past its first `TEXT_CHARS` characters, read a piece at a time (never built whole)."""
    from .. import bigjson as _bigjson

    try:
        span = _bigjson.content_span(data, start + len(b'{"message":'), end)
        if span is None:
            return []
        seen: dict[str, None] = {}
        have, carry = 0, ""
        for piece in _bigjson.pieces(data, span[0], span[1]):
            skip = max(0, TEXT_CHARS - have)
            have += len(piece)
            text = carry + piece[skip:] if skip < len(piece) else ""
            cut = len(text)
            while cut > 0 and (text[cut - 1].isalnum() or text[cut - 1] in "_/.-") and len(text) - cut < 4096:
                cut -= 1
            carry = text[cut:]
            for words in tokens_in_slices(text[:cut]):
                seen.update(dict.fromkeys(words))
            if len(seen) >= _REST_WORDS:
                break
        for words in tokens_in_slices(carry):
            seen.update(dict.fromkeys(words))
        return list(seen)[:_REST_WORDS]
    except _bigjson._BadJSON:
        return []


_SEPARATORS = str.maketrans({"/": "\ue000", ".": "\ue001", "-": "\ue002"})
"""An identifier's separators as private-use characters, which FTS5's tokenizer keeps inside a
token: `src/billing/mod_7.py` is one token of the `ids` column (its parts are in `body`)."""


_HEX = b"0123456789abcdef"


def _framed(data: bytes, view: memoryview, start: int, end: int) -> bool:
    """Whether the line `data[start:end]` is framed as a record line cmdc writes (its message
    first, its checksum last, not huge) and its checksum is right: what both fast decoders
    (`_typed_record`, `_fast_record`) take for granted."""
    if (
        end - start > 64 * 1024
        or end - start < 40
        or not data.startswith(b'{"message":', start)
        or not data.startswith(b',"crc":"', end - 18)
        or not data.startswith(b'"}', end - 2)
    ):
        return False
    written = data[end - 10 : end - 2]
    return not written.translate(None, _HEX) and zlib.crc32(view[start + 11 : end - 18]) == int(written, 16)


def _fast_record(
    data: bytes, view: memoryview, start: int, end: int, valid: dict[str, bool], framed: bool = False
) -> tuple[Any, ...] | None:
    """A plain message line (text content, at most `TEXT_CHARS`, not huge) whose checksum is
    right, read with one `orjson.loads`: (seq, message id, attempt, compaction, is summary,
    indexed text, 0, the attempts a summary names); None for anything else, a damaged line
    too (the journal's decoder reads it, and says what is wrong). `valid`: ids checked before;
    `framed`: the caller checked `_framed`. (Every line of a rebuild comes here: its checks are
    ordered and written for speed.)"""
    if not framed and not _framed(data, view, start, end):
        return None
    try:
        obj = orjson.loads(view[start:end])
    except orjson.JSONDecodeError:
        return None
    msg = obj["message"]  # (the text is an object that starts with this key: `obj` is a dict that has it)
    keys = obj.keys()
    if type(msg) is not dict or (keys != _MESSAGE_KEYS and keys != _LEGACY_KEYS):
        return None
    seq, compaction, attempt = obj["seq"], obj["compaction"], obj.get("attempt")
    if type(seq) is not int or not 1 <= seq <= MAX_SEQ or type(compaction) is not int or compaction < 0:
        return None
    content, mid = msg.get("content", ""), msg.get("id")
    if type(obj["ts"]) not in _NUMBERS or type(content) is not str or len(content) > TEXT_CHARS or type(mid) is not str:
        return None
    if not (mid and msg.keys() <= _PLAIN and msg.get("role") in _PLAIN_ROLES) and not _tool_result(msg, mid):
        # anything but text from a system, user or assistant message or a tool result's: the
        # message's own decoder checks it, as a scan does
        try:
            Message.from_dict(msg)
        except InvalidMessage:
            return None
    journal = obj.get("journal")
    if attempt is None and "journal" in obj:  # (a null attempt: the journal's decoder refuses the line)
        return None
    if attempt is not None and not (
        type(attempt) is str and type(journal) is str and valid.get(attempt) and valid.get(journal)
    ):  # (both texts before they are looked up: a list or an object is no key)
        for value in (attempt, journal):
            ok = valid.get(value) if isinstance(value, str) else False
            if ok is None:
                ok = valid[value] = _valid_id(value)
            if not ok:
                return None
    meta = msg.get("metadata", _ABSENT)  # (absent, not null: the journal's decoder refuses a null)
    summary, named = False, ()
    if meta is not _ABSENT:
        if type(meta) is not dict:
            return None
        if meta.get("cmdc.kind") == "summary":
            summary, deps = True, meta.get(_ATTEMPTS_KEY)
            named = tuple(a for a in deps if _valid_id(a)) if type(deps) is list else ()
    calls = msg.get("tool_calls", _ABSENT)
    if calls is _ABSENT:
        return seq, mid, attempt, compaction, summary, content, 0, named
    if type(calls) is not list:
        return None
    parts = [content]
    for call in calls:
        if type(call) is not dict or type(call.get("name")) is not str:
            return None
        parts.append(call["name"])
        parts.append(orjson.dumps(call.get("arguments", {})).decode()[:TEXT_CHARS])
    return seq, mid, attempt, compaction, summary, "\n".join(parts) if calls else content, 0, named


class _Said(msgspec.Struct, forbid_unknown_fields=True):
    """A message of a shape `_typed_record` reads: a system, user or assistant message's text,
    or a tool's result (absent fields are `UNSET`, a null is refused: the decoder decides)."""

    id: str
    role: str
    content: str = ""
    tool_call_id: str | msgspec.UnsetType = msgspec.UNSET
    is_error: bool | msgspec.UnsetType = msgspec.UNSET


class _Line(msgspec.Struct, forbid_unknown_fields=True):
    """A journal line of a record of this format (`_MESSAGE_KEYS`)."""

    message: _Said
    compaction: int
    ts: float
    seq: int
    attempt: str
    journal: str
    crc: str


_LINE = msgspec.json.Decoder(_Line)
_WHOLE = 1 << 63  # a larger number is a float to orjson, and so refused by the journal's decoder


def _typed_record(
    data: bytes, view: memoryview, start: int, end: int, valid: dict[str, bool], framed: bool = False
) -> tuple[Any, ...] | None:
    """`_fast_record` for the commonest lines, read by msgspec into `_Line` (the shape and
    every field's type checked in C: a Python step per field cost about as much as the rest of
    a rebuild's decoding); None for any other line (`_fast_record` reads it). What it accepts,
    the journal's decoder accepts too, with the same fields: the same framing and checksum,
    the same rules for ids, roles and tool results, and only numbers orjson reads as integers.
    `framed`: the caller checked `_framed`."""
    if not framed and not _framed(data, view, start, end):
        return None
    try:
        line = _LINE.decode(view[start:end])
    except msgspec.MsgspecError:
        return None
    msg, seq, compaction = line.message, line.seq, line.compaction
    if not 0 < seq <= MAX_SEQ or not 0 <= compaction < _WHOLE or not msg.id or len(msg.content) > TEXT_CHARS:
        return None
    if msg.role == "tool":
        if not msg.tool_call_id:  # (absent or empty)
            return None
    elif msg.role not in _PLAIN_ROLES or msg.tool_call_id is not msgspec.UNSET or msg.is_error is not msgspec.UNSET:
        return None
    attempt, journal = line.attempt, line.journal
    if not (valid.get(attempt) and valid.get(journal)):
        for value in (attempt, journal):
            ok = valid.get(value)
            if ok is None:
                ok = valid[value] = _valid_id(value)
            if not ok:
                return None
    return seq, msg.id, attempt, compaction, False, msg.content, 0, ()


_NUMBERS = (int, float)
_PLAIN = frozenset({"id", "role", "content"})
_PLAIN_RESULT = frozenset({"id", "role", "content", "tool_call_id", "is_error"})
_PLAIN_ROLES = frozenset({"system", "user", "assistant"})
_ABSENT: Any = object()  # a key the line does not have


def _tool_result(msg: dict[str, Any], mid: str) -> bool:
    """Whether `msg` (its content a string, its id a string) is a tool result of the common
    shape, checked here as `Message.from_dict` would check it."""
    if not mid or not msg.keys() <= _PLAIN_RESULT or msg.get("role") != "tool":
        return False
    call = msg.get("tool_call_id")
    return type(call) is str and call != "" and type(msg.get("is_error", False)) is bool


def _done_among(conn: sqlite3.Connection, attempts: Iterable[str]) -> list[str]:
    return [r[0] for r in _among(conn, "SELECT attempt FROM done WHERE attempt IN", list(attempts))]


def _done_groups(conn: sqlite3.Connection, attempts: Iterable[str]) -> dict[str, str]:
    """The batch (`done.grp`) of each of `attempts` that is committed."""
    return dict(_among(conn, "SELECT attempt, grp FROM done WHERE attempt IN", list(attempts)))


def _among(conn: sqlite3.Connection, sql: str, values: Sequence[str | int]) -> list[Any]:
    """`sql` (ending with `IN`) for `values`, and its rows: one statement over them as a JSON array
    (SQLite runs it without Python's lock, which a statement per few hundred takes back each
    time), or a statement per 500 when JSON cannot carry them or SQLite has no JSON functions."""
    if not values:
        return []
    blob = _as_json(values)
    found = None if blob is None else _over_json(conn, f"{sql} (SELECT value FROM json_each(?))", (blob,))
    if found is not None:
        return found.fetchall()
    out: list[Any] = []
    for k in range(0, len(values), 500):
        part = values[k : k + 500]
        out += conn.execute(f"{sql} ({','.join('?' * len(part))})", part).fetchall()
    return out


def _show(conn: sqlite3.Connection, rows: Sequence[tuple[int, str]], indexed: int, here: set[int]) -> int:
    """Make visible, for each message id among `rows` (committed records: seq, message id), its
    first committed record; returns how many more records are visible. A record numbered past
    `indexed` is not in the index yet: its number goes into `here` (it is inserted visible)."""
    first: dict[str, int] = {}
    for seq, mid in rows:
        if mid not in first or seq < first[mid]:
            first[mid] = seq
    mids = list(first)
    shown: dict[str, int] = dict(_among(conn, "SELECT mid, seq FROM recs WHERE vis = 1 AND mid IN", mids))
    hide = [shown[m] for m in mids if m in shown and first[m] < shown[m]]
    show = [first[m] for m in mids if m not in shown or first[m] < shown[m]]
    here.update(seq for seq in show if seq > indexed)
    _among(conn, "UPDATE recs SET vis = 0 WHERE seq IN", hide)
    _among(conn, "UPDATE recs SET vis = 1 WHERE seq IN", [seq for seq in show if seq <= indexed])
    return len(show) - len(hide)


# -- queries -----------------------------------------------------------------------------------

Span = tuple[int, int, int]  # seq, byte offset, length


def search(conn: sqlite3.Connection, query: str, limit: int) -> list[Span]:
    """The visible records best matching `query` by BM25, at most `limit`, best first.

    Two cheap steps before the exact query: the phrase joins the match only when some record
    holds it (a record without it scores the same either way, so leaving it out changes no
    score); and the best `_CANDIDATES` by FTS5's own rank (no join) give the answer when
    enough of them, visible and weighted, still score above the last candidate (a weight
    only lowers a score, so nothing past the candidates can beat them)."""
    held = "SELECT 1 FROM fts WHERE fts MATCH ? LIMIT 1"
    terms, phrase = query_terms(query, lambda word: conn.execute(held, (_quoted(word),)).fetchone() is not None)
    if not terms:
        return []
    if phrase is not None and conn.execute(held, (_quoted(phrase),)).fetchone() is None:
        phrase = None
    expression = match_expression(terms, phrase)
    want = max(limit, 0)
    if want and want <= _CANDIDATES // 4:
        found = _from_candidates(conn, expression, want)
        if found is not None:
            return found
    sql = (
        "SELECT r.seq, r.off, r.len FROM fts JOIN recs r ON r.seq = fts.rowid "
        "WHERE fts MATCH ? AND r.vis = 1 "
        f"ORDER BY bm25(fts) * (CASE r.summary WHEN 1 THEN {SUMMARY_WEIGHT} ELSE 1.0 END), r.seq LIMIT ?"
    )
    return conn.execute(sql, (expression, limit)).fetchall()


_CANDIDATES = 200
"""Records a search takes by FTS5's rank alone before it looks at which are visible (see `search`)."""


def _from_candidates(conn: sqlite3.Connection, expression: str, limit: int) -> list[Span] | None:
    """The best `limit` visible records by weighted BM25 if the best `_CANDIDATES` by plain BM25
    decide them, else None. Scores are FTS5's (lower is better); a summary's is multiplied by
    `SUMMARY_WEIGHT` (so it rises, it never falls): a record past the candidates scores at least
    the last candidate's (ties go to the lower number, as in `search`), and the answer holds only
    when `limit` visible candidates rank strictly before it."""
    sql = "SELECT rowid, bm25(fts) AS score FROM fts WHERE fts MATCH ? ORDER BY score, rowid LIMIT ?"
    ranked = conn.execute(sql, (expression, _CANDIDATES)).fetchall()
    score = dict(ranked)
    if not score:
        return []
    marks = ",".join("?" * len(score))
    rows = [
        (seq, off, length, vis, summary, score[seq])
        for seq, off, length, vis, summary in conn.execute(
            f"SELECT seq, off, len, vis, summary FROM recs WHERE seq IN ({marks})", list(score)
        )
    ]
    bound = (ranked[-1][1], ranked[-1][0])  # the last candidate: (score, number)
    scored = sorted(
        (row[5] * (SUMMARY_WEIGHT if row[4] else 1.0), row[0], row[1], row[2]) for row in rows if row[3] == 1
    )[:limit]
    if len(score) >= _CANDIDATES and (len(scored) < limit or scored[-1][:2] >= bound):
        return None
    return [(seq, off, length) for _, seq, off, length in scored]


def span_range(conn: sqlite3.Connection, first: int, last: int) -> list[Span]:
    sql = "SELECT seq, off, len FROM recs WHERE vis = 1 AND seq BETWEEN ? AND ? ORDER BY seq"
    return conn.execute(sql, (first, last)).fetchall()


def span_last(conn: sqlite3.Connection, n: int) -> list[Span]:
    sql = "SELECT seq, off, len FROM recs WHERE vis = 1 ORDER BY seq DESC LIMIT ?"
    return conn.execute(sql, (n,)).fetchall()[::-1]


def extent(conn: sqlite3.Connection) -> tuple[int, int, int, int, int]:
    """(visible records, their first and last numbers, compactions, damaged lines). The
    compactions are counted once per change of the index, and from where the last count ended
    (`groups_seq`) while nothing before it changed: a journal that grew is not counted again
    from its start."""
    row = conn.execute(
        "SELECT (SELECT seq FROM recs WHERE vis = 1 ORDER BY seq LIMIT 1), "
        "(SELECT seq FROM recs WHERE vis = 1 ORDER BY seq DESC LIMIT 1)"
    ).fetchone()
    meta = _meta(conn)
    if meta.get("groups_mark") == meta["mark"]:  # counted since the last change
        groups = int(meta["groups"])
    else:
        _begin_records(conn)  # the count and where it ended, written as one
        try:
            meta = _meta(conn)
            start = int(meta.get("groups_seq") or 0)
            state = (int(meta["groups"]), meta["groups_last"], int(meta["groups_num"])) if start else None
            rows = conn.execute("SELECT seq, grp, comp FROM recs WHERE vis = 1 AND seq > ? ORDER BY seq", (start,))
            groups, last, number, seq = _compactions(rows, state, start)
            values = {"groups": groups, "groups_mark": meta["mark"], "groups_seq": seq}
            values |= {"groups_last": last, "groups_num": number}
            conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", values.items())
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
    return int(meta["count"]), int(row[0] or 0), int(row[1] or 0), int(groups), int(meta["damaged"])


_GROUPS = ("groups", "groups_mark", "groups_seq", "groups_last", "groups_num")
"""The meta keys of the compactions counted (see `extent`)."""


def _compactions(
    rows: Iterable[tuple[int, str | None, int]], state: tuple[int, str | None, int] | None = None, seq: int = 0
) -> tuple[int, str | None, int, int]:
    """How many compactions the visible records (in order: seq, group, number) show, counted as
    the journal's scan counts them: a committed batch whose compaction number moves (capped,
    masked and clipped results are batches numbered with the current count, not compactions).
    `state`: (count, last group, its number) after the records up to `seq`, to go on from.
    Returns the count, the last group and number, and the last record's number."""
    count, last_group, last_number = state if state is not None else (0, None, 0)
    first = state is None
    for at, group, number in rows:
        if first or group != last_group:
            if number > 0 and number != last_number:
                count += 1
            last_group, last_number, first = group, number, False
        seq = at
    return count, last_group, last_number, seq


def lines(conn: sqlite3.Connection) -> int:
    """The record lines the index holds, hidden ones included."""
    return int(conn.execute("SELECT count(*) FROM recs").fetchone()[0])


def check(conn: sqlite3.Connection) -> list[str]:
    """SQLite's own check of the index file and of its FTS table; the problems found."""
    problems = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall() if r[0] != "ok"]
    problems += [f"words: {r[0]}" for r in conn.execute("PRAGMA w.quick_check").fetchall() if r[0] != "ok"]
    meta = _meta(conn)
    counted = conn.execute("SELECT count(*) FROM recs WHERE vis = 1").fetchone()[0]
    if counted != int(meta["count"]):
        problems.append(f"the index counts {counted} records, its mark says {meta['count']}")
    unpaired = _unpaired(meta, _meta(conn, "w.wmeta"))
    if unpaired is not None:
        problems.append(unpaired)
    try:
        conn.execute("INSERT INTO fts (fts, rank) VALUES ('integrity-check', 0)")
    except sqlite3.DatabaseError as exc:
        problems.append(f"full-text index: {exc}")
    return problems


# -- the background thread ---------------------------------------------------------------------


class Indexer:
    """One daemon thread per store (at a lower CPU priority) that brings poked journals' indexes
    up to date once the store has been quiet `_QUIET` seconds (at most `_LATEST` after a poke):
    indexing never competes with a burst of compactions; idle, it waits `_LINGER` seconds for
    more (the next compaction's poke then starts no thread) and ends, or ends at once when
    `close`d (the store closed, or collected: the thread holds the store weakly). `work(path, stopped)`
    is called with each journal path and a check that tells it to stop early (between two
    transactions); what it raises is logged and dropped (a reader catches up itself)."""

    def __init__(self, work: Callable[[Path, Callable[[], bool]], None]) -> None:
        self._work = weakref.WeakMethod(work) if inspect.ismethod(work) else (lambda: work)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: dict[Path, float] = {}
        self._last = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._busy = False  # a journal handed to the work, not done yet

    def poke(self, path: Path) -> None:
        with self._lock:
            now = time.monotonic()
            self._pending.setdefault(path, now)
            self._last = now
            if self._thread is None:
                self._stop = threading.Event()  # each thread its own: a closed one stays stopped
                self._thread = threading.Thread(target=self._run, args=(self._stop,), name="cmdc-index", daemon=True)
                self._thread.start()
            self._wake.notify()

    def close(self) -> threading.Thread | None:
        """Drop the work not started and tell the thread to end (after the transaction in
        progress, if any); returns it (for a test to join). Quick: it never waits. A later
        `poke` starts a new thread. What is dropped is caught up by the next reader."""
        with self._lock:
            self._pending.clear()
            thread, self._thread = self._thread, None
            self._stop.set()
            self._wake.notify_all()
        return thread

    def _next(self, stop: threading.Event) -> Path | None:
        with self._lock:
            if not stop.is_set():  # (a closed thread's work is not the current thread's)
                self._busy = False  # (the work handed out last is done)
            idle_since: float | None = None
            while True:
                if stop.is_set():  # closed: `close` let go of this thread already
                    return None
                if not self._pending:
                    # idle: it waits a while for the next poke before it ends (a compaction
                    # minutes after the last then starts no thread: ~0.1-0.2 ms of its time)
                    now = time.monotonic()
                    idle_since = now if idle_since is None else idle_since
                    if now - idle_since >= _LINGER:
                        self._thread = None
                        return None
                    self._wake.wait(_LINGER - (now - idle_since))
                    continue
                idle_since = None
                now = time.monotonic()
                oldest = min(self._pending.values())
                due = min(self._last + _QUIET, oldest + _LATEST)
                if now >= due:
                    path = min(self._pending, key=self._pending.__getitem__)
                    del self._pending[path]
                    self._busy = True
                    return path
                self._wake.wait(due - now)

    def _run(self, stop: threading.Event) -> None:
        from ...events import logger

        with contextlib.suppress(OSError, AttributeError):  # Linux: this thread alone yields to the others
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        _BACKGROUND.active = True

        while (path := self._next(stop)) is not None:
            work = self._work()
            if work is None:  # the store was collected
                return
            try:
                work(path, stop.is_set)
            except Exception:
                logger.debug("offload: indexing %s failed", path, exc_info=True)
            finally:
                del work

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """For tests: whether the thread finished its work within `timeout` (it may linger,
        idle, for the next poke)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._thread is None or (not self._pending and not self._busy):
                    return True
            time.sleep(0.01)
        return False


def iter_spans(fd: int, spans: Sequence[Span]) -> Iterator[tuple[int, bytes]]:
    """Each span's line (without its newline), read from the journal at `fd`."""
    for seq, off, length in spans:
        line = os.pread(fd, length, off)
        counted("bytes", len(line))
        yield seq, line
