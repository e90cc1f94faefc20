"""`RehydrateReads`: a shipped, opt-in plugin that re-injects the newest file reads after a
summary, so the model does not spend a step (and a cache break) reading them again.

Tool results of tools whose names match `patterns` (shell-style, e.g. `"read_*"`) that a
compaction evicted are put back right after the summary, newest first, one per distinct
argument set (the same file read twice counts once, as last read), at most `max_files`, each
within `file_tokens` and all within `total_tokens` (and never more than an eighth of the token
trigger, so a rehydration cannot push the context back over it). Masked placeholders are not
files and are skipped; a read still in the kept messages is not repeated.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence

from .._check import integer
from .._clip import clip
from ..errors import ConfigError
from ..message import KIND_KEY, Message, ToolCall
from ..plugins import AfterCompact, BeforeCompact, Plugin
from ..state import State
from ..tokens import estimate_message_tokens, estimate_text_tokens
from .caches import parse_config
from .tiers import MASKED_KEY, gist

REHYDRATED_KIND = "rehydrated"
INTRO = "[Files as last read before the conversation was summarized (they may have changed since):]"


class RehydrateReads(Plugin):
    """After each compaction, the newest evicted file reads, within budgets (see the module)."""

    priority = 200  # after the plugins that shape the summary's place
    hook_timeout = None

    def __init__(
        self,
        patterns: Iterable[str] = ("read_file", "read", "Read", "cat", "view*", "open_file"),
        *,
        max_files: int = 5,
        file_tokens: int = 5_000,
        total_tokens: int = 20_000,
    ) -> None:
        if isinstance(patterns, str):
            patterns = (patterns,)
        self.patterns = tuple(patterns)
        if not self.patterns or not all(isinstance(p, str) and p for p in self.patterns):
            raise ConfigError(f"RehydrateReads patterns must be non-empty strings, got {patterns!r:.80}")
        self.max_files = integer(max_files, "RehydrateReads max_files")
        self.file_tokens = integer(file_tokens, "RehydrateReads file_tokens", minimum=16)
        self.total_tokens = integer(total_tokens, "RehydrateReads total_tokens", minimum=16)
        self._evicted: dict[str, tuple[Message, ...]] = {}

    def matches(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    async def before_compact(self, ctx: BeforeCompact) -> None:
        self._evicted[ctx.state.agent_id] = ctx.evicted  # observed only: what may come back
        return None

    async def after_compact(self, ctx: AfterCompact) -> State | None:
        evicted = self._evicted.pop(ctx.state.agent_id, ())
        note = self.note(evicted, ctx.state)
        return None if note is None else ctx.insert_after_summary(note)

    def note(self, evicted: Sequence[Message], state: State) -> Message | None:
        """The message re-injecting the reads of `evicted`, or None when there are none."""
        calls: dict[str, ToolCall] = {c.id: c for m in evicted for c in m.tool_calls}
        kept_calls = {c.id: c for m in state.messages for c in m.tool_calls}
        in_context = {(c.name, gist(c)) for c in kept_calls.values() if self.matches(c.name)}
        trigger = parse_config(state.config).token_trigger
        total = self.total_tokens if trigger is None else min(self.total_tokens, max(16, trigger // 8))
        seen: set[tuple[str, str]] = set()
        parts: list[str] = []
        used = estimate_text_tokens(INTRO)
        for m in reversed(evicted):
            call = calls.get(m.tool_call_id or "")
            if m.role != "tool" or call is None or m.is_error or not self.matches(call.name):
                continue
            if MASKED_KEY in m.metadata or not isinstance(m.content, str):
                continue
            key = (call.name, gist(call))
            if key in seen or key in in_context:
                continue
            seen.add(key)
            block = f"### {call.name}({key[1]})\n" + clip(
                m.text, self.file_tokens * 4, note="; clipped on re-injection"
            )
            cost = estimate_text_tokens(block)
            if used + cost > total:
                continue
            parts.append(block)
            used += cost
            if len(parts) >= self.max_files:
                break
        if not parts:
            return None
        message = Message.user("\n\n".join([INTRO, *parts]), metadata={KIND_KEY: REHYDRATED_KIND})
        estimate_message_tokens(message)
        return message


__all__ = ["REHYDRATED_KIND", "RehydrateReads"]
