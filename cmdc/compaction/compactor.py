"""The `Compactor`: it reads top to bottom as its API, then the pipeline's stages in order:
decide, split, offload, summarize, finalize, verify.

The pieces live beside it: `options` (the validated options, the one list of them, and the
budgets), `evict` (the split stage: pins, their budget, the `before_compact` fold), `verify`
(the contraction rule, the new state and report, the `after_compact` fold), `attempts`
(retries, fallbacks, failover), `clip` (what a compaction clips), `caches` (process-wide
caches), `cutoff` (the pure split), `finalize` (the summary message), `summary` (calling a
summarizer).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Awaitable, Callable, Sequence
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import attrs
import orjson
import trio

from .._check import is_int, known_names, optional_integer
from .._report import Compacted, CompactionReport, Skipped
from .._trio import one_of, reraise
from ..errors import (
    CompactionError,
    CompactionIncomplete,
    ConfigError,
    OffloadError,
)
from ..events import (
    COMPACTION_FAILED,
    COMPACTION_START,
    TOOL_RESULTS_CLIPPED,
    Event,
    emit,
)
from ..message import Message
from ..plugins import Plugin
from ..providers.base import ModelRequest
from ..state import State
from ..store import FileStore, Store
from ..store.records import ATTEMPTS_KEY, AppendResult, JournalRef, new_attempt_id
from ..tokens import estimate_message_tokens, estimate_text_tokens
from .attempts import Failover, ShouldRetry, Summary, SummaryAttempt, default_should_retry, summarize
from .caches import parse_config
from .clip import clipped_result, reduced, trailing_tool_results
from .config import CompactConfig, Threshold
from .cutoff import Split
from .evict import Eviction, skipped
from .evict import held_before_evicted as _held_before_evicted
from .finalize import FinalizeContext, run_finalize
from .ledger import (
    LEDGER_KEY,
    LEDGER_SHARE,
    Ledger,
    carry,
    cues_ready,
    first_read,
    fit,
    record_numbers,
    remember_ledger,
    without_ledger,
)
from .options import SUMMARY_BUDGET, SUMMARY_FLOOR, CompactorOptions, ledger_shares, takes_options
from .verify import Verification, journal_fields, tag_summaries
from .verify import pointer as _pointer
from .warm import AgentContext, agent_context, counting, total, warm_request

_REDUCE_INLINE_TOKENS = 250_000  # evicted messages past this (about 1 MB) are reduced in a worker thread
_CACHED_TOKENS = attrgetter("_tokens")
_LEDGER_INLINE = 200  # past this many evicted messages the ledger is read in a worker thread
_LEDGER_MARGIN = 64  # tokens of what is evicted the summary's header and headings may take

Reason = Literal["auto", "forced", "manual", "requested"]
T = TypeVar("T")
E = TypeVar("E")
_Early = tuple[Ledger, "Sequence[Message] | None"]  # (see `Compactor._early`)
_OPTION_NAMES = frozenset(f.name for f in attrs.fields(CompactorOptions))


class Compactor:
    """Keeps an agent's context under its configured size: the API (`should_compact`,
    `maybe_compact`, `force_compact`, ...) and the pipeline's stages, in reading order. Its
    options (`CompactorOptions`, where each is documented, the one list of them) are given as
    keywords, or as one value with `Compactor.from_options`; `compactor.options` holds them
    (change one with `compactor.options = attrs.evolve(compactor.options, retries=5)`, which
    checks it again).

    Budgets (the contraction rule): everything a compaction inserts (the summary message, the
    preserved user messages in it, whatever a finalizer adds) fits `summary_budget` tokens:
    the smaller of an absolute cap (default `SUMMARY_BUDGET`, 20,000, the order of what Codex
    keeps of user messages, eino 30,000) and a quarter of the token trigger and of the context
    window (configured, or reported by an overflow), never below `SUMMARY_FLOOR` (256). The
    summarizer's answer gets the part the preserved user messages leave (the request carries it
    as its output limit; a longer answer is clipped with a marker), and the inserted messages
    always cost less than the messages they replace: when they would not, the compaction falls
    back step by step (the summary clipped, then alone, then a pointer-only summary naming the
    journal records), reported as `CompactionReport.fallback` with a `compaction_fallback`
    event; when even a pointer would not be smaller, the compaction is skipped with that reason.

    The journal: the evicted messages are written as an uncommitted attempt before the
    summarizer runs; `commit_journal` (the default) commits it when the compaction succeeds.
    An agent passes False and calls `commit(state)` once it has committed the state itself,
    so a compaction whose state is thrown away never shows in the journal.
    """

    __slots__ = ("_config_for", "_counted", "_store", "_store_key", "options")

    @takes_options(CompactorOptions)
    def __init__(self, *args: Any, **keywords: Any) -> None:
        """`Compactor(summarizer, *, plugins=..., ...)`: exactly `CompactorOptions`' parameters
        (checked there; see `takes_options`). `Compactor.from_options(options)` takes them as
        one value."""
        options = keywords.pop("options", None)  # the older spelling of `from_options`
        if options is None:
            known_names(keywords, _OPTION_NAMES, "Compactor option")
            options = CompactorOptions(*args, **keywords)
        elif not isinstance(options, CompactorOptions):
            raise ConfigError(f"options must be a CompactorOptions, got {options!r:.80}")
        elif args or set(keywords) - {"plugins"}:
            raise ConfigError("give the summarizer and the other options in options, not beside it")
        elif "plugins" in keywords:
            options = attrs.evolve(options, plugins=keywords["plugins"])
        self._setup(options)

    def _setup(self, options: CompactorOptions) -> None:
        self.options: CompactorOptions = options
        self._config_for: tuple[object, CompactConfig] | None = None
        self._counted: tuple[State, int] | None = None  # the last state counted by token_counter
        self._store: FileStore | None = None  # the store this compactor opened (none given)
        self._store_key: Path | None = None

    @classmethod
    def from_options(cls, options: CompactorOptions) -> Compactor:
        """A compactor configured by `options` (the value itself is kept: `c.options is options`)."""
        if not isinstance(options, CompactorOptions):
            raise ConfigError(f"options must be a CompactorOptions, got {options!r:.80}")
        compactor = cls.__new__(cls)
        compactor._setup(options)
        return compactor

    @property
    def plugins(self) -> tuple[Plugin, ...]:
        """The compaction plugins, in run order (`options.plugins`)."""
        return self.options.plugins

    if not TYPE_CHECKING:  # the older spelling, untyped: set, the plugins are checked again

        @plugins.setter
        def plugins(self, value: Any) -> None:
            self.options = attrs.evolve(self.options, plugins=value)

    def add_plugin(self, plugin: Plugin) -> None:
        """Register a plugin (kept in priority order)."""
        self.options = attrs.evolve(self.options, plugins=(*self.options.plugins, plugin))

    # -- the API: sizes and the decision, O(1) in the history's length ------------------------

    def compact_config(self, state: State) -> CompactConfig:
        """The compaction settings of `state.config` (validated; cached per config object)."""
        cached = self._config_for
        if cached is not None and cached[0] is state.config:
            return cached[1]
        config = parse_config(state.config)
        self._config_for = (state.config, config)
        if self.options.store is None:
            self.store_for(config)  # the offload directory is made absolute now, at first use
        return config

    def count(self, message: Message) -> int:
        """Tokens of one message, by the custom counter if one was given."""
        counter = self.options.token_counter
        if counter is None:
            return estimate_message_tokens(message)
        n = counter(message)
        if not is_int(n) or n < 0:
            raise ConfigError(f"token_counter returned {n!r} for message {message.id}; expected an int >= 0")
        return n

    def _sum(self, messages: Sequence[Message]) -> int:
        if self.options.token_counter is None:
            return _estimated(messages)
        return sum(self.count(m) for m in messages)

    def estimate_tokens(self, state: State) -> int:
        """The context's size: the last reported usage plus estimates of later messages.

        With the default estimator this is `state.token_usage` (kept up to date by `State`).
        A custom counter counts only the messages after the baseline, and for a state that grew
        by appends from the last one counted, only the new messages."""
        if self.options.token_counter is None:
            return state.token_usage
        known = self._counted
        if known is not None:
            old, total = known
            if old is state:
                return total
            n = len(old.messages)
            if old.baseline_index == state.baseline_index and state.grew_from(old):
                # the state grew by appends since: count only what is new
                total += sum(self.count(m) for m in state.messages[n:])
                self._counted = (state, total)
                return total
        usage = state.last_usage
        base = 0 if usage is None else usage.total_tokens
        total = base + sum(self.count(m) for m in state.messages[state.baseline_index + 1 :])
        self._counted = (state, total)
        return total

    def should_compact(self, state: State) -> bool:
        """True when any trigger is reached (`>=`)."""
        config = self.compact_config(state)
        tokens: int | None = None
        for trigger in config.triggers:
            if trigger.mode == "messages":
                if len(state.messages) >= trigger.value:
                    return True
                continue
            if tokens is None:
                tokens = self.estimate_tokens(state)
            if tokens >= trigger.tokens(config.context_window):
                return True
        return False

    def budgets(self, config: CompactConfig, window: int | None = None) -> tuple[int, int, int]:
        """(summary budget, preserved user messages' budget, the summarizer's output limit), in
        tokens, for `config` and a window the model reported (see the class docstring)."""
        return self.options.budgets(config, window)

    # -- the API: actions ------------------------------------------------------------------------

    async def maybe_compact(self, state: State) -> Compacted | Skipped:
        """Compact when a trigger is reached; otherwise `Skipped`."""
        if not self.should_compact(state):
            return Skipped(state, "below every trigger")
        return await self._compact(state, "auto", None)

    async def force_compact(
        self, state: State, *, instruction: str | None = None, reason: Reason = "forced", window: int | None = None
    ) -> Compacted | Skipped:
        """Compact now, whatever the triggers say. `instruction` is added to the summary prompt
        for this call only (for example "focus on the API changes"). `window`: the model's
        context window when known (a `ContextOverflow` reports it); the budgets for preserved
        user messages and pins then stay within a share of it."""
        if reason not in ("auto", "forced", "manual", "requested"):
            raise ConfigError(f"reason must be 'auto', 'forced', 'manual' or 'requested', got {reason!r}")
        if instruction is not None and not isinstance(instruction, str):
            raise ConfigError(f"instruction must be a string, got {type(instruction).__name__}")
        optional_integer(window, "window")
        return await self._compact(state, reason, instruction, window)

    async def clip_tail(self, state: State) -> State | None:
        """When the kept messages alone overflow the model: the trailing tool results longer
        than `reduce_tokens` (default 2,000) are journaled whole, then replaced by their head and
        a pointer to the journal. None when there is nothing to clip."""
        limit = self.options.reduce_tokens or 2_000
        start = trailing_tool_results(state.messages)
        large = [m for m in state.messages[start:] if self.count(m) > limit]
        if not large:
            return None
        store = self.store_for(self.compact_config(state))
        written = await store.append(state.agent_id, large, compaction=state.compactions, expect=_expect(state))
        ids = {m.id for m in large}
        clipped = [clipped_result(m, limit, written) if m.id in ids else m for m in state.messages[start:]]
        messages = (*state.messages[:start], *clipped)
        self._emit(TOOL_RESULTS_CLIPPED, state, clipped=len(large), offload_path=str(written.path))
        return state.evolve(messages=messages, usage_floor=len(messages), **journal_fields(state, written))

    def store_for(self, config: CompactConfig) -> Store:
        """The compactor's store, else a file store of `config.offload_dir` that this compactor
        opens and owns (closed by `aclose`; another compactor on the same directory opens its
        own, with its own `on_event`: the files' locks keep them apart). A relative directory is
        made absolute once, when this compactor first uses it (a later `chdir` does not split
        the journal)."""
        if self.options.store is not None:
            return self.options.store
        store = self._store
        if store is None or self._store_key != config.offload_dir:
            store = self._store = FileStore(Path(os.path.abspath(config.offload_dir)), on_event=self.options.on_event)
            self._store_key = config.offload_dir
        return store

    async def start_store(self, config: CompactConfig) -> None:
        """Start the store this compactor opens for `config` (a given store is its owner's to
        start): an unusable offload directory fails here, with `OffloadError`."""
        if self.options.store is None:
            await self.store_for(config).start()

    async def aclose(self) -> None:
        """Close the store this compactor opened, if any (a given store is its owner's)."""
        store, self._store, self._store_key = self._store, None, None
        if store is not None:
            await store.aclose()

    async def commit(self, state: State) -> None:
        """Commit the journal attempts the summaries in `state` depend on (a no-op when they
        are committed already). Called by whoever commits `state`; see `commit_journal`."""
        attempts: list[str] = []
        for m in state.messages[:64]:  # summaries sit after the pinned system messages
            value = m.metadata.get(ATTEMPTS_KEY) if m.is_summary else None
            if isinstance(value, (list, tuple)):
                attempts += [a for a in value if isinstance(a, str)]
        if attempts:
            store = self.store_for(self.compact_config(state))
            await store.commit(state.agent_id, attempts, expect=_expect(state))

    # -- the pipeline ------------------------------------------------------------------------------

    async def _compact(
        self, state: State, reason: str, instruction: str | None, window: int | None = None
    ) -> Compacted | Skipped:
        """`_passes`, then (with `commit_journal`) the journal commit of the compacted state."""
        try:
            result = await self._passes(state, reason, instruction, window)
        except CompactionIncomplete as exc:
            if self.options.commit_journal and isinstance(exc.state, State):
                await self._commit_or_fail(exc.state, state, reason)
            raise
        if self.options.commit_journal and isinstance(result, Compacted):
            await self._commit_or_fail(result.state, state, reason)
        return result

    async def _commit_or_fail(self, new: State, old: State, reason: str) -> None:
        try:
            await self.commit(new)
        except OffloadError as exc:
            self._emit(COMPACTION_FAILED, old, reason=reason, error=str(exc))
            raise

    async def _passes(
        self, state: State, reason: str, instruction: str | None, window: int | None = None
    ) -> Compacted | Skipped:
        """One compaction, then the check: while a trigger still fires, another pass with a
        halved keep rule, at most `max_extra_passes` times; never a loop."""
        config = self.compact_config(state)
        first = await self._compact_once(state, reason, instruction, config.keep, window)
        if not isinstance(first, Compacted):
            return first
        result, keep = first, config.keep
        # Under a window the model reported, the retried request must fit with headroom.
        target = None if window is None else window * 3 // 4

        def over(s: State) -> bool:
            return self.should_compact(s) or (target is not None and self.estimate_tokens(s) > target)

        for _ in range(self.options.max_extra_passes):
            if not over(result.state):
                return result
            keep = _halved(keep)
            again = await self._compact_once(result.state, reason, instruction, keep, window)
            if not isinstance(again, Compacted):
                break
            result = Compacted(again.state, _combined(result.report, again.report))
        if self.should_compact(result.state):
            tokens = self.estimate_tokens(result.state)
            raise CompactionIncomplete(
                f"agent {state.agent_id}: still over a compaction trigger after {result.report.passes} passes "
                f"(~{tokens} tokens, {len(result.state.messages)} messages): the kept messages and pins "
                "alone are too large for the trigger; lower compact_keep or raise compact_trigger",
                state=result.state,
                report=result.report,
            )
        return result

    async def _compact_once(
        self, state: State, reason: str, instruction: str | None, keep: Threshold, window: int | None = None
    ) -> Compacted | Skipped:
        """One pass: each stage in turn."""
        started = trio.current_time()
        config = self.compact_config(state)
        budget, user_budget, answer_budget = self.budgets(config, window)

        # decide and split: what goes, what stays; plugins may take some out or skip
        evict = Eviction(self.options, self.count, self._sum, self._emit)
        split = evict.split(state, config, keep, window, budget)
        if split is None:
            return self._skip(state, "nothing can be evicted")
        tokens_before = self.estimate_tokens(state)
        self._emit(COMPACTION_START, state, reason=reason, tokens=tokens_before, messages=len(state.messages))
        split, skipped = await evict.before_compact(state, config, split, reason, instruction, keep, window)
        if skipped is not None:
            return skipped
        evicted_tokens = self._sum(split.evicted)
        compaction = state.compactions + 1
        smallest = self.count(_pointer(compaction, len(split.evicted), self._journal(state, config)))
        if evicted_tokens <= smallest:
            return self._skip(
                state,
                f"the {len(split.evicted)} evictable message(s) ({evicted_tokens} tokens) cost no more than the "
                f"smallest summary that could replace them ({smallest} tokens)",
            )

        cap = min(budget, evicted_tokens - _LEDGER_MARGIN)
        estimated = evicted_tokens if self.options.token_counter is None else None
        # The records' numbers, predicted: the journal's next ones, as far as this state knows it.
        # The work that needs them and not the fsync starts beside the append, with these; once
        # the append has numbered the records they are checked, and the work is done again
        # with the real ones when they differ (a retry's reused records, a journal written since).
        predicted = _predicted(state, split, self._journal(state, config))
        early: Callable[[], Awaitable[_Early]] | None = None
        # The ledger is read here, while the append's fsync runs, when that is quick: a small
        # batch, or messages whose cues were read as they were appended (it then only takes
        # them, ~1 ms); else in a worker thread
        read_from = first_read(split.evicted)  # (where the ledger reads whole: found once)
        inline = len(split.evicted) <= _LEDGER_INLINE or cues_ready(split.evicted, read_from)
        if not inline:

            async def early() -> _Early:  # beside the append (its writes and fsync), in a worker thread
                return await trio.to_thread.run_sync(self._early, state, split, predicted, cap, estimated)

        async def summarized(written: AppendResult, ahead: _Early | None) -> tuple[Summary, list[Message]]:
            task = evict.kept_task(state, split)
            ledger, ordered = ahead if ahead is not None and _numbered_as(written, predicted) else (None, None)
            if ledger is None:
                if not inline:  # beside the fsync, in a worker thread
                    made = functools.partial(_ledger, state, split, written, cap, start=read_from)
                    ledger = await trio.to_thread.run_sync(made)
                else:
                    ledger = _ledger(state, split, written, cap, start=read_from)
            users, answer = ledger_shares(budget, user_budget, answer_budget, ledger, cap)
            summary = await self._summarize(
                state, config, split, written, instruction, task, answer, window, estimated, ordered
            )
            inserted = await self._finalize(state, split, written, compaction, summary, users, task, ledger)
            tagged = list(tag_summaries(inserted, written))  # here, while the fsync runs
            for m in tagged:
                if m.metadata and m.is_summary:
                    remember_ledger(m, ledger)  # the next compaction takes it, not its JSON
            return summary, tagged

        try:
            written, (summary, inserted) = await self._offload_then(state, config, split, compaction, summarized, early)
        except (OffloadError, CompactionError) as exc:  # one event, whichever failed
            self._emit(COMPACTION_FAILED, state, reason=reason, error=str(exc))
            raise
        verification = Verification(self.options, self.count, self.estimate_tokens, self._emit)
        return await verification.verify(
            state, split, written, compaction, inserted, summary, reason, budget, tokens_before, evicted_tokens, started
        )

    # -- offload ----------------------------------------------------------------------------------

    async def _offload(
        self,
        state: State,
        config: CompactConfig,
        split: Split,
        compaction: int,
        on_numbered: Callable[[AppendResult], object] | None = None,
    ) -> AppendResult:
        """Write-ahead: the evicted messages are durable before the state that drops them
        exists, as an attempt that becomes visible when the compaction's state is committed."""
        return await self.store_for(config).append(
            state.agent_id,
            split.evicted,
            compaction=compaction,
            attempt=new_attempt_id(),
            expect=_expect(state),
            commit=False,
            on_numbered=on_numbered,
        )

    async def _offload_then(
        self,
        state: State,
        config: CompactConfig,
        split: Split,
        compaction: int,
        then: Callable[[AppendResult, E | None], Awaitable[T]],
        beside: Callable[[], Awaitable[E]] | None = None,
    ) -> tuple[AppendResult, T]:
        """`_offload`, then `then(written, early)`. With the journal store, `then` starts as
        soon as the records are written and numbered, while the append's fsync runs in its
        thread; `beside()`, when given, starts with the append (work that needs no record
        number, or predicted ones) and `then` gets what it returned (None without it). This
        returns only when all are done, so the evicted messages are durable before the
        compacted state exists. A failed append cancels `then` and `beside` (their work is
        moot) and is raised; else what `then` or `beside` raised; a cancel as itself, never
        inside an exception group."""
        numbered = trio.Event()
        results: list[AppendResult] = []  # the append's result, from on_numbered or once it returns
        failed: list[Exception] = []
        broke: list[Exception] = []
        outcome: list[T] = []
        moot, moot_early = trio.CancelScope(), trio.CancelScope()
        early: list[E] = []
        early_done = trio.Event()

        async def ahead() -> None:
            try:
                with moot_early:
                    if beside is not None:
                        early.append(await beside())
            except Exception as exc:  # raised after the nursery, as itself (unless the append failed)
                broke.append(exc)
            finally:
                early_done.set()

        def on_numbered(result: AppendResult) -> None:
            results.append(result)
            numbered.set()

        async def offload() -> None:
            try:
                result = await self._offload(state, config, split, compaction, on_numbered)
                if not results:  # an append that wrote nothing calls no on_numbered
                    results.append(result)
            except Exception as exc:  # raised after the nursery, as itself
                failed.append(exc)
                moot.cancel()
                moot_early.cancel()
            finally:
                numbered.set()

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(offload)
                if beside is not None:
                    nursery.start_soon(ahead)
                    await early_done.wait()
                await numbered.wait()
                with moot:
                    if not failed and not broke:
                        try:
                            outcome.append(await then(results[0], early[0] if early else None))
                        except Exception as exc:  # the append is waited for first: nothing is left half done
                            broke.append(exc)
        except BaseExceptionGroup as group:  # a cancel or an interrupt: the tasks catch the rest
            reraise(one_of(group))
        if failed:  # the append's failure first: it makes whatever `then` did moot
            raise failed[0]
        if broke:
            raise broke[0]
        return results[0], outcome[0]

    def _journal(self, state: State, config: CompactConfig) -> str:
        return self.store_for(config).location(state.agent_id)

    # -- summarize --------------------------------------------------------------------------------

    async def _summarize(
        self,
        state: State,
        config: CompactConfig,
        split: Split,
        written: AppendResult,
        instruction: str | None,
        task: str | None,
        answer_budget: int,
        window: int | None,
        estimated: int | None = None,
        ordered: Sequence[Message] | None = None,
    ) -> Summary:
        """The previous summary first, then every other evicted message, media as placeholders
        and large parts clipped; retries, fallbacks, failover (see `attempts`). The pinned task
        stays in the context verbatim, so the summarizer is told not to restate it. `estimated`:
        the evicted messages' default token estimate, when the caller has it; `ordered`: what the
        summarizer reads (`_reader_input`), when the caller made it already."""
        if ordered is None:
            if (estimated if estimated is not None else _estimated(split.evicted)) > _REDUCE_INLINE_TOKENS:
                # Scanning megabytes for media and clipping them is many short calls: a worker
                # thread does it, so the trio thread runs other agents meanwhile.
                ordered = await trio.to_thread.run_sync(self._reader_input, state, split, written)
            else:
                ordered = self._reader_input(state, split, written)
        prompt = config.summary_prompt
        if task is not None:
            where = "before" if any(m.id == task for m in split.kept[: _held_before_evicted(state, split)]) else "after"
            prompt += (
                f"\n\nThe session's first user message (the task) stays in the context verbatim {where} "
                "your summary: refer to it, do not restate it."
            )
        if instruction:
            prompt = f"{prompt}\n\nAdditional instruction for this summary: {instruction}"

        def event(kind: str, **data: Any) -> None:
            self._emit(kind, state, **data)

        model_window = self.options.summarizer_window or window or config.context_window
        with counting() as usages:
            warm = self._warm_request(state, split, prompt, answer_budget, model_window)
            summary = await summarize(self.options, ordered, prompt, event, answer_budget, model_window, warm)
        return attrs.evolve(summary, usage=total(usages) if usages else None)

    def _reader_input(self, state: State, split: Split, written: AppendResult) -> Sequence[Message]:
        """What the summarizer reads of the evicted messages (earlier summaries first, without
        the ledger they carry), media as placeholders and large parts clipped with a pointer to
        `written`'s records."""
        evicted = _summaries_first(state, split.evicted)
        lead = next((i for i, m in enumerate(evicted) if not m.is_summary), len(evicted))
        if any(LEDGER_KEY in m.metadata for m in evicted[:lead]):  # the summaries come first
            # The ledger is carried in the metadata: the summarizer need not restate it.
            evicted = [m.evolve(content=without_ledger(m.text)) for m in evicted[:lead]] + list(evicted[lead:])
        return reduced(evicted, self.options.reduce_tokens, written)

    def _early(self, state: State, split: Split, predicted: AppendResult, cap: int, estimated: int | None) -> _Early:
        """The work of a pass that needs the records' numbers but not their fsync, done with the
        `predicted` ones beside the append: the ledger, and (for a large batch) what the
        summarizer reads."""
        ledger = _ledger(state, split, predicted, cap)
        large = (estimated if estimated is not None else _estimated(split.evicted)) > _REDUCE_INLINE_TOKENS
        return ledger, self._reader_input(state, split, predicted) if large else None

    def _warm(self) -> AgentContext | None:
        """The agent's context when the summary is asked on its cached prefix: the summarizer
        is a model provider, and `warm_cache` is True, or None with the agent's own provider."""
        context = agent_context()
        summarizer = self.options.summarizer
        if context is None or callable(summarizer) or self.options.warm_cache is False:
            return None
        if self.options.warm_cache is None and summarizer is not context.provider:
            return None
        return context

    def _warm_request(
        self, state: State, split: Split, prompt: str, budget: int, window: int | None
    ) -> ModelRequest | None:
        """The summarizer request on the agent's cached prefix (`warm.warm_request`), or None
        when it does not apply or would not fit `window` (the cold request then)."""
        context = self._warm()
        if context is None:
            return None
        tokens = self.estimate_tokens(state)
        if state.baseline_index < 0:  # no reported usage (it would count the tools): estimate them
            schemas = (orjson.dumps(attrs.asdict(t), default=dict).decode() for t in context.tools)
            tokens += sum(estimate_text_tokens(s) for s in schemas)
        return warm_request(state.messages, context.tools, prompt, len(split.kept), tokens, budget, window)

    # -- finalize ---------------------------------------------------------------------------------

    async def _finalize(
        self,
        state: State,
        split: Split,
        written: AppendResult,
        compaction: int,
        summary: Summary,
        user_budget: int,
        task: str | None,
        ledger: Ledger | None = None,
    ) -> list[Message]:
        """The messages that replace the evicted ones (the finalizer's)."""
        before = split.kept[: _held_before_evicted(state, split)]
        context = FinalizeContext(
            summary=summary.text,
            evicted=split.evicted,
            state=state,
            compaction=compaction,
            offload_path=str(written.path),
            first_seq=written.first_seq,
            last_seq=written.last_seq,
            user_message_budget=user_budget,
            user_message_filter=self.options.user_message_filter,
            kept=split.kept,
            task_id=task,
            ledger=ledger,
            task_before=any(m.id == task for m in before),
        )
        try:
            return await run_finalize(self.options.finalize, context)
        except Exception as exc:
            raise CompactionError(f"the finalizer failed: {type(exc).__name__}: {exc}") from exc

    # -- events -----------------------------------------------------------------------------------

    def _emit(self, kind: str, state: State, **data: Any) -> None:
        emit(self.options.on_event, Event(kind, state.agent_id, data, trio.current_time()))

    def _skip(self, state: State, why: str) -> Skipped:
        return skipped(self._emit, state, why)


def _ledger(state: State, split: Split, written: AppendResult, budget: int, *, start: int | None = None) -> Ledger:
    """The session ledger after this compaction: the evicted summaries' ledgers merged with what
    the evicted messages give, fitted to at most `LEDGER_SHARE` of `budget` (the summary budget,
    or what is evicted when that is smaller: the compaction stays a contraction). Nothing here
    passes over every evicted message (a 10k batch): the summaries are found from the state's
    index, records numbered in order are a range."""
    evicted = split.evicted
    n, first = len(evicted), written.first_seq
    given = written.seqs
    seqs: Sequence[int]
    if not given or (written.written == n == len(given) and given[0] == first and given[-1] == first + n - 1):
        seqs = range(first, first + n)  # every message a new record: numbered in order (the Store contract)
    else:
        seqs = record_numbers(evicted, given, first)
    summaries, positions = _evicted_summaries(state, evicted)
    ledger = carry(summaries, evicted, seqs, positions=positions, start=start)
    return fit(ledger, int(budget * 4 * LEDGER_SHARE))


def _evicted_summaries(state: State, evicted: Sequence[Message]) -> tuple[list[Message], list[int]]:
    """The summaries among `evicted` and where they are: looked for from the front only until
    as many are found as the state holds (they sit after the pinned messages); none, no look."""
    wanted = len(state.call_index.summaries)
    found: list[Message] = []
    at: list[int] = []
    if wanted:
        for i, m in enumerate(evicted):
            if m.metadata and m.is_summary:
                found.append(m)
                at.append(i)
                if len(found) >= wanted:
                    break
    return found, at


def _predicted(state: State, split: Split, location: str) -> AppendResult:
    """The append of `split.evicted` as `state` expects it: every message a new record, numbered
    on from the last record the state names, in order."""
    first, n = state.journal_seq + 1, len(split.evicted)
    return AppendResult(Path(location), first, first + n - 1, n)  # (no seqs: `record_numbers` counts them)


def _numbered_as(written: AppendResult, predicted: AppendResult) -> bool:
    """Whether the work done with `predicted` (`_early`) holds for `written`: the same journal
    and the same record number for every message, in order. Exact: one C comparison of the
    numbers (~0.3 ms for 10k)."""
    first, last = predicted.first_seq, predicted.last_seq
    if (written.first_seq, written.last_seq) != (first, last) or str(written.path) != str(predicted.path):
        return False
    seqs = written.seqs  # (none given: counted from first_seq, as the prediction's)
    return not seqs or (seqs[0] == first and seqs[-1] == last and seqs == tuple(range(first, last + 1)))


def _halved(keep: Threshold) -> Threshold:
    if keep.mode == "fraction":
        return Threshold("fraction", keep.value / 2)
    return Threshold(keep.mode, max(1, int(keep.value) // 2))


def _combined(first: CompactionReport, last: CompactionReport) -> CompactionReport:
    """One report for several passes: before-figures from the first, after-figures from the last."""
    return attrs.evolve(
        last,
        tokens_before=first.tokens_before,
        messages_before=first.messages_before,
        evicted=first.evicted + last.evicted,
        first_seq=first.first_seq,
        attempts=first.attempts + last.attempts,
        duration=first.duration + last.duration,
        passes=first.passes + last.passes,
    )


def _estimated(messages: Sequence[Message]) -> int:
    """The default token estimate of `messages`, cached on each: one C pass, no list."""
    try:
        return sum(map(_CACHED_TOKENS, messages))
    except TypeError:  # an estimate not cached yet
        return sum(m._tokens or estimate_message_tokens(m) for m in messages)


def _summaries_first(state: State, evicted: tuple[Message, ...]) -> Sequence[Message]:
    """`evicted` with earlier summaries first. A summary sits right after the pinned system
    messages, so it is usually first already; only otherwise is the list reordered."""
    summaries = [state.messages[i] for i in state.call_index.summaries]
    if not summaries or (len(summaries) == 1 and evicted and evicted[0] is summaries[0]):
        return evicted
    ids = {m.id for m in summaries}
    return [m for m in evicted if m.id in ids] + [m for m in evicted if m.id not in ids]


class _Option:
    """The older spelling of an option, untyped: `compactor.retries` for
    `compactor.options.retries`; set, it is checked again (as `attrs.evolve` checks every
    option). A descriptor per option, not a `__getattr__` on the class: a class with one pays a
    Python-level hook on every attribute read (`should_compact` took 50% longer)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, compactor: Compactor | None, owner: type | None = None) -> Any:
        if compactor is None:
            return self
        return getattr(compactor.options, self.name)

    def __set__(self, compactor: Compactor, value: Any) -> None:
        compactor.options = attrs.evolve(compactor.options, **{self.name: value})


for _name in sorted(_OPTION_NAMES - set(vars(Compactor))):
    setattr(Compactor, _name, _Option(_name))
del _name


def _expect(state: State) -> JournalRef:
    """The journal identity `state` expects: every store checks it before appending or
    committing (see docs/journal.md, "Stable addresses")."""
    return JournalRef(state.journal_id, state.journal_seq)


# Names this module had before the split, still importable from it.
__all__ = [
    "SUMMARY_BUDGET",
    "SUMMARY_FLOOR",
    "Compacted",
    "CompactionReport",
    "Compactor",
    "CompactorOptions",
    "Failover",
    "ShouldRetry",
    "Skipped",
    "SummaryAttempt",
    "default_should_retry",
]
