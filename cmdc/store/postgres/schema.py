"""The PostgreSQL store's schema: its tables, versioned in `cmdc_meta`, created or migrated by
`migrate` under an advisory lock (two processes opening one database at once do not race)."""

from __future__ import annotations

from typing import Any

import psycopg

from ...errors import CmdcError

SCHEMA_VERSION = 7
_LOCK_KEY = 0x636D6463  # the advisory lock that serializes schema migrations ("cmdc")

_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE cmdc_journals (
            agent_id text PRIMARY KEY,
            journal text NOT NULL,
            seq bigint NOT NULL DEFAULT 0
        )""",
        """CREATE TABLE cmdc_attempts (
            agent_id text NOT NULL,
            attempt text NOT NULL,
            committed boolean NOT NULL DEFAULT false,
            PRIMARY KEY (agent_id, attempt)
        )""",
        """CREATE TABLE cmdc_records (
            agent_id text NOT NULL,
            seq bigint NOT NULL,
            journal text NOT NULL,
            attempt text NOT NULL,
            compaction integer NOT NULL,
            ts double precision NOT NULL,
            message_id text NOT NULL,
            crc bigint NOT NULL,
            message bytea NOT NULL,
            body text NOT NULL,
            words tsvector GENERATED ALWAYS AS (to_tsvector('simple', body)) STORED,
            PRIMARY KEY (agent_id, seq)
        )""",
        "CREATE UNIQUE INDEX cmdc_records_message ON cmdc_records (agent_id, message_id)",
        "CREATE INDEX cmdc_records_words ON cmdc_records USING gin (words)",
        """CREATE TABLE cmdc_checkpoints (
            agent_id text PRIMARY KEY,
            state bytea NOT NULL,
            crc bigint NOT NULL,
            saved_at double precision NOT NULL
        )""",
    ),
    2: (
        # the journal a successor took over from, when the one a state expected was lost
        "ALTER TABLE cmdc_journals ADD COLUMN follows text",
        # damaged rows moved aside by `repair`, kept as they were
        """CREATE TABLE cmdc_damaged (
            agent_id text NOT NULL,
            seq bigint NOT NULL,
            journal text NOT NULL,
            attempt text NOT NULL,
            compaction integer NOT NULL,
            ts double precision NOT NULL,
            message_id text NOT NULL,
            crc bigint NOT NULL,
            message bytea NOT NULL,
            reason text NOT NULL,
            moved_at double precision NOT NULL,
            PRIMARY KEY (agent_id, seq)
        )""",
    ),
    3: (
        # the agent is a lexeme of its records' search vector (one no text can produce: it holds
        # a space), so the GIN index finds one agent's matches without reading other agents' rows
        "DROP INDEX cmdc_records_words",
        "ALTER TABLE cmdc_records DROP COLUMN words",
        "ALTER TABLE cmdc_records ADD COLUMN words tsvector GENERATED ALWAYS AS "
        "(to_tsvector('simple', body) || array_to_tsvector(ARRAY['cmdc agent=' || agent_id])) STORED",
        "CREATE INDEX cmdc_records_words ON cmdc_records USING gin (words)",
    ),
    4: (  # name leases (one row per leased agent) and their fencing tokens
        "CREATE SEQUENCE cmdc_lease_tokens",
        """CREATE TABLE cmdc_leases (
            agent_id text PRIMARY KEY,
            owner text NOT NULL,
            token bigint NOT NULL,
            expires_at timestamptz NOT NULL
        )""",
        "CREATE INDEX cmdc_leases_owner ON cmdc_leases (owner)",
    ),
    5: (
        # new entries wait in the index's pending list, which every search reads whole: keep it
        # short (256 kB, not the server's default, 4 MB) so a search right after a large append stays fast
        "ALTER INDEX cmdc_records_words SET (gin_pending_list_limit = 256)",
    ),
    6: (
        # the search vectors move to a table of their own, filled after the journal's commit by the
        # store's indexer (`PostgresStore.index`): a journal batch no longer computes vectors or
        # updates the GIN index in its transaction. `cmdc_journals.indexed_seq`: every record up
        # to it is in `cmdc_search`; a search reads the records past it without the index.
        """CREATE TABLE cmdc_search (
            agent_id text NOT NULL,
            seq bigint NOT NULL,
            words tsvector NOT NULL,
            PRIMARY KEY (agent_id, seq)
        )""",
        "INSERT INTO cmdc_search (agent_id, seq, words) SELECT agent_id, seq, words FROM cmdc_records",
        "CREATE INDEX cmdc_search_words ON cmdc_search USING gin (words) WITH (gin_pending_list_limit = 256)",
        "ALTER TABLE cmdc_journals ADD COLUMN indexed_seq bigint NOT NULL DEFAULT 0",
        "UPDATE cmdc_journals SET indexed_seq = seq",
        "ALTER TABLE cmdc_records DROP COLUMN words",  # and its index
    ),
    7: (
        # every recorded loss, not only the last: a successor journal and the one it took over
        # from, so a state naming a journal two or more losses back goes on in the newest
        """CREATE TABLE cmdc_journal_links (
            agent_id text NOT NULL,
            journal text NOT NULL,
            follows text NOT NULL,
            PRIMARY KEY (agent_id, journal)
        )""",
        "INSERT INTO cmdc_journal_links (agent_id, journal, follows) "
        "SELECT agent_id, journal, follows FROM cmdc_journals WHERE follows IS NOT NULL",
    ),
}

def migrate(conn: psycopg.Connection[Any]) -> int:
    """Create or bring the schema up to `SCHEMA_VERSION` (under an advisory lock, so two
    processes opening one database at once do not race); return the version found before.
    A database from a newer cmdc is refused."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute("CREATE TABLE IF NOT EXISTS cmdc_meta (key text PRIMARY KEY, value text NOT NULL)")
        row = conn.execute("SELECT value FROM cmdc_meta WHERE key = 'schema_version'").fetchone()
        found = 0 if row is None else int(row[0])
        if found > SCHEMA_VERSION:
            raise CmdcError(
                f"the database holds cmdc schema version {found}; this cmdc knows up to {SCHEMA_VERSION}: upgrade cmdc"
            )
        for version in range(found + 1, SCHEMA_VERSION + 1):
            for statement in _MIGRATIONS[version]:
                conn.execute(statement)
        if found != SCHEMA_VERSION:
            conn.execute(
                "INSERT INTO cmdc_meta (key, value) VALUES ('schema_version', %s) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(SCHEMA_VERSION),),
            )
    return found


__all__ = ["SCHEMA_VERSION", "migrate"]
