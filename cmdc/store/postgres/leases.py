"""The PostgreSQL store's name leases (the `Leases` half of the store protocol), a part of
`PostgresStore`.

A lease is a row (owner, fencing token, expiry by the server's clock). Every write for an agent
whose lease this store holds first locks that row FOR SHARE and checks the owner and token, in
the write's own transaction: a takeover (an UPDATE of the row) waits for writes in progress, and
a write after a takeover finds another token and raises `LeaseLost`."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg

from ..._check import is_number
from ...errors import ConfigError, LeaseLost, NameLeased
from ...state import validate_agent_id

T = TypeVar("T")


class LeaseRows:
    """`PostgresStore`'s lease methods and the fence every write checks."""

    if TYPE_CHECKING:  # given by `PostgresStore`
        _held: dict[str, tuple[str, int]]

        async def _run(self, fn: Callable[..., T], *args: Any, write: bool = False) -> T: ...

    def _fence(self, conn: psycopg.Connection[Any], agent_id: str) -> None:
        held = self._held.get(agent_id)
        if held is None:
            return
        row = conn.execute(
            "SELECT 1 FROM cmdc_leases WHERE agent_id = %s AND owner = %s AND token = %s FOR SHARE",
            (agent_id, held[0], held[1]),
        ).fetchone()
        if row is None:
            raise LeaseLost(
                f"agent {agent_id!r}: the name's lease (owner {held[0]!r}, token {held[1]}) was lost "
                "to another runtime; this write was refused"
            )

    async def acquire_lease(self, agent_id: str, owner: str, *, ttl: float, takeover: Collection[str] = ()) -> int:
        """Lease the name to `owner` for `ttl` seconds; return the fencing token. `NameLeased`
        while another owner (not in `takeover`) holds an unexpired lease."""
        validate_agent_id(agent_id)
        _check_owner(owner)
        span = _check_ttl(ttl)
        token, holder = await self._run(self._acquire_sync, agent_id, owner, span, list(takeover), write=True)
        if token is None:
            who, left = holder if holder is not None else ("?", 0.0)
            raise NameLeased(f"agent {agent_id!r} is leased to {who!r} for {left:.1f} s more")
        self._held[agent_id] = (owner, token)
        return token

    @staticmethod
    def _acquire_sync(
        conn: psycopg.Connection[Any], agent_id: str, owner: str, ttl: float, takeover: list[str]
    ) -> tuple[int | None, tuple[str, float] | None]:
        with conn.transaction():
            row = conn.execute(
                "INSERT INTO cmdc_leases AS l (agent_id, owner, token, expires_at) "
                "VALUES (%s, %s, nextval('cmdc_lease_tokens'), clock_timestamp() + make_interval(secs => %s)) "
                "ON CONFLICT (agent_id) DO UPDATE SET owner = excluded.owner, token = excluded.token, "
                "expires_at = excluded.expires_at "
                "WHERE l.expires_at < clock_timestamp() OR l.owner = excluded.owner OR l.owner = ANY(%s) "
                "RETURNING token",
                (agent_id, owner, ttl, takeover),
            ).fetchone()
            if row is not None:
                return int(row[0]), None
            held = conn.execute(
                "SELECT owner, extract(epoch FROM expires_at - clock_timestamp()) FROM cmdc_leases WHERE agent_id = %s",
                (agent_id,),
            ).fetchone()
        return None, (None if held is None else (str(held[0]), float(held[1])))

    async def renew_leases(self, owner: str, *, ttl: float) -> list[str]:
        """Extend every lease `owner` holds through this store by `ttl` seconds; return the
        names still held (a lease taken over or broken meanwhile is not renewed, and forgotten)."""
        _check_owner(owner)
        span = _check_ttl(ttl)
        mine = {a: t for a, (o, t) in self._held.items() if o == owner}
        if not mine:
            return []
        kept = await self._run(self._renew_sync, owner, span, list(mine), [mine[a] for a in mine], write=True)
        for agent_id, token in mine.items():
            if agent_id not in kept and self._held.get(agent_id) == (owner, token):
                del self._held[agent_id]
        return sorted(kept)

    @staticmethod
    def _renew_sync(
        conn: psycopg.Connection[Any], owner: str, ttl: float, agents: list[str], tokens: list[int]
    ) -> set[str]:
        with conn.transaction():
            rows = conn.execute(
                "UPDATE cmdc_leases l SET expires_at = clock_timestamp() + make_interval(secs => %s) "
                "FROM unnest(%s::text[], %s::bigint[]) AS h(agent_id, token) "
                "WHERE l.agent_id = h.agent_id AND l.token = h.token AND l.owner = %s RETURNING l.agent_id",
                (ttl, agents, tokens, owner),
            ).fetchall()
        return {str(a) for (a,) in rows}

    async def release_lease(self, agent_id: str, owner: str, token: int) -> None:
        """Give up the lease `token` of `owner` on the name (a later grant is kept)."""
        validate_agent_id(agent_id)
        if self._held.get(agent_id) == (owner, token):
            del self._held[agent_id]
        await self._run(self._release_sync, agent_id, owner, int(token), write=True)

    @staticmethod
    def _release_sync(conn: psycopg.Connection[Any], agent_id: str, owner: str, token: int) -> None:
        with conn.transaction():
            conn.execute(
                "DELETE FROM cmdc_leases WHERE agent_id = %s AND owner = %s AND token = %s", (agent_id, owner, token)
            )

    async def break_leases(self, owner: str) -> int:
        """End every lease of `owner` (an owner known to be dead); return how many."""
        _check_owner(owner)
        for agent_id in [a for a, (o, _) in self._held.items() if o == owner]:
            del self._held[agent_id]
        return await self._run(self._break_sync, owner, write=True)

    @staticmethod
    def _break_sync(conn: psycopg.Connection[Any], owner: str) -> int:
        with conn.transaction():
            return conn.execute("DELETE FROM cmdc_leases WHERE owner = %s", (owner,)).rowcount


def _check_owner(owner: object) -> str:
    if not isinstance(owner, str) or not 1 <= len(owner) <= 200:
        raise ConfigError(f"a lease owner must be a string of 1 to 200 characters, got {owner!r:.80}")
    return owner


def _check_ttl(ttl: object) -> float:
    if not is_number(ttl) or not 0 < ttl <= 86_400:
        raise ConfigError(f"a lease ttl must be a positive number of seconds (at most a day), got {ttl!r}")
    return float(ttl)


__all__ = ["LeaseRows"]
