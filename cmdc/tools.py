"""Tools: a spec (name, description, JSON-schema parameters) plus the function that runs it.

`@tool` builds a `Tool` from a typed function (`async def`, or a plain `def`, which runs in a
worker thread); `tool_from_schema` takes a hand-written
schema. `validate_arguments` is the small JSON-schema validator both use on a model's arguments.
A `ToolSource` (an MCP server, see `cmdc.mcp`) is started by the runtime and serves a `ToolSet`
whose tools may change while agents use them.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import re
import types
import typing
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, Union, overload, runtime_checkable

import attrs
import orjson
import trio

from ._check import optional_seconds
from ._frozen import freeze, freeze_mapping, past_bounds, thaw
from .errors import CmdcDeprecationWarning, ConfigError
from .errors import ToolArgumentsError as ToolArgumentsError  # its old home: old imports keep working
from .providers.base import ToolSchema

ToolFn = Callable[..., Any]
"""An `async def` function, or a plain (blocking) one: it runs in a worker thread."""
Converter = Callable[[Any], Any]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

VALIDATE_IN_THREAD = 1_000
"""Arguments with more values than this (through every level) are validated in a worker thread."""
MAX_DEPTH_IN_PLACE = 16
MAX_ERRORS = 100
"""The most problems `validate_arguments` collects; past it, it only counts them."""


def _freeze_parameters(value: Mapping[str, Any]) -> Mapping[str, Any]:
    try:
        frozen = freeze_mapping(value, "tool parameters")
    except TypeError as exc:
        raise ConfigError(str(exc)) from None
    if frozen.get("type") != "object":
        raise ConfigError('tool parameters must be a JSON schema with "type": "object"')
    return frozen


@attrs.frozen(eq=False)  # compared and hashed by identity: it wraps a function
class Tool:
    """A tool the model may call. `timeout` overrides the runtime's tool timeout for this tool.

    `converters` (built by `@tool`) turn validated JSON values into the Python types the
    function's annotations ask for (enum members, tuples).

    A tool is still its function: `await read_file("a.txt")` (or `add(1, 2)` for a plain
    `def`) calls it directly. `await tool.run(arguments)` runs it as a model's call does:
    arguments checked against the schema, a plain function in a worker thread, the result as
    text. A plain function that overruns its timeout is abandoned: the turn goes on, and its
    thread finishes in the background (Python cannot stop a thread)."""

    name: str
    description: str
    parameters: Mapping[str, Any] = attrs.field(converter=_freeze_parameters)
    fn: ToolFn
    timeout: float | None = None
    converters: Mapping[str, Converter] = attrs.field(factory=dict, repr=False)
    is_async: bool = attrs.field(init=False, repr=False)
    _takes_mapping: bool = attrs.field(init=False, repr=False)  # its first parameter is an object

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ConfigError(f"tool name {self.name!r} must be 1-64 letters, digits, '_' or '-'")
        if not callable(self.fn):
            raise ConfigError(f"tool {self.name}: its function must be callable, got {self.fn!r:.80}")
        optional_seconds(self.timeout, f"tool {self.name}: timeout")
        first = next(iter(dict(self.parameters.get("properties") or {}).values()), None)
        object.__setattr__(self, "is_async", _is_async(self.fn))
        object.__setattr__(self, "_takes_mapping", first is not None and _accepts_object(first))

    @property
    def schema(self) -> ToolSchema:
        return ToolSchema(name=self.name, description=self.description, parameters=self.parameters)

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments for `fn`, or `ToolArgumentsError` listing every problem."""
        try:
            kwargs = validate_arguments(self.parameters, arguments)
        except ToolArgumentsError as exc:
            raise ToolArgumentsError(exc.errors, tool=self.name) from None
        for key, convert in self.converters.items():
            if key in kwargs:
                kwargs[key] = convert(kwargs[key])
        return kwargs

    async def run(self, arguments: Mapping[str, Any]) -> str:
        """Run the tool as a model's call does: check `arguments` (`ToolArgumentsError`), call
        the function (a plain one in a worker thread), and render its result as text. Large
        arguments (past `VALIDATE_IN_THREAD` values) are checked in a worker thread."""
        if past_bounds(arguments, VALIDATE_IN_THREAD, MAX_DEPTH_IN_PLACE) is None:
            kwargs = self.validate(arguments)
        else:
            kwargs = await trio.to_thread.run_sync(self.validate, arguments)
        if self.is_async:
            result = await self.fn(**kwargs)
        else:
            result = await trio.to_thread.run_sync(functools.partial(self.fn, **kwargs), abandon_on_cancel=True)
            if inspect.isawaitable(result):
                result = await result
        return render_result(result)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The function itself, called as if it were not decorated."""
        if len(args) == 1 and not kwargs and isinstance(args[0], Mapping) and not self._takes_mapping:
            warnings.warn(
                "calling a Tool with a mapping of model arguments is deprecated: use `await tool.run(arguments)`",
                CmdcDeprecationWarning,
                stacklevel=2,
            )
            return self.run(args[0])
        return self.fn(*args, **kwargs)


def _is_async(fn: object) -> bool:
    target = fn.func if isinstance(fn, functools.partial) else fn
    return inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(type(target).__call__)


def _accepts_object(schema: object) -> bool:
    """Whether a JSON schema admits an object (a mapping passed positionally is then an argument)."""
    if not isinstance(schema, Mapping):
        return True
    kind = schema.get("type")
    if kind is None:
        options = schema.get("anyOf") or schema.get("oneOf")
        return any(_accepts_object(o) for o in options) if isinstance(options, (list, tuple)) else True
    return kind == "object" or (isinstance(kind, (list, tuple)) and "object" in kind)


def render_result(result: Any) -> str:
    """A tool's return value as text: a string as is, None as "", anything else as JSON."""
    if isinstance(result, str):
        return result
    if result is None:
        return ""
    try:
        default = lambda v: dict(v) if isinstance(v, Mapping) else attrs.asdict(v)  # noqa: E731
        return orjson.dumps(result, default=default, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # not JSON, not attrs: fall back to str()
        return str(result)


_JSON_TYPES: tuple[tuple[Any, str], ...] = (
    (type(None), "null"),
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    ((list, tuple), "array"),
    (Mapping, "object"),
)


def _type_name(value: object) -> str:
    return next((name for t, name in _JSON_TYPES if isinstance(value, t)), type(value).__name__)


def _describe(value: object) -> str:
    kind = _type_name(value)
    if kind in ("array", "object", "null"):
        return kind
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = repr(value)
    return f"{kind} {text[:60] + '...' if len(text) > 60 else text}"


def _is_type(name: str, value: object) -> bool:
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    return _type_name(value) in (("integer", "number") if name == "number" else (name,))


def _expected(schema: object) -> str:
    if not isinstance(schema, Mapping):
        return "any value" if schema is not False else "nothing"
    if "enum" in schema:
        return "one of " + ", ".join(orjson.dumps(thaw(v)).decode() for v in schema["enum"])
    if "anyOf" in schema:
        return " or ".join(_expected(s) for s in schema["anyOf"])
    kind = schema.get("type")
    if kind is None:
        return "any value"
    text = kind if isinstance(kind, str) else " or ".join(kind)
    if kind == "array" and isinstance(schema.get("items"), Mapping):
        text += f" of {_expected(schema['items'])}"
    return text


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if key.isidentifier() else f"{path}[{orjson.dumps(key).decode()}]"


def _check(schema: object, value: Any, path: str, errors: list[str]) -> Any:
    """Check `value` against `schema`, appending problems to `errors`; return it normalized."""
    if not isinstance(schema, Mapping):
        if schema is False:
            errors.append(f"{path}: no value is allowed here")
        return value
    if "anyOf" in schema:
        failed: list[list[str]] = []
        for sub in schema["anyOf"]:
            failed.append([])
            checked = _check(sub, value, path, failed[-1])
            if not failed[-1]:
                value = checked
                break
        else:  # if only one branch had the right type, its (deeper) errors say the most
            fits = [errs for errs in failed if not any(e.startswith(f"{path}: expected") for e in errs)]
            mismatch = f"{path}: expected {_expected(schema)}, got {_describe(value)}"
            errors.extend(fits[0] if len(fits) == 1 else [mismatch])
            return value
    kind = schema.get("type")
    if kind is not None:
        kinds = [kind] if isinstance(kind, str) else list(kind)
        match = next((k for k in kinds if _is_type(k, value)), None)
        if match is None:
            errors.append(f"{path}: expected {' or '.join(kinds)}, got {_describe(value)}")
            return value
        if match == "integer" and isinstance(value, float) and "number" not in kinds:
            value = int(value)
    if "enum" in schema and not any(
        isinstance(value, bool) == isinstance(e, bool) and value == e for e in schema["enum"]
    ):  # JSON equality: true is not 1
        errors.append(f"{path}: expected {_expected({'enum': schema['enum']})}, got {_describe(value)}")
        return value
    if _type_name(value) in ("integer", "number"):
        _bounds(schema, "minimum", "maximum", value, "a number", path, errors)
    elif isinstance(value, str):
        _bounds(schema, "minLength", "maxLength", len(value), "a string length", path, errors)
    elif isinstance(value, (list, tuple)):
        _bounds(schema, "minItems", "maxItems", len(value), "an array length", path, errors)
        value = [_check(schema.get("items", True), v, f"{path}[{i}]", errors) for i, v in enumerate(value)]
    elif isinstance(value, Mapping):
        value = _check_object(schema, value, path, errors)
    return value


def _bounds(
    schema: Mapping[str, Any], lo_key: str, hi_key: str, size: float, what: str, path: str, errors: list[str]
) -> None:
    lo, hi = schema.get(lo_key), schema.get(hi_key)
    if (lo is not None and size < lo) or (hi is not None and size > hi):
        limits = [f"at least {lo}"] * (lo is not None) + [f"at most {hi}"] * (hi is not None)
        errors.append(f"{path}: expected {what} {' and '.join(limits)}, got {size}")


def _check_object(schema: Mapping[str, Any], value: Mapping[str, Any], path: str, errors: list[str]) -> Any:
    word = "argument" if path == "arguments" else "property"
    props: Mapping[str, Any] = schema.get("properties") or {}
    for key in schema.get("required", ()):
        if key not in value:
            errors.append(f'{path}: missing required {word} "{key}" (expected {_expected(props.get(key))})')
    extra = schema.get("additionalProperties", True)
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key in props:
            out[key] = _check(props[key], item, _key_path(path, str(key)), errors)
        elif extra is False:
            allowed = ", ".join(f'"{k}"' for k in props) or "none"
            errors.append(f'{path}: unknown {word} "{key}" (allowed: {allowed})')
        else:
            out[key] = _check(extra, item, _key_path(path, str(key)), errors)
    return out


class _Problems(list[str]):
    """The problems found: the first `MAX_ERRORS` kept, the rest only counted."""

    more = 0

    def append(self, item: str) -> None:
        if len(self) < MAX_ERRORS:
            super().append(item)
        else:
            self.more += 1

    def extend(self, items: typing.Iterable[str]) -> None:
        for item in items:
            self.append(item)


def validate_arguments(schema: Mapping[str, Any], arguments: object) -> dict[str, Any]:
    """Check tool arguments against a JSON schema; return them as plain data (integral floats
    given for integers become ints) or raise `ToolArgumentsError` listing the problems (the
    first `MAX_ERRORS`, then how many more)."""
    if not isinstance(arguments, Mapping):
        raise ToolArgumentsError([f"arguments: expected an object, got {_describe(arguments)}"])
    errors = _Problems()
    checked = _check(schema, arguments, "arguments", errors)
    if errors:
        raise ToolArgumentsError([*errors, *([f"... and {errors.more:,} more problems"] if errors.more else [])])
    out: dict[str, Any] = thaw(checked)
    return out


_SCALARS: dict[object, str] = {str: "string", int: "integer", float: "number", bool: "boolean", None: "null"}


def _typed_enum(values: list[Any]) -> dict[str, Any]:
    for v in values:
        if v is not None and not isinstance(v, (str, int, float, bool)):
            raise ConfigError(f"enum value {v!r} is not a JSON scalar")
    kinds = {_type_name(v) for v in values}
    return {"type": kinds.pop(), "enum": values} if len(kinds) == 1 else {"enum": values}


def _schema_for(tp: Any) -> dict[str, Any]:
    if tp is Any:
        return {}
    if tp in _SCALARS or tp is type(None):
        return {"type": _SCALARS[None if tp is type(None) else tp]}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _typed_enum([m.value for m in tp])
    if typing.is_typeddict(tp):
        hints = typing.get_type_hints(tp)
        return {
            "type": "object",
            "properties": {k: _schema_for(t) for k, t in hints.items()},
            "required": [k for k in hints if k in tp.__required_keys__],
            "additionalProperties": False,
        }
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return _typed_enum(list(args))
    if origin in (Union, types.UnionType):
        members = [_schema_for(a) for a in args]
        if all(list(m) == ["type"] and isinstance(m["type"], str) for m in members):
            return {"type": [m["type"] for m in members]}
        return {"anyOf": members}
    if tp in (list, tuple) or origin is list or (origin is tuple and args[1:] == (Ellipsis,)):
        return {"type": "array", "items": _schema_for(args[0])} if args else {"type": "array"}
    if tp is dict or (origin is dict and args[:1] == (str,)):
        return {"type": "object", "additionalProperties": _schema_for(args[1])} if args else {"type": "object"}
    raise ConfigError(f"unsupported type annotation {tp!r}")


def _converter_for(tp: Any) -> Converter | None:
    """How to turn a validated JSON value into what the annotation asks for (None: as is)."""
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp
    if tp is tuple:
        return tuple
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (tuple, list, dict) and args:
        inner = _converter_for(args[1] if origin is dict else args[0])
        if origin is tuple:
            return (lambda v: tuple(map(inner, v))) if inner else tuple
        if origin is list and inner:
            return lambda v: [inner(x) for x in v]
        if origin is dict and inner:
            return lambda v: {k: inner(x) for k, x in v.items()}
    if origin in (Union, types.UnionType):
        others = [a for a in args if a is not type(None)]
        conv = _converter_for(others[0]) if len(others) == 1 else None
        if conv:
            return lambda v: None if v is None else conv(v)
    return None


_ARG_LINE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The first paragraph (as one line) and the Google-style "Args:" descriptions."""
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    summary: list[str] = []
    for line in lines:
        if not line.strip() or re.match(r"^\w[\w ]*:$", line.strip()):
            break
        summary.append(line.strip())
    params: dict[str, str] = {}
    in_args, current, indent = False, "", -1
    for line in lines:
        text, depth = line.strip(), len(line) - len(line.lstrip())
        if text and depth == 0:
            in_args, current, indent = text in ("Args:", "Arguments:", "Parameters:"), "", -1
        elif in_args and text:
            indent = depth if indent < 0 else indent
            match = _ARG_LINE.match(text)
            if depth == indent and match:
                current = match[1]
                params[current] = match[2].strip()
            elif current:
                params[current] = f"{params[current]} {text}".strip()
    return " ".join(summary), params


def _build(fn: ToolFn, name: str | None, description: str | None, timeout: float | None) -> Tool:
    label = getattr(fn, "__qualname__", repr(fn))
    if isinstance(fn, Tool):
        raise ConfigError(f"tool {fn.name}: already a Tool")
    if not callable(fn) or inspect.isclass(fn):
        raise ConfigError(f"tool {label}: must be a function (async def, or def to run in a worker thread)")
    try:  # only the parameters' annotations: the return type is not the model's business
        annotations = {k: v for k, v in getattr(fn, "__annotations__", {}).items() if k != "return"}
        globalns = getattr(inspect.unwrap(fn), "__globals__", {})
        hints = typing.get_type_hints(types.SimpleNamespace(__annotations__=annotations, __globals__=globalns))
    except Exception as exc:
        raise ConfigError(f"tool {label}: cannot resolve its type annotations ({exc})") from None
    summary, arg_docs = _parse_docstring(fn.__doc__)
    properties: dict[str, Any] = {}
    required: list[str] = []
    converters: dict[str, Converter] = {}
    for p in inspect.signature(fn).parameters.values():
        where = f"tool {label}: parameter {p.name!r}"
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ConfigError(f"{where}: *args and **kwargs are not supported; declare each argument")
        if p.kind is p.POSITIONAL_ONLY:
            raise ConfigError(f"{where}: positional-only parameters are not supported")
        if p.name not in hints:
            raise ConfigError(f"{where} has no type annotation")
        try:
            schema = _schema_for(hints[p.name])
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if p.name in arg_docs:
            schema["description"] = arg_docs[p.name]
        if p.default is p.empty:
            required.append(p.name)
        else:
            default = p.default.value if isinstance(p.default, enum.Enum) else p.default
            with contextlib.suppress(TypeError):  # not JSON: the model is not told the default
                schema["default"] = thaw(freeze(default, "default"))
        properties[p.name] = schema
        if conv := _converter_for(hints[p.name]):
            converters[p.name] = conv
    parameters = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    name = fn.__name__ if name is None else name
    description = summary if description is None else description
    return Tool(name, description, parameters, fn, timeout=timeout, converters=converters)


@overload
def tool(fn: ToolFn, *, name: str | None = ..., description: str | None = ..., timeout: float | None = ...) -> Tool: ...
@overload
def tool(
    fn: None = ..., *, name: str | None = ..., description: str | None = ..., timeout: float | None = ...
) -> Callable[[ToolFn], Tool]: ...
def tool(
    fn: ToolFn | None = None, *, name: str | None = None, description: str | None = None, timeout: float | None = None
) -> Tool | Callable[[ToolFn], Tool]:
    """Build a `Tool` from a typed function: `@tool` or `@tool(name=..., timeout=...)`. An
    `async def` runs in the agent's task; a plain `def` (blocking I/O, CPU work) runs in a
    worker thread. The tool can still be called like the function.

    The docstring's first paragraph is the description, its "Args:" section describes the
    parameters; parameters without a default are required. Unsupported signatures raise
    `ConfigError` naming the function and the parameter."""
    if fn is None:
        return lambda f: _build(f, name, description, timeout)
    return _build(fn, name, description, timeout)


class ToolSet:
    """A live set of tools from outside (an MCP server's), served by a started `ToolSource`.

    `tools` is the current listing by name; `version` grows with every change, so an agent
    rebuilds its view only when the set changed. `error` says why the source stopped serving,
    when it did (its tools then answer the model with that error)."""

    __slots__ = ("_tools", "error", "name", "version")

    def __init__(self, name: str) -> None:
        self.name = name
        self._tools: dict[str, Tool] = {}
        self.version = 0
        self.error: str | None = None

    @property
    def tools(self) -> Mapping[str, Tool]:
        return types.MappingProxyType(self._tools)

    def replace(self, tools: typing.Iterable[Tool]) -> None:
        """The new listing (a later tool with a name already taken is dropped)."""
        fresh: dict[str, Tool] = {}
        for t in tools:
            fresh.setdefault(t.name, t)
        self._tools = fresh
        self.version += 1

    def __repr__(self) -> str:
        return f"<ToolSet {self.name!r}: {len(self._tools)} tools, version {self.version}>"


@runtime_checkable
class ToolSource(Protocol):
    """Something `spawn(tools=[...])` takes besides `Tool` values: a server of tools the runtime
    starts in its own nursery (once per runtime, shared by the agents given it) and stops when
    it closes. `serve` reports its `ToolSet` through `task_status` once its tools are listed
    (raising before that fails the spawn), then runs until cancelled and never raises."""

    @property
    def name(self) -> str: ...  # read-only: a frozen class (such as `cmdc.mcp.MCPTools`) is one

    async def serve(self, *, task_status: trio.TaskStatus[ToolSet] = trio.TASK_STATUS_IGNORED) -> None: ...


def tool_from_schema(name: str, description: str, parameters: Mapping[str, Any], fn: ToolFn) -> Tool:
    """A `Tool` from a hand-written JSON schema (its arguments are passed to `fn` as keywords;
    a plain `def` runs in a worker thread)."""
    if not callable(fn) or inspect.isclass(fn):
        raise ConfigError(f"tool {name!r}: must be a function (async def, or def to run in a worker thread)")
    return Tool(name=name, description=description, parameters=parameters, fn=fn)

__all__ = [
    "Tool",
    "ToolSet",
    "ToolSource",
    "tool",
    "tool_from_schema",
]
