"""`State`: the immutable value an agent owns, with an O(1)-per-message token figure."""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from typing import Any

import attrs
import orjson

from ._check import integer
from ._frozen import freeze_mapping, thaw
from ._groups import EMPTY_INDEX, CallIndex
from .errors import ConfigError, InvalidMessage, InvalidState
from .message import Message, TokenUsage
from .tokens import estimate_message_tokens

_AGENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def validate_agent_id(agent_id: object) -> str:
    """Return `agent_id` if it is safe as a file name, else raise `ConfigError`.

    Allowed: `[A-Za-z0-9][A-Za-z0-9_.-]{0,127}` (no `/`, no NUL, no leading dot, at most 128).
    """
    if not isinstance(agent_id, str) or _AGENT_ID.fullmatch(agent_id) is None:
        raise ConfigError(
            f"agent id {agent_id!r} is not allowed: use 1-128 characters of letters, digits, "
            "'_', '.' or '-', starting with a letter or digit"
        )
    return agent_id


_CHECKED: OrderedDict[int, Mapping[str, Any]] = OrderedDict()
"""Configs this module froze and validated, by id (held, so an id is not reused), least
recently used first: a state made from another's config (`evolve`, a spawn, a checkpoint's
state) takes it as it is, neither copied nor checked again."""
_CHECKED_MAX = 4096

config_checks: list[Callable[[Mapping[str, Any]], object]] = []
"""What checks a state's config when it is made (`ConfigError` for an unknown key or a
malformed value): the layer that reads the config registers its check here (the compaction
package: `CompactConfig`), as this layer cannot import it."""


class ConfigSource:
    """A value that stands for `state.config` keys: `State(config=value)` holds
    `value.as_config()` (the compaction package's `CompactConfig` is one). A base class here,
    since this layer cannot import the layers that define them."""

    __slots__ = ()

    def as_config(self) -> Mapping[str, Any]:
        raise NotImplementedError


def config_keys(value: Mapping[str, Any] | ConfigSource | None) -> Mapping[str, Any] | None:
    """`value` as `state.config` keys: a `ConfigSource`'s `as_config()`, else `value` itself."""
    return value.as_config() if isinstance(value, ConfigSource) else value


def _convert_config(value: Mapping[str, Any] | ConfigSource | None) -> Mapping[str, Any]:
    value = config_keys(value)
    if value is not None and _CHECKED.get(id(value)) is value:
        _CHECKED.move_to_end(id(value))
        return value  # frozen and checked here before
    frozen = _frozen_config(value)
    if frozen:
        for check in config_checks:  # every key known, every value well-formed
            check(frozen)
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.popitem(last=False)
        _CHECKED[id(frozen)] = frozen
    return frozen


def _frozen_config(value: object) -> Mapping[str, Any]:
    try:
        frozen = freeze_mapping(value, "config")  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(str(exc)) from None
    except RecursionError:
        raise ConfigError("config is nested too deeply to be stored as JSON") from None
    if frozen:
        try:  # a config checkpoints cannot write (a lone surrogate, nesting past JSON's limit)
            orjson.dumps(thaw(frozen))
        except (orjson.JSONEncodeError, RecursionError):
            for key, item in frozen.items():
                try:
                    orjson.dumps({key: thaw(item)})
                except (orjson.JSONEncodeError, RecursionError) as exc:
                    raise ConfigError(f"config key {key!r} cannot be stored as JSON ({exc}): {item!r:.200}") from None
            raise ConfigError("config cannot be stored as JSON") from None
    return frozen


def _convert_messages(value: object) -> tuple[Message, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidMessage(f"messages must be a sequence of Message, got {type(value).__name__}")
    messages = tuple(value)
    for i, m in enumerate(messages):
        if not isinstance(m, Message):
            raise InvalidMessage(f"messages[{i}] is a {type(m).__name__}, not a Message")
    return messages


ENCODE_LATER = 1 << 20
"""Characters: a message with a longer text is not encoded when it enters a state, but by the
worker thread that first needs its JSON (a journal append, a checkpoint save): encoding
megabytes is one long call, which the trio thread, running every agent, must not make."""


ENCODE_EAGERLY: ContextVar[bool] = ContextVar("cmdc_state_encode_eagerly", default=True)
"""False (set around a `State(...)`): its messages are not encoded when it is made, only by
whatever first needs their JSON (`cmdc compact` journals a whole file once: its messages'
JSON is built a batch at a time while the journal is written, never all held at once)."""


APPEND_READERS: list[Callable[[Message], object]] = []
"""Called by `State.append` with each message it takes: what a higher layer reads of every
message is read as the message arrives, once, a few microseconds a turn, not all at once by
the compaction that evicts it (the compaction ledger's cues: `cmdc.compaction.ledger`
registers `read_cues` here when imported)."""


def _encode(m: Message) -> None:
    content = m.content
    if not (isinstance(content, str) and len(content) > ENCODE_LATER):
        m.json_crc()


@attrs.frozen(hash=False)
class State:
    """An agent's immutable state: its id, its messages (a tuple), its read-only config and its
    compaction count. Every change returns a new `State`.

    `config`: a mapping of keys (see `cmdc.compaction.config`), or a `CompactConfig`, held as
    its keys (`CompactConfig.as_config()`); either way `state.config` is a read-only mapping.

    `token_usage` is the current size of the context in tokens: the last reported
    `usage.total_tokens` (the baseline) plus the estimate of every message appended after it,
    or the estimate of every message when no usage has been reported. `append` keeps it up to
    date in O(1) per message. Usage reported on messages before `usage_floor` is stale (it
    predates a compaction) and is never taken as the baseline.
    """

    agent_id: str = attrs.field(converter=validate_agent_id)
    messages: tuple[Message, ...] = attrs.field(default=(), converter=_convert_messages)
    config: Mapping[str, Any] = attrs.field(default=None, converter=_convert_config)
    compactions: int = attrs.field(default=0)
    usage_floor: int = attrs.field(default=0)
    # the offload journal this state's summaries name (its id) and the last record they name
    journal_id: str | None = attrs.field(default=None)
    journal_seq: int = attrs.field(default=0)
    # derived, kept up to date by `append`
    _baseline_index: int = attrs.field(default=-1, init=False, eq=False, repr=False)
    _baseline_tokens: int = attrs.field(default=0, init=False, eq=False, repr=False)
    _tail_tokens: int = attrs.field(default=0, init=False, eq=False, repr=False)
    _calls: CallIndex = attrs.field(default=None, init=False, eq=False, repr=False)
    # shared by a state and the states grown from it by `append` only, new on any other change
    _lineage: object = attrs.field(default=None, init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        integer(self.compactions, "compactions", minimum=0, error=InvalidState)
        integer(self.usage_floor, "usage_floor", minimum=0, error=InvalidState)
        object.__setattr__(self, "_lineage", object())
        integer(self.journal_seq, "journal_seq", minimum=0, error=InvalidState)
        if self.journal_id is not None and (not isinstance(self.journal_id, str) or not self.journal_id):
            raise InvalidState(f"journal_id must be a non-empty string or None, got {self.journal_id!r}")
        if not self.messages:  # a new agent's state: nothing to count or index
            object.__setattr__(self, "_calls", EMPTY_INDEX)
            return
        index, base = -1, 0
        for i in range(len(self.messages) - 1, self.usage_floor - 1, -1):
            usage = self.messages[i].usage
            if usage is not None:
                index, base = i, usage.total_tokens
                break
        tail = sum(estimate_message_tokens(m) for m in self.messages[index + 1 :])
        eager = ENCODE_EAGERLY.get()
        for m in self.messages:
            if eager:
                _encode(m)  # encode (and checksum) once now, so offloads only copy bytes
            estimate_message_tokens(m)  # and estimate, so a compaction's clipping check is a lookup
        object.__setattr__(self, "_baseline_index", index)
        object.__setattr__(self, "_baseline_tokens", base)
        object.__setattr__(self, "_tail_tokens", tail)
        object.__setattr__(self, "_calls", CallIndex.scan(self.messages))

    def __hash__(self) -> int:
        return hash((self.agent_id, len(self.messages), self.compactions))

    @property
    def token_usage(self) -> int:
        """The context's size in tokens: reported baseline plus estimates since (O(1))."""
        return self._baseline_tokens + self._tail_tokens

    @property
    def baseline_index(self) -> int:
        """Index of the message whose reported usage is the baseline, or -1."""
        return self._baseline_index

    @property
    def call_index(self) -> CallIndex:
        """Open call groups and pinned messages, kept up to date by `append`."""
        return self._calls

    def grew_from(self, other: State) -> bool:
        """True when this state is `other` with messages appended (by `append`, in O(1))."""
        return self._lineage is other._lineage and len(self.messages) >= len(other.messages)

    @property
    def last_usage(self) -> TokenUsage | None:
        """The usage of the baseline message, if any."""
        if self._baseline_index < 0:
            return None
        return self.messages[self._baseline_index].usage

    def append(self, *messages: Message) -> State:
        """A new state with `messages` appended; O(1) token accounting per message."""
        index, base, tail = self._baseline_index, self._baseline_tokens, self._tail_tokens
        calls = self._calls
        start = len(self.messages)
        for offset, m in enumerate(messages):
            if not isinstance(m, Message):
                raise InvalidMessage(f"append takes Message values, got {type(m).__name__}")
            _encode(m)  # encode (and checksum) once now, O(1) per message: offloads copy bytes
            for read in APPEND_READERS:
                read(m)
            if m.tool_calls or m.tool_call_id is not None or m.metadata:
                calls = calls.add(start + offset, m)
            tokens = estimate_message_tokens(m)
            if m.usage is not None:
                index, base, tail = start + offset, m.usage.total_tokens, 0
            else:
                tail += tokens
        new = object.__new__(State)
        for name, value in (
            ("agent_id", self.agent_id),
            ("messages", self.messages + messages),
            ("config", self.config),
            ("compactions", self.compactions),
            ("usage_floor", self.usage_floor),
            ("journal_id", self.journal_id),
            ("journal_seq", self.journal_seq),
            ("_baseline_index", index),
            ("_baseline_tokens", base),
            ("_tail_tokens", tail),
            ("_calls", calls),
            ("_lineage", self._lineage),
        ):
            object.__setattr__(new, name, value)
        return new

    def insert_after_summary(self, *messages: Message) -> State:
        """A new state with `messages` right after the summary of the last compaction (after
        the leading system messages when there is no summary): the place for context added
        after a compaction (skills, a plan, notes), before the kept messages and the user's
        current question. `append` would put them after that question, and the model would
        answer them instead.

        System messages, tool results and assistant messages with tool calls are refused
        (`InvalidMessage`): they cannot stand there. The token figure is re-estimated until
        the next reply reports usage (a usage reported before did not count them)."""
        for m in messages:
            if not isinstance(m, Message):
                raise InvalidMessage(f"insert_after_summary takes Message values, got {type(m).__name__}")
            if m.role in ("system", "tool") or m.tool_calls:
                raise InvalidMessage(
                    f"insert_after_summary takes user or plain assistant messages, got a {m.role} message"
                    + (" with tool calls" if m.tool_calls else "")
                )
        at = 0
        while at < len(self.messages) and self.messages[at].role == "system":
            at += 1
        for i in range(at, len(self.messages)):  # the summary sits early: after pins, if any
            if self.messages[i].is_summary:
                at = i + 1
                break
        if not messages:
            return self
        new = (*self.messages[:at], *messages, *self.messages[at:])
        return self.evolve(messages=new, usage_floor=len(new))

    def evolve(self, **changes: Any) -> State:
        """A copy with some fields changed (the token figure is recomputed)."""
        return attrs.evolve(self, **changes)

    # -- serialization --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = {
            "version": 1,
            "agent_id": self.agent_id,
            "messages": [m.to_dict() for m in self.messages],
            "config": thaw(self.config),
            "compactions": self.compactions,
            "usage_floor": self.usage_floor,
        }
        if self.journal_id is not None:
            out["journal"] = {"id": self.journal_id, "seq": self.journal_seq}
        return out

    def to_json(self) -> bytes:
        """Compact JSON; each message's cached encoding is reused, not redone."""
        out = {
            "version": 1,
            "agent_id": self.agent_id,
            "messages": [orjson.Fragment(m.to_json()) for m in self.messages],
            "config": thaw(self.config),
            "compactions": self.compactions,
            "usage_floor": self.usage_floor,
        }
        if self.journal_id is not None:
            out["journal"] = {"id": self.journal_id, "seq": self.journal_seq}
        return orjson.dumps(out)

    def json_pieces(self) -> list[bytes]:
        """`to_json()` in pieces (joined, the same bytes): each message's cached encoding is one
        piece, so writing a state that holds a huge message copies nothing."""
        out = {
            "version": 1,
            "agent_id": self.agent_id,
            "messages": [],
            "config": thaw(self.config),
            "compactions": self.compactions,
            "usage_floor": self.usage_floor,
        }
        if self.journal_id is not None:
            out["journal"] = {"id": self.journal_id, "seq": self.journal_seq}
        empty = orjson.dumps(out)
        at = empty.index(b'"messages":[]') + len(b'"messages":[')
        pieces = [empty[:at]]
        for i, m in enumerate(self.messages):
            if i:
                pieces.append(b",")
            pieces.append(m.to_json())
        pieces.append(empty[at:])
        return pieces

    @classmethod
    def from_dict(cls, data: object) -> State:
        if not isinstance(data, Mapping):
            raise InvalidState(f"a state must be an object, got {type(data).__name__}")
        if data.get("version", 1) != 1:
            raise InvalidState(f"unknown state version {data.get('version')!r}")
        messages = data.get("messages", [])
        if not isinstance(messages, list):
            raise InvalidState("state 'messages' must be a list")
        journal = data.get("journal", {})
        if not isinstance(journal, Mapping) or set(journal) - {"id", "seq"}:
            raise InvalidState("state 'journal' must be an object with 'id' and 'seq'")
        return cls(
            journal_id=journal.get("id"),
            journal_seq=journal.get("seq", 0),
            agent_id=data.get("agent_id"),
            messages=tuple(Message.from_dict(m) for m in messages),
            config=data.get("config", {}),
            compactions=data.get("compactions", 0),
            usage_floor=data.get("usage_floor", 0),
        )

    @classmethod
    def from_json(cls, data: bytes | str) -> State:
        try:
            return cls.from_dict(orjson.loads(data))
        except orjson.JSONDecodeError as exc:
            raise InvalidState(f"state is not valid JSON: {exc}") from None

__all__ = [
    "ConfigSource",
    "State",
    "config_keys",
    "validate_agent_id",
]
