"""`CompactConfig`: the compaction settings of `state.config`, strictly validated. Two forms,
one source: the keys (`{"compact_keep": ("messages", 4)}`), read by `CompactConfig.from_mapping`,
or a `CompactConfig` value given as the config (`State(config=CompactConfig(...))`), which a
state holds as its keys (`as_config`). Either way a malformed value raises `ConfigError` naming
its key and the value."""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from .._check import integer, is_int, optional_integer
from ..errors import ConfigError
from ..state import ConfigSource, config_checks

DEFAULT_TRIGGER: tuple[str, int] = ("tokens", 170_000)
DEFAULT_KEEP: tuple[str, int] = ("messages", 6)
DEFAULT_OFFLOAD_DIR = ".cmdc/conversation_history"

DEFAULT_SUMMARY_PROMPT = """\
You are compacting an agent's conversation history. The messages below are being removed from
its context; your summary replaces them. The agent will continue working from your summary alone,
so keep everything it needs and nothing else. Write these sections, in this order, as Markdown:

## Primary request and intent
What the user asked for, in their words where it matters, including every explicit requirement.
## Key concepts
Technical concepts, constraints and decisions that shape the work.
## Files and code
Files, paths, identifiers and code that were read, written or discussed, and why they matter.
## Errors and fixes
Errors met and how they were resolved, including what the user said about them.
## All user messages
Every user message, in order (they show the user's changing intent).
## Pending tasks
Tasks asked for and not yet done.
## Current work
What was being worked on right before this summary, precisely.
## Next step
The next step, directly in line with the user's latest request.

If an earlier summary appears first, fold it in: nothing it says may be lost unless it is obsolete.
"""

DEFAULT_WINDOW_FRACTION = 0.85
"""Without a `compact_trigger`, the trigger is this fraction of the context window when one is
known (configured, or reported by the provider), else `DEFAULT_TRIGGER`."""

COMPACT_KEYS = frozenset(
    {
        "compact_trigger",
        "compact_keep",
        "compact_offload_dir",
        "compact_summary_prompt",
        "context_window",
        "compact_thrash",
        "compact_min_gain",
    }
)
TIER_KEYS = frozenset(
    {
        "tool_result_limit",
        "tool_result_limits",
        "tool_result_preview",
        "mask_tool_results",
        "mask_trigger",
        "mask_keep",
        "mask_at_least",
        "mask_exclude",
    }
)
"""The cheap tiers' keys (see `TierConfig`); with `COMPACT_KEYS`, every key of these families."""

DEFAULT_TOOL_RESULT_LIMIT = 8_000
"""Tokens: a tool result past this is capped at arrival (about 6% of a 128k window)."""
DEFAULT_PREVIEW = 1_000
DEFAULT_MASK_TRIGGER = 0.3
DEFAULT_MASK_KEEP = 3
DEFAULT_MIN_GAIN = 4_000
DEFAULT_THRASH: tuple[int, int] = (3, 3)

KNOWN_KEYS = COMPACT_KEYS | TIER_KEYS
"""Every key cmdc reads from `state.config`."""

USER_KEY_PREFIX = "x-"


def is_user_key(key: str) -> bool:
    """Whether `key` is namespaced for the application's own data (`x-...`, or `app.name` with a
    dot), which cmdc keeps and never reads."""
    return key.startswith(USER_KEY_PREFIX) or "." in key


def check_keys(config: Mapping[str, Any]) -> None:
    """Refuse a key cmdc does not know (`ConfigError` naming the closest known key) unless it
    is namespaced for user data (`is_user_key`)."""
    for key in config:
        if key in KNOWN_KEYS or is_user_key(key):
            continue
        close = difflib.get_close_matches(key, sorted(KNOWN_KEYS), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"unknown config key {key!r}{hint}; known keys: {', '.join(sorted(KNOWN_KEYS))}. "
            f"Keys for your own data start with {USER_KEY_PREFIX!r} or hold a '.' (e.g. 'myapp.user')"
        )


@attrs.frozen
class Threshold:
    """One trigger or keep rule: a mode and its value."""

    mode: str
    value: int | float

    def tokens(self, context_window: int | None) -> int:
        """The rule as a token figure (fractions of the context window, rounded down, >= 1)."""
        if self.mode == "fraction":
            assert context_window is not None
            return max(1, math.floor(self.value * context_window))
        return int(self.value)


TRIGGER_MODES = ("tokens", "fraction", "messages")
KEEP_MODES = ("messages", "fraction", "tokens")

ThresholdLike = Threshold | tuple[str, int | float]
"""A rule as a `Threshold` or as its pair `(mode, value)`, as `state.config` writes it."""


def _default_triggers(window: int | None) -> tuple[Threshold, ...]:
    if window is not None:
        return (Threshold("fraction", DEFAULT_WINDOW_FRACTION),)
    return (Threshold(*DEFAULT_TRIGGER),)


def _pair_of(rule: object) -> object:
    return (rule.mode, rule.value) if isinstance(rule, Threshold) else rule


def _trigger_rules(value: ThresholdLike | Sequence[ThresholdLike]) -> tuple[Threshold, ...]:
    if isinstance(value, Threshold) or (isinstance(value, (list, tuple)) and value and isinstance(value[0], str)):
        value = (value,)  # type: ignore[assignment]  # one rule
    return _triggers([_pair_of(v) for v in value] if isinstance(value, (list, tuple)) else value, None, False)


def _keep_rule(value: ThresholdLike) -> Threshold:
    return _rule("compact_keep", _pair_of(value), KEEP_MODES, None, False)


def _window(value: int | None) -> int | None:
    return _context_window(value)


def _directory(value: str | os.PathLike[str]) -> Path:
    return _offload_dir(value)


def _prompt_text(value: str) -> str:
    return _prompt(value)


def _window_first(self: CompactConfig) -> tuple[Threshold, ...]:
    return _default_triggers(self.context_window)


def _tiers(value: TierConfig) -> TierConfig:
    if not isinstance(value, TierConfig):
        raise ConfigError(f"tiers must be a TierConfig, got {value!r:.80}")
    return value


@attrs.frozen(kw_only=True)
class CompactConfig(ConfigSource):
    """Compaction settings: read from a state's config with `CompactConfig.from_mapping`, or
    built and given as the config itself (`State(config=CompactConfig(...))`, which holds
    `as_config()`, its keys). Every field is checked when built (`ConfigError` naming its
    `state.config` key and the value); a rule is a `Threshold` or a pair `("messages", 6)`.

    `triggers` (`compact_trigger`; one rule or several, any one fires) defaults as in
    `state.config`: 0.85 of `context_window` when one is given, else 170,000 tokens.
    """

    context_window: int | None = attrs.field(default=None, converter=_window)
    triggers: tuple[Threshold, ...] = attrs.field(
        default=attrs.Factory(_window_first, takes_self=True), converter=_trigger_rules
    )
    keep: Threshold = attrs.field(default=Threshold(*DEFAULT_KEEP), converter=_keep_rule)
    offload_dir: Path = attrs.field(default=Path(DEFAULT_OFFLOAD_DIR), converter=_directory)
    summary_prompt: str = attrs.field(default=DEFAULT_SUMMARY_PROMPT, converter=_prompt_text, repr=False)
    tiers: TierConfig = attrs.field(factory=lambda: TierConfig(), converter=_tiers)

    @property
    def token_trigger(self) -> int | None:
        """The smallest token threshold among the triggers (fractions resolved), or None."""
        figures = [t.tokens(self.context_window) for t in self.triggers if t.mode != "messages"]
        return min(figures) if figures else None

    @property
    def message_trigger(self) -> int | None:
        figures = [int(t.value) for t in self.triggers if t.mode == "messages"]
        return min(figures) if figures else None

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any], *, need_window: bool = True) -> CompactConfig:
        """Read and validate the config; an unknown key (see `check_keys`) or anything
        malformed raises `ConfigError`. `need_window=False` accepts a `fraction` rule without a
        `context_window` (a `State` is checked so: the runtime fills the window in from the
        provider at spawn; a compactor needs it)."""
        check_keys(config)
        window = _context_window(config.get("context_window"))
        if "compact_trigger" in config:
            triggers = _triggers(config["compact_trigger"], window, need_window)
        else:
            triggers = _default_triggers(window)
        keep = _rule("compact_keep", config.get("compact_keep", DEFAULT_KEEP), KEEP_MODES, window, need_window)
        return cls(
            triggers=triggers,
            keep=keep,
            offload_dir=config.get("compact_offload_dir", DEFAULT_OFFLOAD_DIR),
            summary_prompt=config.get("compact_summary_prompt", DEFAULT_SUMMARY_PROMPT),
            context_window=window,
            tiers=TierConfig.from_mapping(config),
        )

    def as_config(self) -> dict[str, Any]:
        """The `state.config` keys that give these settings back through `from_mapping`: only
        what differs from the defaults (a default trigger is left for the window to set, as
        in a config that names none)."""
        out: dict[str, Any] = {}
        if self.context_window is not None:
            out["context_window"] = self.context_window
        if self.triggers != _default_triggers(self.context_window):
            pairs = [(t.mode, t.value) for t in self.triggers]
            out["compact_trigger"] = pairs[0] if len(pairs) == 1 else pairs
        if self.keep != Threshold(*DEFAULT_KEEP):
            out["compact_keep"] = (self.keep.mode, self.keep.value)
        if self.offload_dir != Path(DEFAULT_OFFLOAD_DIR):
            out["compact_offload_dir"] = str(self.offload_dir)
        if self.summary_prompt != DEFAULT_SUMMARY_PROMPT:
            out["compact_summary_prompt"] = self.summary_prompt
        out.update(self.tiers.as_config())
        return out


def _context_window(value: object) -> int | None:
    if value is None:
        return None
    return integer(value, "config key 'context_window'")


def _triggers(value: object, window: int | None, need_window: bool) -> tuple[Threshold, ...]:
    modes = TRIGGER_MODES
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (list, tuple)) for v in value):
        return tuple(_rule("compact_trigger", v, modes, window, need_window) for v in value)
    if isinstance(value, (list, tuple)) and not value:
        raise ConfigError("config key 'compact_trigger' must not be an empty list")
    return (_rule("compact_trigger", value, modes, window, need_window),)


def _rule(key: str, value: object, modes: tuple[str, ...], window: int | None, need_window: bool) -> Threshold:
    shape = f"a pair (mode, value) with mode one of {list(modes)}"
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ConfigError(f"config key {key!r} must be {shape}, got {value!r}")
    mode, number = value
    if mode not in modes:
        raise ConfigError(f"config key {key!r}: unknown mode {mode!r} in {value!r}; expected one of {list(modes)}")
    if mode == "fraction":
        if not isinstance(number, float) or not 0.0 < number <= 1.0:  # a float: 1 is a count
            raise ConfigError(f"config key {key!r}: a fraction must be a float in (0, 1], got {number!r}")
        if window is None and need_window:
            raise ConfigError(f"config key {key!r}: {value!r} needs 'context_window' to be set")
    elif not is_int(number) or number < 1:
        raise ConfigError(f"config key {key!r}: a {mode} count must be an integer >= 1, got {number!r}")
    return Threshold(mode, number)


def _offload_dir(value: object) -> Path:
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"config key 'compact_offload_dir' must be a path, got {value!r:.80}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text or "\x00" in text:
        raise ConfigError(f"config key 'compact_offload_dir' must be a non-empty path without NUL, got {value!r}")
    return Path(text)


def _prompt(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"config key 'compact_summary_prompt' must be a non-empty string, got {value!r}")
    return value


def _check_state_config(config: Mapping[str, Any]) -> None:
    """`State`'s check of a config when it is made: a `fraction` may wait for its window (a
    runtime fills it in from the provider at spawn)."""
    CompactConfig.from_mapping(config, need_window=False)
    TierConfig.from_mapping(config)


config_checks.append(_check_state_config)


# -- the cheap tiers: caps at arrival, masking, the thrash guard ---------------------------------


def _key(name: str) -> str:
    return f"config key {name!r}"


def _optional_limit(value: object, name: str) -> int | None:
    return optional_integer(value, _key(name))


def _limits(value: Mapping[str, int | None] | Iterable[tuple[str, int | None]]) -> tuple[tuple[str, int | None], ...]:
    name = "tool_result_limits"
    if isinstance(value, tuple) and all(isinstance(p, tuple) and len(p) == 2 for p in value):
        value = dict(value)  # the form this makes (sorted pairs), as `attrs.evolve` passes it back
    if not isinstance(value, Mapping):
        raise ConfigError(f"{_key(name)} must be a mapping of tool names to token limits (or None), got {value!r:.80}")
    out: list[tuple[str, int | None]] = []
    for tool, limit in value.items():
        if not isinstance(tool, str) or not tool:
            raise ConfigError(f"{_key(name)}: tool names must be non-empty strings, got {tool!r:.80}")
        out.append((tool, optional_integer(limit, f"{_key(name)}[{tool!r}]")))
    return tuple(sorted(out))


def _names(value: object, name: str) -> frozenset[str]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
        raise ConfigError(f"{_key(name)} must be a list of tool names, got {value!r:.80}")
    for item in value:
        if not isinstance(item, str) or not item:
            raise ConfigError(f"{_key(name)}: tool names must be non-empty strings, got {item!r:.80}")
    return frozenset(value)


def _share(value: object, name: str) -> float:
    if not isinstance(value, float) or not 0.0 < value <= 1.0:
        raise ConfigError(f"{_key(name)} must be a float in (0, 1] (a share of the token trigger), got {value!r:.80}")
    return value


def _pair(value: object, name: str) -> tuple[int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ConfigError(f"{_key(name)} must be a pair (compactions, requests), got {value!r:.80}")
    return integer(value[0], f"{_key(name)}: compactions"), integer(value[1], f"{_key(name)}: requests")


def _result_limit(value: int | None) -> int | None:
    return _optional_limit(value, "tool_result_limit")


def _preview(value: int) -> int:
    return integer(value, _key("tool_result_preview"), minimum=16)


def _mask(value: bool) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{_key('mask_tool_results')} must be True or False, got {value!r:.80}")
    return value


def _mask_trigger(value: float) -> float:
    return _share(value, "mask_trigger")


def _mask_keep(value: int) -> int:
    return integer(value, _key("mask_keep"), minimum=0)


def _mask_at_least(value: int | None) -> int | None:
    return _optional_limit(value, "mask_at_least")


def _exclude(value: Iterable[str]) -> frozenset[str]:
    return _names(value, "mask_exclude")


def _thrash(value: tuple[int, int]) -> tuple[int, int]:
    return _pair(value, "compact_thrash")


def _min_gain(value: int | None) -> int | None:
    return _optional_limit(value, "compact_min_gain")


@attrs.frozen(kw_only=True)
class TierConfig:
    """The cheap tiers before a summary, read from `state.config` (each key checked; a bad
    value raises `ConfigError` naming it).

    - `tool_result_limit` (tokens, or None: no cap): a tool result (MCP results included) past
      it is journaled whole and the context gets a head/tail preview naming its journal record.
      Default: 8,000, at most a quarter of the token trigger. `tool_result_limits`: per tool
      name, a limit or None (never capped). `tool_result_preview`: the preview's size in tokens
      (default 1,000; at most half the limit).
    - `mask_tool_results` (default True): past `mask_trigger` (a share of the token trigger,
      default 0.3), the results of tool uses older than the newest `mask_keep` (default 3) are
      journaled and replaced by a one-line placeholder, in one batch, when it frees at least
      `mask_at_least` tokens (default 4,000, at most a twentieth of the token trigger);
      `mask_exclude` names tools whose results are never masked.
    - `compact_thrash` (compactions, requests), default (3, 3): that many compactions within
      that many model requests, and the next one fails the turn with `CompactionThrashing`.
    - `compact_min_gain` (tokens): the least a compaction the model asks for (the
      `compact_context` tool) must free; default as `mask_at_least`'s.
    """

    tool_result_limit: int | None = attrs.field(default=DEFAULT_TOOL_RESULT_LIMIT, converter=_result_limit)
    limit_given: bool = attrs.field(
        default=attrs.Factory(lambda self: self.tool_result_limit != DEFAULT_TOOL_RESULT_LIMIT, takes_self=True)
    )
    tool_result_limits: tuple[tuple[str, int | None], ...] = attrs.field(default=(), converter=_limits)
    tool_result_preview: int = attrs.field(default=DEFAULT_PREVIEW, converter=_preview)
    mask_tool_results: bool = attrs.field(default=True, converter=_mask)
    mask_trigger: float = attrs.field(default=DEFAULT_MASK_TRIGGER, converter=_mask_trigger)
    mask_keep: int = attrs.field(default=DEFAULT_MASK_KEEP, converter=_mask_keep)
    mask_at_least: int | None = attrs.field(default=None, converter=_mask_at_least)
    mask_exclude: frozenset[str] = attrs.field(default=frozenset(), converter=_exclude)
    thrash: tuple[int, int] = attrs.field(default=DEFAULT_THRASH, converter=_thrash)
    min_gain: int | None = attrs.field(default=None, converter=_min_gain)

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> TierConfig:
        return cls(
            tool_result_limit=config.get("tool_result_limit", DEFAULT_TOOL_RESULT_LIMIT),
            limit_given="tool_result_limit" in config,
            tool_result_limits=config.get("tool_result_limits", {}),
            tool_result_preview=config.get("tool_result_preview", DEFAULT_PREVIEW),
            mask_tool_results=config.get("mask_tool_results", True),
            mask_trigger=config.get("mask_trigger", DEFAULT_MASK_TRIGGER),
            mask_keep=config.get("mask_keep", DEFAULT_MASK_KEEP),
            mask_at_least=config.get("mask_at_least"),
            mask_exclude=config.get("mask_exclude", ()),
            thrash=config.get("compact_thrash", DEFAULT_THRASH),
            min_gain=config.get("compact_min_gain"),
        )

    def as_config(self) -> dict[str, Any]:
        """The `state.config` keys of these settings that differ from the defaults."""
        out: dict[str, Any] = {}
        if self.limit_given:
            out["tool_result_limit"] = self.tool_result_limit
        keys = {
            "tool_result_limits": ({}, dict(self.tool_result_limits)),
            "tool_result_preview": (DEFAULT_PREVIEW, self.tool_result_preview),
            "mask_tool_results": (True, self.mask_tool_results),
            "mask_trigger": (DEFAULT_MASK_TRIGGER, self.mask_trigger),
            "mask_keep": (DEFAULT_MASK_KEEP, self.mask_keep),
            "mask_at_least": (None, self.mask_at_least),
            "mask_exclude": ([], sorted(self.mask_exclude)),
            "compact_thrash": (DEFAULT_THRASH, self.thrash),
            "compact_min_gain": (None, self.min_gain),
        }
        out.update((key, value) for key, (default, value) in keys.items() if value != default)
        return out

    def limit_for(self, tool: str, trigger: int | None) -> int | None:
        """The cap for `tool`'s results in tokens (None: not capped)."""
        for name, limit in self.tool_result_limits:
            if name == tool:
                return limit
        limit = self.tool_result_limit
        if limit is not None and not self.limit_given and trigger is not None:
            limit = max(64, min(limit, trigger // 4))
        return limit

    def preview_for(self, limit: int) -> int:
        return max(16, min(self.tool_result_preview, limit // 2))

    def gain(self, trigger: int | None) -> int:
        """`mask_at_least` (or its default for `trigger`)."""
        if self.mask_at_least is not None:
            return self.mask_at_least
        return DEFAULT_MIN_GAIN if trigger is None else max(1, min(DEFAULT_MIN_GAIN, trigger // 20))

    def min_gain_for(self, trigger: int | None) -> int:
        if self.min_gain is not None:
            return self.min_gain
        return DEFAULT_MIN_GAIN if trigger is None else max(1, min(DEFAULT_MIN_GAIN, trigger // 20))
