from __future__ import annotations

import enum
import pickle
from types import MappingProxyType
from typing import Any, Literal, TypedDict

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cmdc._frozen import freeze, thaw
from cmdc.errors import CmdcError, ConfigError
from cmdc.providers.base import ToolSchema
from cmdc.tools import Tool, ToolArgumentsError, tool, tool_from_schema, validate_arguments


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Point(TypedDict, total=False):
    x: int
    y: int


@tool
async def search(
    query: str,
    limit: int = 10,
    *,
    tags: list[str] | None = None,
    mode: Literal["fast", "deep"] = "fast",
    color: Color | None = None,
    weights: dict[str, float] | None = None,
    ids: tuple[int, ...] = (),
    anything: Any = None,
) -> dict[str, Any]:
    """Search the index for documents.

    Returns the matches, best first.

    Args:
        query: What to look for.
        limit (int): How many results to return,
            at most.
        tags: Only documents with these tags.
        mode: How hard to look.

    Returns:
        A dict.
    """
    return {"query": query, "limit": limit, "tags": tags, "mode": mode, "color": color, "ids": ids}


def test_schema_from_signature_and_docstring() -> None:
    assert isinstance(search, Tool)
    assert search.name == "search"
    assert search.description == "Search the index for documents."
    assert search.timeout is None
    expected = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to look for."},
            "limit": {"type": "integer", "description": "How many results to return, at most.", "default": 10},
            "tags": {
                "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                "description": "Only documents with these tags.",
                "default": None,
            },
            "mode": {"type": "string", "enum": ["fast", "deep"], "description": "How hard to look.", "default": "fast"},
            "color": {"anyOf": [{"type": "string", "enum": ["red", "blue"]}, {"type": "null"}], "default": None},
            "weights": {
                "anyOf": [{"type": "object", "additionalProperties": {"type": "number"}}, {"type": "null"}],
                "default": None,
            },
            "ids": {"type": "array", "items": {"type": "integer"}, "default": []},
            "anything": {"default": None},
        },
        "required": ["query"],
        "additionalProperties": False,
    }
    assert thaw(search.parameters) == expected
    assert search.schema == ToolSchema("search", "Search the index for documents.", search.parameters)


def test_scalar_and_optional_schemas() -> None:
    @tool
    async def f(a: float, b: bool, c: str | None, d: Point, e: list[Any], f: None = None) -> None:
        """One line."""

    props = thaw(f.parameters)["properties"]
    assert props["a"] == {"type": "number"}
    assert props["b"] == {"type": "boolean"}
    assert props["c"] == {"type": ["string", "null"]}
    assert props["d"] == {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": [],
        "additionalProperties": False,
    }
    assert props["e"] == {"type": "array", "items": {}}
    assert props["f"] == {"type": "null", "default": None}
    assert thaw(f.parameters)["required"] == ["a", "b", "c", "d", "e"]


def test_decorator_with_options() -> None:
    @tool(name="web-search", timeout=2.5)
    async def look(q: str) -> str:
        return q

    assert look.name == "web-search"
    assert look.timeout == 2.5
    assert look.description == ""

    @tool(description="Given.")
    async def other() -> str:
        """Ignored."""
        return ""

    assert other.description == "Given."
    assert thaw(other.parameters) == {"type": "object", "properties": {}, "required": [], "additionalProperties": False}


def test_what_is_not_a_function_is_refused() -> None:
    class NotAFunction:
        pass

    for bad in (NotAFunction, 42, "text"):
        with pytest.raises(ConfigError, match="must be a function"):
            tool(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="already a Tool"):
        tool(tool(_plain_add))


def test_varargs_refused() -> None:
    async def f(x: int, *rest: int) -> None: ...
    async def g(**kw: int) -> None: ...

    with pytest.raises(ConfigError, match="f: parameter 'rest'"):
        tool(f)
    with pytest.raises(ConfigError, match="g: parameter 'kw'"):
        tool(g)


@pytest.mark.parametrize("annotation", [bytes, set[int], tuple[int, str], dict[int, str], Literal[b"x"]])
def test_unsupported_annotation_refused(annotation: Any) -> None:
    async def fn(ok: int, bad: str) -> None: ...

    fn.__annotations__["bad"] = annotation
    with pytest.raises(ConfigError, match=r"fn: parameter 'bad'"):
        tool(fn)


def test_missing_annotation_refused() -> None:
    async def fn(x): ...  # type: ignore[no-untyped-def]

    with pytest.raises(ConfigError, match="parameter 'x' has no type annotation"):
        tool(fn)


def test_bad_tool_name_and_timeout() -> None:
    async def fn() -> None: ...

    with pytest.raises(ConfigError, match="tool name"):
        tool(fn, name="has space")
    with pytest.raises(ConfigError, match="timeout"):
        tool(fn, timeout=0)


def test_validate_missing_and_unknown() -> None:
    with pytest.raises(ToolArgumentsError) as info:
        search.validate({"limit": 3, "colour": "red"})
    err = info.value
    assert isinstance(err, CmdcError) and isinstance(err, ValueError)
    assert err.tool == "search"
    assert err.errors == (
        'arguments: missing required argument "query" (expected string)',
        'arguments: unknown argument "colour" (allowed: "query", "limit", "tags", "mode", "color", '
        '"weights", "ids", "anything")',
    )
    assert str(err).startswith("invalid arguments for tool 'search':\n- arguments: missing")


def test_validate_wrong_types_all_reported() -> None:
    with pytest.raises(ToolArgumentsError) as info:
        search.validate(
            {
                "query": 5,
                "limit": True,
                "tags": ["a", 2, "c"],
                "mode": "slow",
                "color": "green",
                "weights": {"w": "heavy"},
            }
        )
    assert info.value.errors == (
        "arguments.query: expected string, got integer 5",
        "arguments.limit: expected integer, got boolean true",
        "arguments.tags[1]: expected string, got integer 2",
        'arguments.mode: expected one of "fast", "deep", got string "slow"',
        'arguments.color: expected one of "red", "blue" or null, got string "green"',
        'arguments.weights.w: expected number, got string "heavy"',
    )
    assert len(str(info.value).splitlines()) == 7


def test_nested_paths_and_string_for_number() -> None:
    schema = {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"type": "integer"}},
            "scale": {"type": "number"},
            "point": {
                "type": "object",
                "properties": {"x": {"type": "number"}},
                "required": ["x"],
                "additionalProperties": False,
            },
        },
    }
    with pytest.raises(ToolArgumentsError) as info:
        validate_arguments(schema, {"items": [1, 2.0, "x", 4.5], "scale": "1.5", "point": {"y": 1}, "free": 1})
    assert info.value.errors == (
        'arguments.items[2]: expected integer, got string "x"',
        "arguments.items[3]: expected integer, got number 4.5",
        'arguments.scale: expected number, got string "1.5"',
        'arguments.point: missing required property "x" (expected number)',
        'arguments.point: unknown property "y" (allowed: "x")',
    )


def test_bounds_and_any_of() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 1, "maximum": 10},
            "s": {"type": "string", "minLength": 2},
            "v": {"anyOf": [{"type": "integer"}, {"type": "string", "enum": ["auto"]}]},
        },
    }
    assert validate_arguments(schema, {"n": 10, "s": "ab", "v": "auto"}) == {"n": 10, "s": "ab", "v": "auto"}
    with pytest.raises(ToolArgumentsError) as info:
        validate_arguments(schema, {"n": 11, "s": "a", "v": "manual"})
    assert info.value.errors == (
        "arguments.n: expected a number at least 1 and at most 10, got 11",
        "arguments.s: expected a string length at least 2, got 1",
        'arguments.v: expected integer or one of "auto", got string "manual"',
    )


def test_not_an_object_and_pickling() -> None:
    with pytest.raises(ToolArgumentsError, match="arguments: expected an object, got array"):
        validate_arguments({"type": "object"}, [1])
    err = ToolArgumentsError(["a: b"], tool="t")
    again = pickle.loads(pickle.dumps(err))
    assert again.errors == ("a: b",) and again.tool == "t" and str(again) == str(err)


def test_validate_normalizes() -> None:
    frozen = freeze({"query": "q", "limit": 3.0, "tags": ["a"], "ids": [1, 2], "color": "red"}, "args")
    assert isinstance(frozen, MappingProxyType)
    kwargs = search.validate(frozen)
    assert kwargs == {"query": "q", "limit": 3, "tags": ["a"], "ids": (1, 2), "color": Color.RED}
    assert type(kwargs["limit"]) is int


async def test_call_renders_results() -> None:
    out = await search.run({"query": "q", "color": "blue", "ids": [3]})
    assert out == '{"query":"q","limit":10,"tags":null,"mode":"fast","color":"blue","ids":[3]}'

    async def returns(value: Any) -> Any:
        return value

    echo = tool_from_schema("echo", "Echo.", {"type": "object", "properties": {"value": {}}}, returns)
    assert await echo.run({"value": "text"}) == "text"
    assert await echo.run({"value": None}) == ""
    assert await echo.run({"value": [1, "a"]}) == '[1,"a"]'
    assert await echo.run({"value": {"a": {"b": 1}}}) == '{"a":{"b":1}}'
    assert await echo.run({"value": b"\xff"}) == "b'\\xff'"
    with pytest.raises(ToolArgumentsError, match="'echo'"):
        await echo.run([])  # type: ignore[arg-type]


def test_tool_from_schema_checks() -> None:
    async def fn() -> None: ...

    with pytest.raises(ConfigError, match='"type": "object"'):
        tool_from_schema("t", "", {"type": "array"}, fn)
    with pytest.raises(ConfigError, match="must be a function"):
        tool_from_schema("t", "", {"type": "object"}, 42)  # type: ignore[arg-type]


_SCALAR_TYPES = {
    "string": st.text(),
    "integer": st.integers(),
    "number": st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False)),
    "boolean": st.booleans(),
    "null": st.none(),
}


@settings(max_examples=200, deadline=None)  # a loaded machine stalls single examples
@given(st.data())
def test_valid_scalar_arguments_pass_unchanged(data: st.DataObject) -> None:
    names = data.draw(st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), unique=True, max_size=6))
    types = {
        n: data.draw(st.lists(st.sampled_from(sorted(_SCALAR_TYPES)), min_size=1, max_size=2, unique=True))
        for n in names
    }
    required = [n for n in names if data.draw(st.booleans())]
    schema = {
        "type": "object",
        "properties": {n: {"type": t[0] if len(t) == 1 else t} for n, t in types.items()},
        "required": required,
        "additionalProperties": False,
    }
    args = {
        n: data.draw(st.one_of(*(_SCALAR_TYPES[x] for x in t)))
        for n, t in types.items()
        if n in required or data.draw(st.booleans())
    }
    out = validate_arguments(schema, args)
    assert out == args
    assert all(type(out[k]) is type(v) for k, v in args.items())


async def test_optional_enum_none_and_attrs_result() -> None:
    @attrs.frozen
    class Hit:
        color: str
        score: float

    @tool
    async def pick(color: Color | None, scores: list[float]) -> Hit | None:
        return None if color is None else Hit(color.value, max(scores))

    assert pick.validate({"color": None, "scores": [1]}) == {"color": None, "scores": [1]}
    assert await pick.run({"color": None, "scores": [1]}) == ""
    assert await pick.run({"color": "red", "scores": [1, 2.5]}) == '{"color":"red","score":2.5}'
    assert len({pick, search}) == 2 and pick != tool(pick.fn)


def _plain_add(a: int, b: int = 2) -> int:
    """Add two integers (blocking)."""
    return a + b


async def test_a_plain_function_runs_in_a_worker_thread() -> None:
    import threading

    main = threading.get_ident()
    seen: list[int] = []

    @tool
    def blocking(path: str, times: int = 1) -> str:
        """Read something slowly."""
        seen.append(threading.get_ident())
        return path * times

    assert not blocking.is_async and list(blocking.schema.parameters["required"]) == ["path"]
    assert await blocking.run({"path": "ab", "times": 2}) == "abab"
    assert seen and seen[0] != main  # not on the trio thread
    assert blocking("x", times=3) == "xxx"  # still the function, called directly
    with pytest.raises(ToolArgumentsError):
        await blocking.run({"times": 2})


async def test_a_decorated_tool_is_still_its_function() -> None:
    @tool
    async def read(path: str) -> str:
        """Read a file."""
        return f"<{path}>"

    assert await read("a.txt") == "<a.txt>" and await read(path="b") == "<b>"
    assert tool(_plain_add)(1) == 3
    with pytest.warns(DeprecationWarning, match="tool.run"):
        assert await read({"path": "old form"}) == "<old form>"

    @tool
    async def takes_a_mapping(options: dict[str, int]) -> int:
        """Count options."""
        return len(options)

    assert await takes_a_mapping({"a": 1, "b": 2}) == 2  # a mapping argument, not model arguments


async def test_a_plain_tool_over_its_timeout_is_abandoned_not_waited_for(tmp_path: Any) -> None:
    import threading

    release = threading.Event()

    @tool(timeout=0.05)
    def stuck() -> str:
        """Never answers in time."""
        release.wait(10)
        return "late"

    from cmdc import Message, open_runtime
    from cmdc.providers import ScriptedProvider

    provider = ScriptedProvider([ScriptedProvider.tool_call("stuck", {}), "done"])
    try:
        async with open_runtime(log_events=False) as rt:
            agent = await rt.spawn("a", provider, tools=[stuck], config={"compact_offload_dir": str(tmp_path)})
            assert (await agent.prompt("go")).text == "done"
            result = next(m for m in (await agent.state()).messages if m.role == "tool")
            assert isinstance(result, Message) and result.is_error and "timed out" in result.text
    finally:
        release.set()
