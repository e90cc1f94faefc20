"""The PostgreSQL store's checkpoints: `cmdc_checkpoints` holds `State.to_json()` per agent;
saving a state also commits, in the same transaction, the journal attempts its summaries name
(a compaction's batch and the state that points at it become visible together)."""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from ..._redact import journal_label, redact_url
from ...errors import CheckpointCorrupted, ConfigError
from ...state import State, validate_agent_id
from ..records import ATTEMPTS_KEY

if TYPE_CHECKING:
    from .store import PostgresStore

T = TypeVar("T")


def _summary_attempts(state: State) -> list[str]:
    out: list[str] = []
    for m in state.messages:
        attempts = m.metadata.get(ATTEMPTS_KEY)
        if isinstance(attempts, (list, tuple)):
            out += [a for a in attempts if isinstance(a, str)]
    return out


class PostgresCheckpoints:
    """The checkpoint side of a `PostgresStore` (what `open_runtime` gives its agents)."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store

    def __repr__(self) -> str:
        return f"PostgresCheckpoints({redact_url(self._store.url)!r})"

    async def save(self, state: State) -> str:
        """Replace the agent's checkpoint with `state` and commit the journal attempts its
        summaries name, in one transaction; return where it is."""
        if not isinstance(state, State):
            raise TypeError(f"save takes a State, got {type(state).__name__}")
        validate_agent_id(state.agent_id)
        attempts = _summary_attempts(state)
        await self._store._run(self._store._save_sync, state.agent_id, state, attempts, write=True)
        if attempts and self._store.background_index:  # batches it committed: index them
            self._store._index_later([state.agent_id])
        return f"{journal_label(self._store.url)}#checkpoint/{state.agent_id}"

    async def load(self, agent_id: str) -> State | None:
        validate_agent_id(agent_id)
        row = await self._store._run(self._store._load_sync, agent_id)
        if row is None:
            return None
        data, crc = bytes(row[0]), row[1]
        if zlib.crc32(data) != crc:
            raise CheckpointCorrupted(f"checkpoint of {agent_id!r} in {redact_url(self._store.url)}: checksum mismatch")
        try:
            state = State.from_json(data)
        except ConfigError as exc:  # whole, but its config is refused now (e.g. a key of the user's own)
            raise ConfigError(
                f"checkpoint of {agent_id!r}: {exc} (saved before config keys were checked: rename it there)"
            ) from exc
        except Exception as exc:
            raise CheckpointCorrupted(f"checkpoint of {agent_id!r} is corrupted: {exc}") from exc
        if state.agent_id != agent_id:
            raise CheckpointCorrupted(f"checkpoint of {agent_id!r} holds agent {state.agent_id!r}")
        return state

    async def delete(self, agent_id: str) -> None:
        validate_agent_id(agent_id)
        await self._store._run(self._store._delete_sync, agent_id, write=True)

    async def agents(self) -> list[str]:
        """The agents that have a checkpoint, sorted."""
        return await self._store._run(self._store._list_sync)


class CheckpointRows:
    """`PostgresStore`'s checkpoint statements (each in its own transaction, fenced by the lease)."""

    if TYPE_CHECKING:  # given by `PostgresStore` (`LeaseRows`)

        def _fence(self, conn: psycopg.Connection[Any], agent_id: str) -> None: ...

        async def _run(self, fn: Callable[..., T], *args: Any, write: bool = False) -> T: ...

    async def agents(self) -> list[str]:
        """Every agent with a journal or a checkpoint here, sorted."""
        return await self._run(self._agents_sync)

    async def written_at(self, agent_ids: Sequence[str]) -> list[float | None]:
        """When each agent's checkpoint was last saved or its journal last written, whichever
        is later (None: neither exists)."""
        ids = [validate_agent_id(a) for a in agent_ids]
        saved = await self._run(self._saved_sync, ids)
        return [saved.get(a) for a in ids]

    @staticmethod
    def _agents_sync(conn: psycopg.Connection[Any]) -> list[str]:
        with conn.transaction():
            rows = conn.execute(
                "SELECT agent_id FROM cmdc_journals UNION SELECT agent_id FROM cmdc_checkpoints ORDER BY 1"
            )
            return [str(a) for (a,) in rows]

    @staticmethod
    def _saved_sync(conn: psycopg.Connection[Any], ids: list[str]) -> dict[str, float]:
        with conn.transaction():
            rows = conn.execute(
                "SELECT u.id, greatest((SELECT c.saved_at FROM cmdc_checkpoints c WHERE c.agent_id = u.id), "
                "(SELECT r.ts FROM cmdc_records r WHERE r.agent_id = u.id ORDER BY r.seq DESC LIMIT 1)) "
                "FROM unnest(%s::text[]) AS u(id)",
                (ids,),
            )
            return {str(a): float(t) for a, t in rows if t is not None}

    def _save_sync(self, conn: psycopg.Connection[Any], agent_id: str, state: State, attempts: list[str]) -> None:
        data = state.to_json()  # in the worker: a state holding megabytes is a long call
        with conn.transaction():
            self._fence(conn, agent_id)
            conn.execute(
                "INSERT INTO cmdc_checkpoints (agent_id, state, crc, saved_at) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (agent_id) DO UPDATE SET state = excluded.state, crc = excluded.crc, "
                "saved_at = excluded.saved_at",
                (agent_id, data, zlib.crc32(data), time.time()),
            )
            if attempts:  # the batches this state's summaries stand for become visible with it
                conn.execute(
                    "UPDATE cmdc_attempts SET committed = true WHERE agent_id = %s AND attempt = ANY(%s) "
                    "AND NOT committed",
                    (agent_id, attempts),
                )

    @staticmethod
    def _load_sync(conn: psycopg.Connection[Any], agent_id: str) -> tuple[Any, int] | None:
        with conn.transaction():
            row = conn.execute("SELECT state, crc FROM cmdc_checkpoints WHERE agent_id = %s", (agent_id,)).fetchone()
        return None if row is None else (row[0], int(row[1]))

    def _delete_sync(self, conn: psycopg.Connection[Any], agent_id: str) -> None:
        with conn.transaction():
            self._fence(conn, agent_id)
            conn.execute("DELETE FROM cmdc_checkpoints WHERE agent_id = %s", (agent_id,))

    @staticmethod
    def _list_sync(conn: psycopg.Connection[Any]) -> list[str]:
        with conn.transaction():
            return [str(a) for (a,) in conn.execute("SELECT agent_id FROM cmdc_checkpoints ORDER BY agent_id")]


__all__ = ["CheckpointRows", "PostgresCheckpoints"]
