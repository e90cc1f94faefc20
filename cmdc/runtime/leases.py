"""Name leases: with `open_runtime(lease_ttl=...)` (on by default with a shared store), every
name a runtime makes resident is leased to it in the store first, renewed in the background, and
given up when the agent leaves memory: among all the runtimes sharing a store, a name is active
in at most one."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import trio

from ..errors import CmdcError
from ..events import LEASE_LOST
from ..store import Leases

DEFAULT_LEASE_TTL = 30.0
"""Seconds a name lease lasts by default on a shared store (see `open_runtime`): renewed every
10 s; a runtime that died without releasing it holds the name this long at most."""


class NameLeases:
    """The runtime's name leases (a part of `Runtime`)."""

    lease_ttl: float | None
    lease_owner: str | None
    lease_takeover: set[str]  # owners known dead: their leases may be taken over
    _leases: Leases | None
    _leased: dict[str, int]  # resident name -> its lease's fencing token
    _closed: bool
    _nursery: trio.Nursery

    if TYPE_CHECKING:

        def _emit(self, name: str, kind: str, **data: Any) -> None: ...

    async def _lease(self, name: str) -> None:
        """Take the store's lease on `name` for this runtime (with leases on; else a no-op)."""
        if self._leases is None:
            return
        assert self.lease_ttl is not None and self.lease_owner is not None
        token = await self._leases.acquire_lease(
            name, self.lease_owner, ttl=self.lease_ttl, takeover=tuple(self.lease_takeover)
        )
        self._leased[name] = token

    def _unlease(self, name: str) -> None:
        """Give the lease on `name` up, in the background (a later grant to this runtime is kept)."""
        token = self._leased.pop(name, None)
        if token is None or self._leases is None or self._closed:
            return  # a closing runtime releases them all at once
        leases, owner = self._leases, self.lease_owner
        assert owner is not None

        async def release() -> None:
            with contextlib.suppress(CmdcError):  # unreleased, it expires
                await leases.release_lease(name, owner, token)

        self._nursery.start_soon(release)

    async def _renew_leases(self) -> None:
        """Renew this runtime's leases every third of their ttl. A lease found lost (it expired
        and another runtime took the name) is forgotten: the agent's next write raises
        `LeaseLost` and it leaves memory."""
        assert self._leases is not None and self.lease_ttl is not None and self.lease_owner is not None
        while True:
            await trio.sleep(self.lease_ttl / 3)
            if not self._leased:
                continue
            with contextlib.suppress(CmdcError):  # a store down: retried at the next round
                kept = set(await self._leases.renew_leases(self.lease_owner, ttl=self.lease_ttl))
                for name in [n for n in self._leased if n not in kept]:
                    self._emit(name, LEASE_LOST)

    async def _release_all(self) -> None:
        if self._leases is not None and self.lease_owner is not None:
            self._leased.clear()
            with contextlib.suppress(CmdcError):
                await self._leases.break_leases(self.lease_owner)


__all__ = ["DEFAULT_LEASE_TTL", "NameLeases"]
