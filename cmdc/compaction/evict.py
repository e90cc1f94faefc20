"""What one compaction pass evicts: the split (`cutoff`) with the session's task and the
messages plugins keep pinned, within the pin budget, a summary over its budget evicted, and the
`before_compact` fold. The `Compactor` makes an `Eviction` per pass from its options."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from .._report import Skipped
from ..errors import CompactionAborted
from ..events import COMPACTION_SKIPPED, PINS_OVER_BUDGET, PLUGIN_ERROR
from ..message import Message
from ..plugins import Abort, BeforeCompact, Plugin, fold
from ..state import State
from .config import CompactConfig, Threshold
from .cutoff import Split, split_messages
from .options import CompactorOptions

Emit = Callable[..., None]
"""`emit(kind, state, **data)`: an event about `state` to the compactor's `on_event`."""


def plugin_error(emit: Emit, state: State, hook: str) -> Callable[[Plugin, BaseException], None]:
    """A fold's `on_error`: a plugin that raised in `hook` is reported as a `plugin_error` event."""

    def report(plugin: Plugin, exc: BaseException) -> None:
        emit(PLUGIN_ERROR, state, plugin=plugin.name, hook=hook, error=repr(exc))

    return report


def task_id(state: State) -> str | None:
    """The session's first user message: the first non-summary user message."""
    for m in state.messages:
        if m.role == "user" and not m.is_summary:
            return m.id
    return None


def skipped(emit: Emit, state: State, why: str) -> Skipped:
    """`Skipped(state, why)`, with its `compaction_skipped` event."""
    emit(COMPACTION_SKIPPED, state, reason=why, skipped_by=None)
    return Skipped(state, why)


def held_before_evicted(state: State, split: Split) -> int:
    """How many of `split.kept` come before the first evicted message: held messages (the
    pinned task) older than everything the summary replaces, which stay before it."""
    held = {m.id for m in split.held}
    n, i = 0, len(split.pinned)
    while i < len(state.messages) and state.messages[i].id in held:
        n, i = n + 1, i + 1
    return n


@attrs.frozen
class Eviction:
    """The split stage of one pass: `options` (`pin_task`, the pin budget, the plugins),
    `count` and `total` (tokens of a message, of messages), `emit` (events)."""

    options: CompactorOptions
    count: Callable[[Message], int]
    total: Callable[[Sequence[Message]], int]
    emit: Emit

    def split(
        self, state: State, config: CompactConfig, keep: Threshold, window: int | None, budget: int
    ) -> Split | None:
        """The split with pins, a summary over its budget evicted (it is re-summarized, never
        kept as it is); None when nothing can be evicted."""
        split = self.with_pins(state, config, keep, (), window)
        oversized = tuple(m for m in split.kept if m.is_summary and self.count(m) > budget)
        if oversized:
            split = attrs.evolve(
                split,
                evicted=(*oversized, *split.evicted),
                kept=tuple(m for m in split.kept if m not in oversized),
                held=tuple(m for m in split.held if m not in oversized),
            )
        if not split.evicts_anything and not (split.evicted and self.total(split.evicted) > budget):
            return None  # a summary alone is evicted only when it is over its budget
        return split

    def with_pins(
        self, state: State, config: CompactConfig, keep: Threshold, extra: Iterable[str], window: int | None = None
    ) -> Split:
        """The split with the task and `extra` pinned, within the pin budget: past it, the
        oldest pins (the task last) are summarized instead, with an event."""
        task = task_id(state) if self.options.pin_task else None
        pins = {*extra} if task is None else {*extra, task}
        split = self.cut(state, config, keep, pins)
        budget = self.options.pin_limit(config, window)
        open_groups = {state.messages[g.index].id for g in state.call_index.open}
        open_results = {state.messages[i].id for g in state.call_index.open for i in g.results}
        pinned = [m for m in split.held if m.id not in open_groups and m.id not in open_results]
        total = sum(self.count(m) for m in pinned)
        if total <= budget:
            return split
        order = [m for m in pinned if m.id != task] + [m for m in pinned if m.id == task]
        dropped: list[str] = []
        for m in order:
            if total <= budget:
                break
            dropped.append(m.id)
            total -= self.count(m)
        self.emit(PINS_OVER_BUDGET, state, budget=budget, unpinned=tuple(dropped), pinned_tokens=total)
        return self.cut(state, config, keep, pins - set(dropped), dropped)

    def cut(
        self, state: State, config: CompactConfig, keep: Threshold, pins: Iterable[str], unpinned: Iterable[str] = ()
    ) -> Split:
        return split_messages(
            state.messages,
            keep,
            context_window=config.context_window,
            count=self.count,
            pinned_ids=frozenset(pins),
            unpinned_ids=frozenset(unpinned),
            index=state.call_index,
        )

    def kept_task(self, state: State, split: Split) -> str | None:
        """The pinned task's id when it stays in the context verbatim (it is then not restated)."""
        task = task_id(state) if self.options.pin_task else None
        return task if task is not None and any(m.id == task for m in split.kept) else None

    async def before_compact(
        self,
        state: State,
        config: CompactConfig,
        split: Split,
        reason: str,
        instruction: str | None,
        keep: Threshold,
        window: int | None,
    ) -> tuple[Split, Skipped | None]:
        """The `before_compact` fold: plugins may skip (`Skip`), abort (`CompactionAborted`) or
        evict fewer messages (the call groups are closed again around what they keep)."""
        plugins = self.options.plugins
        if not any(p.implements("before_compact") for p in plugins):
            return split, None
        offered = {m.id for m in split.evicted}
        ctx = BeforeCompact(state, split.evicted, split.kept, reason, instruction)
        folded = await fold(
            plugins,
            "before_compact",
            ctx,
            split.evicted,
            rebind=_rebind,
            on_error=plugin_error(self.emit, state, "before_compact"),
        )
        if isinstance(folded.stop, Abort):
            self.emit(COMPACTION_SKIPPED, state, reason=folded.stop.reason, skipped_by=folded.stopped_by)
            raise CompactionAborted(f"plugin {folded.stopped_by} aborted the compaction: {folded.stop.reason}")
        if folded.stop is not None:
            self.emit(COMPACTION_SKIPPED, state, reason=folded.stop.reason, skipped_by=folded.stopped_by)
            return split, Skipped(state, folded.stop.reason or "skipped by a plugin", folded.stopped_by)
        chosen = {m.id for m in folded.value}
        if chosen != offered:
            # Keep what the plugins took out, and re-close the call groups around it.
            split = self.with_pins(state, config, keep, offered - chosen, window)
            if not split.evicts_anything:
                return split, skipped(self.emit, state, "plugins left nothing to evict")
        return split, None


def _rebind(ctx: BeforeCompact, evicted: Any) -> BeforeCompact:
    return attrs.evolve(ctx, evicted=evicted)
