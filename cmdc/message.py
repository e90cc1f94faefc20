"""Messages: frozen values with a unique id, a role, content and (for assistants) tool calls."""

from __future__ import annotations

import itertools
import secrets
import zlib
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal

import attrs
import orjson

from ._check import flag, integer, validator
from ._frozen import freeze_mapping, thaw
from .errors import InvalidMessage

Role = Literal["system", "user", "assistant", "tool"]
ROLES: frozenset[str] = frozenset({"system", "user", "assistant", "tool"})

SUMMARY_KIND = "summary"
KIND_KEY = "cmdc.kind"
PINNED_KEY = "cmdc.pinned"

_PREFIX = secrets.token_hex(4)
_COUNTER = itertools.count(1)


def new_id() -> str:
    """A fresh message id, unique in this process and, with high probability, across processes."""
    return f"m{_PREFIX}{next(_COUNTER):x}"


_CHECK_SLICE = 256 * 1024  # characters encoded by one call: a huge text is many short calls


def _check_text(value: object, where: str) -> str:
    """`value`, if it is a string UTF-8 can hold (no lone surrogate). An ASCII string is known
    good at once; any other is encoded a slice at a time, so a huge text never holds the GIL
    (hence a trio thread waiting on a worker) for long."""
    if not isinstance(value, str):
        raise InvalidMessage(f"{where} must be a string, got {type(value).__name__}")
    if value.isascii():  # constant time: CPython keeps the flag
        return value
    for start in range(0, len(value), _CHECK_SLICE):
        try:
            value[start : start + _CHECK_SLICE].encode("utf-8")
        except UnicodeEncodeError as exc:
            at = start + exc.start
            raise InvalidMessage(f"{where} is not valid Unicode text ({exc.reason} at {at})") from None
    return value


@attrs.frozen
class TextPart:
    """A text part of a message's content."""

    text: str = attrs.field(validator=lambda _i, _a, v: _check_text(v, "TextPart.text"))


@attrs.frozen
class ImagePart:
    """An image part, by reference (a URL, a data URL or a path); counts as a fixed token cost."""

    source: str = attrs.field(validator=lambda _i, _a, v: _check_text(v, "ImagePart.source"))
    media_type: str | None = None


Part = TextPart | ImagePart
Content = str | tuple[Part, ...]


def _convert_content(value: object) -> Content:
    if isinstance(value, str):
        return _check_text(value, "message content")
    if isinstance(value, (list, tuple)):
        parts: list[Part] = []
        for i, p in enumerate(value):
            if isinstance(p, (TextPart, ImagePart)):
                parts.append(p)
            elif isinstance(p, str):
                parts.append(TextPart(p))
            else:
                raise InvalidMessage(f"message content part {i} is a {type(p).__name__}, not a part")
        return tuple(parts)
    raise InvalidMessage(f"message content must be text or a list of parts, got {type(value).__name__}")


MAX_DEPTH = 200
"""How deeply metadata and tool-call arguments may nest: JSON encoders (orjson: 255 levels)
must hold them inside a message, a journal line and a request body."""


def _freeze_json(value: object, where: str) -> Mapping[str, Any]:
    try:
        frozen = freeze_mapping(value, where)  # type: ignore[arg-type]
    except TypeError as exc:
        raise InvalidMessage(str(exc)) from None
    except RecursionError:
        raise InvalidMessage(f"{where} is nested more than {MAX_DEPTH} levels deep") from None
    stack: list[tuple[object, int]] = [(frozen, 1)]
    while stack:  # iterative: a deep value must not exhaust the stack here either
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Iterable[object] = item.values()
        elif isinstance(item, tuple):
            children = item
        else:
            continue
        if depth > MAX_DEPTH:
            raise InvalidMessage(f"{where} is nested more than {MAX_DEPTH} levels deep")
        stack.extend((child, depth + 1) for child in children)
    return frozen


def _convert_arguments(value: object) -> Mapping[str, Any]:
    return _freeze_json(value, "tool call arguments")


def _convert_metadata(value: object) -> Mapping[str, Any]:
    if type(value) is _Refrozen:  # built by `Message.evolve` from frozen values: not walked again
        return value.frozen
    return _freeze_json(value, "message metadata")


@attrs.frozen
class _Refrozen:
    """Metadata `Message.evolve` froze already: the values it kept from the message's own
    (deep-frozen) metadata as they are, only the new ones frozen and checked. Private: only
    `evolve` makes one, from values it checked itself."""

    frozen: Mapping[str, Any]


def _refrozen(old: Mapping[str, Any], new: object) -> Mapping[str, Any] | _Refrozen:
    """`new` metadata (replacing `old`, a message's own frozen metadata) for the converter: a
    plain dict whose values are mostly `old`'s own objects (`{**m.metadata, key: value}`, as a
    summary is tagged and rebuilt) is frozen value by value, reusing each value taken from
    `old` (deep-frozen and checked when `old` was made) and freezing only the others: a
    summary's large ledger is frozen once, not again at each rebuild. Anything else is
    returned as it is, for the converter to freeze whole."""
    if type(new) is not dict or not old or not all(type(k) is str for k in new):
        return new  # type: ignore[return-value]
    missing = _MISSING
    fresh = {k: v for k, v in new.items() if old.get(k, missing) is not v}
    if len(fresh) == len(new):
        return new
    made = _freeze_json(fresh, "message metadata") if fresh else {}
    return _Refrozen(MappingProxyType({k: made[k] if k in fresh else v for k, v in new.items()}))


_MISSING = object()


@attrs.frozen(hash=False)
class ToolCall:
    """One tool call requested by an assistant message."""

    id: str = attrs.field(validator=lambda _i, _a, v: _check_nonempty(v, "ToolCall.id"))
    name: str = attrs.field(validator=lambda _i, _a, v: _check_nonempty(v, "ToolCall.name"))
    arguments: Mapping[str, Any] = attrs.field(factory=dict, converter=_convert_arguments)

    def __hash__(self) -> int:
        return hash((self.id, self.name))

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": thaw(self.arguments)}

    @classmethod
    def from_dict(cls, data: object) -> ToolCall:
        if not isinstance(data, Mapping):
            raise InvalidMessage(f"a tool call must be an object, got {type(data).__name__}")
        return cls(id=data.get("id"), name=data.get("name"), arguments=data.get("arguments") or {})  # type: ignore[arg-type]


def _check_nonempty(value: object, where: str) -> str:
    _check_text(value, where)
    if not value:
        raise InvalidMessage(f"{where} must not be empty")
    return value  # type: ignore[return-value]


_nonneg_int = validator(integer, "TokenUsage.{}", minimum=0, error=InvalidMessage)


def _total(usage: TokenUsage) -> int:
    return usage.input_tokens + usage.output_tokens


@attrs.frozen
class TokenUsage:
    """Token figures a provider reported for one request.

    `total_tokens` defaults to input + output. `cache_read_tokens` and `cache_creation_tokens`
    are the provider's cache figures where it reports them (informational).
    """

    input_tokens: int = attrs.field(default=0, validator=_nonneg_int)
    output_tokens: int = attrs.field(default=0, validator=_nonneg_int)
    # a default given as `default=` (not `@total_tokens.default`): pyright reads the field as optional
    total_tokens: int = attrs.field(default=attrs.Factory(_total, takes_self=True), validator=_nonneg_int)
    cache_read_tokens: int = attrs.field(default=0, validator=_nonneg_int)
    cache_creation_tokens: int = attrs.field(default=0, validator=_nonneg_int)

    def to_dict(self) -> dict[str, int]:
        d = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens, "total_tokens": self.total_tokens}
        if self.cache_read_tokens:
            d["cache_read_tokens"] = self.cache_read_tokens
        if self.cache_creation_tokens:
            d["cache_creation_tokens"] = self.cache_creation_tokens
        return d

    @classmethod
    def from_dict(cls, data: object) -> TokenUsage:
        if not isinstance(data, Mapping):
            raise InvalidMessage(f"usage must be an object, got {type(data).__name__}")
        known = {f.name for f in attrs.fields(cls)}
        extra = set(data) - known
        if extra:
            raise InvalidMessage(f"usage has unknown fields {sorted(extra)}")
        return cls(**data)


def _convert_calls(value: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise InvalidMessage(f"tool_calls must be a sequence of ToolCall, got {type(value).__name__}")
    return tuple(value)


def _role_validator(_inst: object, _a: object, value: object) -> None:
    if value not in ROLES:
        raise InvalidMessage(f"message role must be one of {sorted(ROLES)}, got {value!r}")


@attrs.frozen(hash=False)
class Message:
    """One message of a conversation. Build it with `Message.system`, `.user`, `.assistant` or
    `.tool_result`; every message gets a unique `id` at construction."""

    role: Role = attrs.field(validator=_role_validator)
    content: Content = attrs.field(default="", converter=_convert_content)
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_convert_calls)
    tool_call_id: str | None = None
    is_error: bool = False
    usage: TokenUsage | None = None
    metadata: Mapping[str, Any] = attrs.field(factory=dict, converter=_convert_metadata)
    id: str = attrs.field(factory=new_id)
    # Caches, not part of the value: the default token estimate (see cmdc.tokens) and the JSON.
    _tokens: int | None = attrs.field(default=None, init=False, eq=False, repr=False)
    _json: bytes | None = attrs.field(default=None, init=False, eq=False, repr=False)
    _json_crc: int | None = attrs.field(default=None, init=False, eq=False, repr=False)
    # What the compaction ledger reads of this message (`cmdc.compaction.ledger.cues`), read once.
    _cues: object = attrs.field(default=None, init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        _check_nonempty(self.id, "message id")
        for call in self.tool_calls:
            if not isinstance(call, ToolCall):
                raise InvalidMessage(f"tool_calls must hold ToolCall values, got {type(call).__name__}")
        if self.tool_calls and self.role != "assistant":
            raise InvalidMessage(f"only assistant messages carry tool calls, not {self.role!r}")
        if len({c.id for c in self.tool_calls}) != len(self.tool_calls):
            raise InvalidMessage("tool call ids within one message must be unique")
        if self.role == "tool":
            _check_nonempty(self.tool_call_id, "tool result's tool_call_id")
        elif self.tool_call_id is not None:
            raise InvalidMessage(f"only tool results carry a tool_call_id, not {self.role!r}")
        flag(self.is_error, "is_error", error=InvalidMessage)
        if self.usage is not None and not isinstance(self.usage, TokenUsage):
            raise InvalidMessage(f"usage must be a TokenUsage, got {type(self.usage).__name__}")
        if self.metadata or self.tool_calls:
            # Encoded (and cached) now: a string JSON cannot hold (a lone surrogate) or nesting
            # deeper than it allows is refused here, not later by a store mid-write.
            self.to_json()

    def __hash__(self) -> int:
        return hash(self.id)

    # -- constructors -------------------------------------------------------------------
    @classmethod
    def system(cls, text: Content, *, metadata: Mapping[str, Any] | None = None) -> Message:
        return cls("system", text, metadata=metadata or {})

    @classmethod
    def user(cls, content: Content | Sequence[Part], *, metadata: Mapping[str, Any] | None = None) -> Message:
        return cls("user", content, metadata=metadata or {})

    @classmethod
    def assistant(
        cls,
        text: Content = "",
        *,
        tool_calls: Iterable[ToolCall] = (),
        usage: TokenUsage | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Message:
        return cls("assistant", text, tool_calls=tuple(tool_calls), usage=usage, metadata=metadata or {})

    @classmethod
    def tool_result(
        cls,
        call_id: str,
        content: Content,
        *,
        is_error: bool = False,
        metadata: Mapping[str, Any] | None = None,
    ) -> Message:
        return cls("tool", content, tool_call_id=call_id, is_error=is_error, metadata=metadata or {})

    # -- views ----------------------------------------------------------------------------
    @property
    def text(self) -> str:
        """The content as plain text (image parts are shown as a marker)."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text if isinstance(p, TextPart) else f"[image: {p.source}]" for p in self.content)

    @property
    def is_summary(self) -> bool:
        return self.metadata.get(KIND_KEY) == SUMMARY_KIND

    @property
    def is_pinned(self) -> bool:
        return self.metadata.get(PINNED_KEY) is True

    def evolve(self, **changes: Any) -> Message:
        """A copy with some fields changed (the id is kept unless given). New metadata that
        keeps some of this message's values is not frozen again for those (see `_refrozen`)."""
        if "metadata" in changes:
            changes["metadata"] = _refrozen(self.metadata, changes["metadata"])
        return attrs.evolve(self, **changes)

    # -- serialization --------------------------------------------------------------------
    def _plain(self) -> dict[str, Any]:
        """The JSON form, with read-only mappings left in place for orjson's `default`."""
        content = self.content
        d: dict[str, Any] = {
            "id": self.id,
            "role": self.role,
            "content": content if isinstance(content, str) else [_part_to_dict(p) for p in content],
        }
        if self.tool_calls:
            d["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        if self.is_error:
            d["is_error"] = True
        if self.usage is not None:
            d["usage"] = self.usage.to_dict()
        if self.metadata:
            d["metadata"] = self.metadata
        return d

    def to_dict(self) -> dict[str, Any]:
        """A plain dict (JSON types only) that `from_dict` turns back into an equal message."""
        plain: dict[str, Any] = thaw(self._plain())
        return plain

    @classmethod
    def from_dict(cls, data: object) -> Message:
        """Rebuild a message from `to_dict` output; anything malformed raises `InvalidMessage`."""
        if not isinstance(data, Mapping):
            raise InvalidMessage(f"a message must be an object, got {type(data).__name__}")
        known = {"id", "role", "content", "tool_calls", "tool_call_id", "is_error", "usage", "metadata"}
        extra = set(data) - known
        if extra:
            raise InvalidMessage(f"message has unknown fields {sorted(extra)}")
        if "id" not in data or "role" not in data:
            raise InvalidMessage("message needs an 'id' and a 'role'")
        content = data.get("content", "")
        if isinstance(content, list):
            content = tuple(_part_from_dict(p, i) for i, p in enumerate(content))
        calls = data.get("tool_calls", ())
        if not isinstance(calls, (list, tuple)):
            raise InvalidMessage("tool_calls must be a list")
        usage = data.get("usage")
        metadata = data.get("metadata", {})
        if not isinstance(metadata, Mapping):
            raise InvalidMessage("metadata must be an object")
        try:
            return cls(
                role=data["role"],
                content=content,
                tool_calls=tuple(ToolCall.from_dict(c) for c in calls),
                tool_call_id=data.get("tool_call_id"),
                is_error=data.get("is_error", False),
                usage=None if usage is None else TokenUsage.from_dict(usage),
                metadata=metadata,
                id=data["id"],
            )
        except TypeError as exc:
            raise InvalidMessage(f"malformed message: {exc}") from None

    def to_json(self) -> bytes:
        """The message as compact JSON bytes, encoded once and cached (messages are immutable).
        A huge text is escaped a slice at a time (the same bytes: JSON escapes each character
        on its own), so no single call encodes megabytes."""
        data = self._json
        if data is None:
            data = self._encoded()
            object.__setattr__(self, "_json", data)
        return data

    def encode_json(self) -> bytes:
        """`to_json()`'s bytes without keeping them: the cached encoding when there is one, else
        encoded now and not cached (a journal writer lets a batch's JSON go once written)."""
        data = self._json
        return data if data is not None else self._encoded()

    def _encoded(self) -> bytes:
        """`to_json()`'s bytes, encoded now and not cached (for a look that keeps nothing)."""
        try:
            content = self.content
            if isinstance(content, str) and len(content) > 4 * _CHECK_SLICE:
                return self._json_in_slices(content)
            # copied to a bytes object of its own size: orjson's result keeps the
            # buffer it wrote into, 4 KB and up to about 10x the JSON, and this one is kept
            return bytes(memoryview(orjson.dumps(self._plain(), default=encode_default)))
        except orjson.JSONEncodeError as exc:
            raise InvalidMessage(f"message {self.id} cannot be stored as JSON: {exc}") from None

    def _with_id(self, new_id: str) -> Message:
        """This message under another id, without checking it again (its fields were checked
        when it was made); the JSON is encoded again when asked for (it holds the id)."""
        new = object.__new__(Message)
        for name in _FIELDS:
            object.__setattr__(new, name, getattr(self, name))
        _check_nonempty(new_id, "message id")
        object.__setattr__(new, "id", new_id)
        object.__setattr__(new, "_tokens", self._tokens)
        object.__setattr__(new, "_json", None)
        object.__setattr__(new, "_json_crc", None)
        object.__setattr__(new, "_cues", self._cues)  # (read from the fields, not the id)
        return new

    def _json_in_slices(self, content: str) -> bytes:
        plain = self._plain()
        plain["content"] = ""
        empty = orjson.dumps(plain, default=encode_default)
        head = b'{"id":%s,"role":%s,"content":"' % (orjson.dumps(self.id), orjson.dumps(self.role))
        assert empty.startswith(head + b'"')  # the order _plain writes
        parts = [head]
        for start in range(0, len(content), _CHECK_SLICE):
            parts.append(orjson.dumps(content[start : start + _CHECK_SLICE])[1:-1])
        parts.append(empty[len(head) :])
        return b"".join(parts)

    def json_crc(self) -> int:
        """CRC-32 of `to_json()`, computed once (the offload journal's line checksum uses it)."""
        crc = self._json_crc
        if crc is None:
            crc = zlib.crc32(self.to_json())
            object.__setattr__(self, "_json_crc", crc)
        return crc

    @classmethod
    def from_json(cls, data: bytes | str) -> Message:
        try:
            return cls.from_dict(orjson.loads(data))
        except orjson.JSONDecodeError as exc:
            raise InvalidMessage(f"message is not valid JSON: {exc}") from None


def _part_to_dict(p: Part) -> dict[str, Any]:
    if isinstance(p, TextPart):
        return {"type": "text", "text": p.text}
    return {"type": "image", "source": p.source, "media_type": p.media_type}


_FIELDS = ("role", "content", "tool_calls", "tool_call_id", "is_error", "usage", "metadata")
"""Every field of `Message` but its id (`_with_id` copies them)."""


def encode_default(value: object) -> object:
    """orjson's `default=` for message data: a frozen mapping encodes as a dict."""
    if isinstance(value, MappingProxyType):
        return dict(value)
    raise TypeError(f"cannot encode {type(value).__name__}")


def _part_from_dict(p: object, i: int) -> Part:
    if not isinstance(p, Mapping):
        raise InvalidMessage(f"content part {i} must be an object")
    kind = p.get("type")
    if kind == "text":
        return TextPart(p.get("text"))  # type: ignore[arg-type]
    if kind == "image":
        mt = p.get("media_type")
        if mt is not None and not isinstance(mt, str):
            raise InvalidMessage(f"content part {i}: media_type must be a string")
        return ImagePart(p.get("source"), mt)  # type: ignore[arg-type]
    raise InvalidMessage(f"content part {i} has unknown type {kind!r}")


__all__ = [
    "ImagePart",
    "Message",
    "Part",
    "Role",
    "TextPart",
    "TokenUsage",
    "ToolCall",
]
