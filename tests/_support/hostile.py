"""What the hostile-input tests share: hypothesis settings and strategies of hostile values, and
the bound every example runs under (`trio.fail_after(LIMIT)`, in a temp working directory): an
example ends in a clean result or a typed `CmdcError`, never another exception, never a hang.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from cmdc import (
    CmdcError,
    Message,
    State,
    ToolCall,
)

LIMIT = 20  # seconds per example: "never a hang"
EXAMPLES = int(os.environ.get("CMDC_HOSTILE_EXAMPLES", "60"))  # more for a long run
SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)

SURROGATES = st.sampled_from(["\ud800", "\udfff", "\udc80x", "a\ud83d"])
hostile_text = st.one_of(
    st.text(),
    st.text(alphabet=st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF, categories=None), max_size=20),
    st.builds(lambda a, s, b: a + s + b, st.text(max_size=10), SURROGATES, st.text(max_size=10)),
    st.sampled_from(["", "\x00", "a\x00b", "\u2028", "\ufeff", "\U0001f600" * 3]),
)
huge_text = st.one_of(hostile_text, st.sampled_from(["x" * 100_000, "é" * 300_000 + "\ud800", "\x00" * 200_000]))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**62, max_value=2**70),
    st.floats(),
    st.sampled_from([math.nan, math.inf, -0.0, 1e308]),
    hostile_text,
    st.binary(max_size=8),
)
json_like = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(hostile_text, inner, max_size=4),
        st.dictionaries(st.integers(), inner, max_size=2),
    ),
    max_leaves=12,
)


def _plain(value: Any) -> bool:
    """Whether JSON can hold `value` (orjson encodes it)."""
    try:
        orjson.dumps(value)
    except TypeError:
        return False
    return True


def _arguments(value: Any) -> bool:
    """Whether `value` makes valid tool-call arguments."""
    try:
        Message.assistant("", tool_calls=(ToolCall(id="x", name="n", arguments=value),))
    except CmdcError:
        return False
    return True


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(depth):
        value = {"k": value} if i % 2 else [value]
    return value


deep = st.integers(0, 3_000).map(nested)


@asynccontextmanager
async def bounded() -> AsyncIterator[Path]:
    """A temp directory as the working directory (relative offload dirs land in it) for one
    example, under `trio.fail_after(LIMIT)`."""
    old = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="cmdc-hostile-") as tmp:
        os.chdir(tmp)
        try:
            with trio.fail_after(LIMIT):
                yield Path(tmp)
        finally:
            os.chdir(old)


async def typed(fn: Callable[[], Any]) -> Any:
    """Await `fn()`: return its result, or the `CmdcError` it raised. Anything else fails."""
    try:
        return await fn()
    except CmdcError as exc:
        return exc


def rounds(state: State, n: int) -> State:
    for r in range(n):
        call = ToolCall(id=f"h{r}", name="t", arguments={"r": r})
        state = state.append(
            Message.user(f"u{r}"),
            Message.assistant("", tool_calls=(call,)),
            Message.tool_result(call.id, "ok"),
            Message.assistant(f"a{r}"),
        )
    return state


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths(v, (*prefix, i))
    return out


def replaced(value: Any, path: tuple[Any, ...], new: Any, delete: bool) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    copy: Any = dict(value) if isinstance(value, dict) else list(value)
    if delete and not rest:
        del copy[head]
    else:
        copy[head] = replaced(copy[head], rest, new, delete)
    return copy
