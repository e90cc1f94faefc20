"""The bridge between Ray and trio: trio code awaits a Ray `ObjectRef` through its future's
done-callback (`trio_token.run_sync_soon`), never blocking the trio thread; the caller's calls to
one node are batched (`Bridge`)."""

from __future__ import annotations

import contextlib
import itertools
import pickle
from typing import Any

import attrs
import ray
import ray.exceptions
import trio

from ..errors import CmdcError

DEAD = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)


async def await_ref(ref: Any) -> Any:
    """The value of a Ray `ObjectRef`, awaited from trio without blocking its thread: Ray's
    future wakes the trio task through the run's token. Cancelling the wait does not cancel the
    remote call (the caller decides what to do about it)."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_future: object) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    future = ref.future()
    future.add_done_callback(wake)
    await done.wait()
    return future.result()


def portable(exc: Exception) -> Exception:
    """`exc`, or a `CmdcError` saying what it was if it cannot be pickled (one such error
    must not spoil a batch of answers)."""
    try:
        pickle.dumps(exc)
    except Exception:
        return CmdcError(f"{type(exc).__name__}: {exc}")
    return exc


class _NodeDied(Exception):
    """The node actor of a bridge is dead (raised to the callers waiting on it)."""


@attrs.define
class Pending:
    done: trio.Event = attrs.Factory(trio.Event)
    answer: tuple[bool, Any] = (False, None)
    dead: bool = False


class Bridge:
    """The caller's calls to one node, batched: the calls made while a batch is on its way go
    together in the next `submit`, and one long-polled `results` call brings back every answer
    ready. Per turn, this costs a fraction of a Ray call on each side (one Ray call per turn,
    each holding a node thread for the whole turn, cost the node more CPU than the turn)."""

    def __init__(self, node: NodeRef) -> None:
        self.node = node
        self._ids = itertools.count()
        self._waiting: dict[int, Pending] = {}
        self._outbox: list[tuple[int, str, str, tuple[Any, ...]]] = []
        self._work = trio.Event()
        self.dead = False

    async def call(self, name: str, op: str, args: tuple[Any, ...]) -> Any:
        if self.dead:
            raise _NodeDied(self.node.key)
        call_id = next(self._ids)
        pending = self._waiting[call_id] = Pending()
        self._outbox.append((call_id, name, op, args))
        self._work.set()
        try:
            await pending.done.wait()
        finally:
            self._waiting.pop(call_id, None)
        if pending.dead:
            raise _NodeDied(self.node.key)
        return unwrap(pending.answer)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._send)
            nursery.start_soon(self._receive)

    async def _send(self) -> None:
        while not self.dead:
            await self._work.wait()
            self._work = trio.Event()
            batch, self._outbox = self._outbox, []
            await self._submit(batch)

    async def _submit(self, batch: list[tuple[int, str, str, tuple[Any, ...]]]) -> None:
        try:
            await await_ref(self.node.handle.submit.remote(batch))
        except DEAD:
            self._die()
        except Exception as exc:  # something Ray could not carry: try each call alone
            if len(batch) > 1:
                for one in batch:
                    await self._submit([one])
                return
            pending = self._waiting.get(batch[0][0])
            if pending is not None:
                pending.answer = (False, exc)
                pending.done.set()

    async def _receive(self) -> None:
        while not self.dead:
            try:
                ok, answers = await await_ref(self.node.handle.results.remote(1.0))
            except DEAD:
                self._die()
                return
            if not ok:  # the node's runtime is gone (closing): do not spin
                await trio.sleep(0.1)
                continue
            for call_id, good, value in answers:
                pending = self._waiting.get(call_id)
                if pending is not None:
                    pending.answer = (good, value)
                    pending.done.set()

    def _die(self) -> None:
        self.dead = True
        for pending in self._waiting.values():
            pending.dead = True
            pending.done.set()


def unwrap(answer: tuple[bool, Any]) -> Any:
    ok, value = answer
    if not ok:
        raise value
    return value


@attrs.define
class NodeRef:
    key: str
    owner: str
    handle: Any
    seq: int = 0  # join number: 0, 1, ... in the order nodes joined the cluster runtime
    node_id: str = ""  # the Ray node it is pinned to


__all__ = ["DEAD", "Bridge", "NodeRef", "Pending", "await_ref", "portable", "unwrap"]
