"""Plausible tool-call arguments for `SimulatedModel`, from a tool's JSON schema and the
conversation so far.

Every parameter can be filled: required ones always, optional ones about half the time (always
when the schema names its choices with an `enum`, as the built-in `delegate` tool does for the
agents it may reach); enums, `const`, `anyOf`/`oneOf`, type lists, numeric ranges
(`minimum`/`maximum`, exclusive bounds, `multipleOf`), string lengths and formats, array sizes
and nested objects are honoured. Strings come from the conversation: a file path mentioned in
it for a parameter about paths or files, the latest user request's words otherwise.

cmdc's own `recall` tool takes either words or a record range, not both (a rule its schema
cannot say): for it, a range named by a summary in the context is read back, or the latest
request's words are searched.
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from .._check import is_int, is_number
from .._frozen import thaw
from ..message import Message
from .base import ToolSchema

_WORDS = (
    "the", "module", "parser", "config", "test", "change", "result", "cache", "schema", "request",
    "handler", "error", "file", "function", "update", "check", "value", "path", "state", "next",
)  # fmt: skip
_PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.[A-Za-z][A-Za-z0-9]{0,4})(?![\w/])")
_RANGE = re.compile(r"records (\d+)\s*[-\N{EN DASH}]\s*(\d+)")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]{2,}")
_MAX_DEPTH = 6


class Context:
    """What the arguments draw on: the latest user request's words, the file paths mentioned
    (the latest request's first, then other user messages', newest first, then those in tool
    results), and the journal ranges summaries name."""

    def __init__(self, messages: Sequence[Message]) -> None:
        users = [m for m in messages if m.role == "user" and not m.is_summary]
        self.request = users[-1].text if users else ""
        self.words = _WORD.findall(self.request) or list(_WORDS[:3])
        self.paths: list[str] = []  # the user's first (newest first), then those tools showed
        self.ranges: list[tuple[int, int]] = []
        seen: list[str] = []
        for m in reversed(messages):
            text = m.text
            if m.is_summary:
                self.ranges += [(int(a), int(b)) for a, b in _RANGE.findall(text) if 1 <= int(a) <= int(b)]
            elif m.role in ("user", "tool"):
                found = [p for p in _PATH.findall(text[:4_000]) if not p[0].isdigit()]
                (self.paths if m.role == "user" else seen).extend(found)
        latest = [p for p in _PATH.findall(self.request[:4_000]) if not p[0].isdigit()]
        self.paths = list(dict.fromkeys([*latest, *self.paths, *seen]))

    def phrase(self, rng: random.Random, low: int = 2, high: int = 6) -> str:
        n = min(len(self.words), rng.randint(low, high))
        start = rng.randint(0, len(self.words) - n)
        return " ".join(self.words[start : start + n])


def arguments_for(tool: ToolSchema, messages: Sequence[Message], rng: random.Random) -> dict[str, Any]:
    """Arguments a plausible model would pass to `tool` at this point of the conversation."""
    context = Context(messages)
    properties = tool.parameters.get("properties")
    if tool.name == "recall" and isinstance(properties, Mapping) and {"query", "first", "last"} <= set(properties):
        return _recall(context, rng)
    value = example_value(tool.parameters, rng, context=context)
    return value if isinstance(value, dict) else {}


def _recall(context: Context, rng: random.Random) -> dict[str, Any]:
    if context.ranges and rng.random() < 0.5:
        first, last = rng.choice(context.ranges)
        start = rng.randint(first, last)
        return {"first": start, "last": min(last, start + 4)}
    return {"query": context.phrase(rng, 1, 3)}


def example_value(
    schema: object, rng: random.Random, *, name: str = "", context: Context | None = None, depth: int = 0
) -> Any:
    """A value that fits `schema` (see the module docstring); `name` is the parameter's name."""
    context = context or Context(())
    if not isinstance(schema, Mapping):
        return _string({}, rng, name, context)
    if "const" in schema:
        return thaw(schema["const"])
    enum = schema.get("enum")
    if isinstance(enum, (list, tuple)) and enum:
        choices = [v for v in enum if v is not None] or list(enum)
        return thaw(rng.choice(choices))
    if "default" in schema and rng.random() < 0.25:
        return thaw(schema["default"])
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, (list, tuple)) and options:
            usable = [o for o in options if not (isinstance(o, Mapping) and o.get("type") == "null")] or list(options)
            return example_value(rng.choice(usable), rng, name=name, context=context, depth=depth)
    kind = schema.get("type")
    if isinstance(kind, (list, tuple)):
        kinds = [k for k in kind if k != "null"]
        kind = rng.choice(kinds) if kinds else "null"
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "integer":
        return _integer(schema, rng)
    if kind == "number":
        return _number(schema, rng)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        return _array(schema, rng, name, context, depth)
    if kind == "object":
        return _object(schema, rng, context, depth)
    return _string(schema, rng, name, context)


def _bounds(schema: Mapping[str, Any], step: float) -> tuple[float | None, float | None]:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    xlo, xhi = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if is_number(xlo):
        lo = xlo + step if lo is None else max(lo, xlo + step)
    if is_number(xhi):
        hi = xhi - step if hi is None else min(hi, xhi - step)
    return lo, hi


def _integer(schema: Mapping[str, Any], rng: random.Random) -> int:
    lo, hi = _bounds(schema, 1)
    low = int(-(-lo // 1)) if lo is not None else (1 if hi is None or hi >= 1 else int(hi // 1) - 9)
    high = int(hi // 1) if hi is not None else low + 9
    value = rng.randint(low, max(low, high))
    step = schema.get("multipleOf")
    if is_int(step) and step > 0:
        value = -(-value // step) * step
        if hi is not None and value > hi:
            value -= step
    return value


def _number(schema: Mapping[str, Any], rng: random.Random) -> float:
    lo, hi = _bounds(schema, 0.01)
    low = float(lo) if lo is not None else (0.0 if hi is None or hi >= 0 else float(hi) - 10)
    high = float(hi) if hi is not None else low + 10
    return round(rng.uniform(low, max(low, high)), 2) if high - low >= 0.02 else low


def _string(schema: Mapping[str, Any], rng: random.Random, name: str, context: Context) -> str:
    fmt = schema.get("format")
    text: str
    if fmt == "date":
        text = f"2026-{rng.randint(1, 12):02}-{rng.randint(1, 28):02}"
    elif fmt == "date-time":
        text = f"2026-{rng.randint(1, 12):02}-{rng.randint(1, 28):02}T{rng.randint(0, 23):02}:00:00Z"
    elif fmt == "email":
        text = f"{rng.choice(context.words).lower()}@example.com"
    elif fmt == "uuid":
        text = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    elif fmt in ("uri", "url") or _about(name, schema, ("url", "uri", "link")):
        text = f"https://example.com/{rng.choice(context.words).lower()}"
    elif _about(name, schema, ("path", "file", "filename", "module")):
        text = context.paths[0] if context.paths else f"src/{rng.choice(context.words).lower()}.py"
    else:
        text = context.phrase(rng)
    low, high = schema.get("minLength"), schema.get("maxLength")
    if is_int(low):
        while len(text) < low:
            text += " " + rng.choice(_WORDS)
    if is_int(high) and len(text) > high:
        text = text[:high].rstrip() or text[:high]
    return text


def _about(name: str, schema: Mapping[str, Any], topics: tuple[str, ...]) -> bool:
    words = set(re.findall(r"[a-z]+", name.lower()))
    if words & set(topics):
        return True
    description = schema.get("description")
    first = description.split(".")[0].lower() if isinstance(description, str) else ""
    return any(re.search(rf"\b{t}\b", first) for t in topics)


def _array(schema: Mapping[str, Any], rng: random.Random, name: str, context: Context, depth: int) -> list[Any]:
    if depth >= _MAX_DEPTH:
        return []
    given_low, given_high = schema.get("minItems"), schema.get("maxItems")
    low = given_low if isinstance(given_low, int) and given_low >= 0 else 1
    high = given_high if isinstance(given_high, int) and given_high >= 0 else max(low, 2)
    if isinstance(given_high, int) and not isinstance(given_low, int):
        low = min(low, high)
    n = rng.randint(low, max(low, high))
    items = schema.get("items")
    out: list[Any] = []
    for _ in range(n * 3):  # a few tries for unique items
        if len(out) == n:
            break
        value = example_value(items, rng, name=name, context=context, depth=depth + 1)
        if schema.get("uniqueItems") and value in out:
            continue
        out.append(value)
    return out


def _object(schema: Mapping[str, Any], rng: random.Random, context: Context, depth: int) -> dict[str, Any]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required = schema.get("required")
    required = set(required) if isinstance(required, (list, tuple)) else set()
    out: dict[str, Any] = {}
    for key, sub in properties.items():
        chosen = key in required or rng.random() < 0.5 or _names_choices(sub)
        if chosen and (key in required or depth < _MAX_DEPTH):
            out[key] = example_value(sub, rng, name=key, context=context, depth=depth + 1)
    return out


def _names_choices(schema: object) -> bool:
    """Whether an optional parameter lists real choices (an enum with a non-null value)."""
    if not isinstance(schema, Mapping):
        return False
    enum = schema.get("enum")
    return isinstance(enum, (list, tuple)) and any(v is not None for v in enum)
