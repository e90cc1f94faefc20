"""Small trio helpers: one exception out of a nursery's group."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NoReturn

import trio


def reraise(exc: BaseException) -> NoReturn:
    """Raise `exc` keeping its own context (not the group it came in)."""
    context = exc.__context__
    try:
        raise exc
    finally:
        exc.__context__ = context
        del exc, context


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


def one_of(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """What a group out of a nursery whose tasks catch their own exceptions stands for: its
    first exception that is not a `Cancelled` (an interrupt, say), else its first `Cancelled`
    (they all stand for the one cancel)."""
    leaves = list(_leaves(group))
    return next((e for e in leaves if not isinstance(e, trio.Cancelled)), leaves[0])


__all__ = ["one_of", "reraise"]
