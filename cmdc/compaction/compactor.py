"""The `Compactor`: decide, split, offload (write-ahead), summarize, replace, report."""

from __future__ import annotations

import inspect
import math
import os
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

from .._clip import MEDIA_MIN_BYTES, clip_tokens, may_hold_base64
from ..errors import (
    CompactionAborted,
    CompactionError,
    CompactionIncomplete,
    ConfigError,
    ContextOverflow,
    OffloadError,
    SummarizerError,
    SummarizerTimeout,
)
from ..events import (
    COMPACTION_END,
    COMPACTION_FAILED,
    COMPACTION_FALLBACK,
    COMPACTION_SKIPPED,
    COMPACTION_START,
    PINS_OVER_BUDGET,
    PLUGIN_ERROR,
    SUMMARIZER_ATTEMPT,
    SUMMARIZER_FALLBACK,
    SUMMARIZER_SUSPENDED,
    TOOL_RESULTS_CLIPPED,
    Event,
    EventSink,
    emit,
)
from ..message import Message
from ..offload import ATTEMPTS_KEY, JOURNAL_KEY, AppendResult, JournalRef, OffloadStore, new_attempt_id
from ..plugins import Abort, AfterCompact, BeforeCompact, Plugin, fold, sort_plugins
from ..report import Compacted, CompactionReport, Skipped
from ..state import State
from ..store import Store, open_store
from ..tokens import (
    IMAGE_TOKENS,
    TokenCounter,
    estimate_message_tokens,
    estimate_text_tokens,
    estimate_tokens_from_messages,
)
from .breaker import SummarizerBreaker
from .config import CompactConfig, Threshold
from .cutoff import Split, split_messages
from .finalize import USER_MESSAGES_KEY, Finalize, FinalizeContext, default_finalize, run_finalize
from .summary import (
    TRUNCATED_STOPS,
    ExtractiveSummarizer,
    Summarizer,
    missing_sections,
    pointer_message,
    summarize_chunks,
    summarizer_name,
    without_media,
)

Reason = Literal["auto", "forced", "manual"]


class Compactor:
    """Keeps an agent's context under its configured size.

    `summarizer`: a provider or an async callable `(messages, instruction) -> str`; None means
    the offline `ExtractiveSummarizer`. `retries`: extra attempts per summarizer, with
    exponential backoff from `retry_backoff` seconds (at most `max_backoff`). `should_retry`:
    sees each `SummaryAttempt` (its answer or its error) and says whether it is unusable; by
    default (`default_should_retry`) an error, an empty answer, an answer cut off by its output
    limit (stop reason `length` / `max_tokens`) and one lacking the sections its prompt asked for
    are (an empty answer is never accepted); a cut-off answer is retried with smaller chunks.
    `fallbacks`: summarizers tried in order, with the same retries, when the primary
    gives up (a `summarizer_fallback` event says so when one of them writes the summary).
    `failover`: a callable (sync or async) that gets the last `SummaryAttempt` and returns
    `(summarizer, messages)` to try next, or None to stop; it is called at most
    `retries + 1` times, after the fallbacks. `summarizer_input_tokens`: past this many estimated tokens the
    evicted messages are summarized in chunks, rolled forward. `summarizer_window`: the
    summarizing model's context window (default: the agent's `context_window`, or the window
    an overflow reported); a model summarizer's request is sized so that its input plus the
    summary's output budget fits it, in chunks otherwise. `token_counter`: a per-message
    counter (a real tokenizer) replacing the default estimate. `on_event`: receives `Event`s.

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

    What survives: `finalize` turns the summary into the messages that replace the evicted
    ones (default: `default_finalize`, which puts the real user messages, newest first within
    `user_message_budget` tokens — default two thirds of the summary budget, at most three
    quarters — into the summary,
    `user_message_filter` choosing which count). `pin_task` keeps the session's first user
    message verbatim; pins (the task, `cmdc.pinned` messages) are kept within `pin_budget`
    tokens (default a quarter of the token trigger), past which the oldest are summarized
    with an event. `reduce_tokens`: tool results and tool-call arguments longer than this are
    clipped, with a pointer to the journal, in what the summarizer reads. After compacting, if
    a trigger still fires, up to `max_extra_passes` more passes run with a halved keep rule;
    then `CompactionIncomplete` says so, carrying the compacted state. `summarizer_timeout`:
    seconds one summarizer attempt may take (all its chunks); past it the attempt fails with
    `SummarizerTimeout` and is retried and failed over like any other (None: no bound). A
    cut-off answer whose input cannot be cut smaller is not retried (the same request would be
    cut off again). `breaker`: a `SummarizerBreaker`; with a fallback or a failover, a primary
    summarizer that gave up in several compactions in a row is skipped for a while (a
    `summarizer_suspended` event, then a `summarizer_fallback` event per skipped compaction).

    The journal: the evicted messages are written as an uncommitted attempt before the
    summarizer runs; `commit_journal` (the default) commits it when the compaction succeeds.
    An agent passes False and calls `commit(state)` once it has committed the state itself,
    so a compaction whose state is thrown away never shows in the journal.
    """

    __slots__ = (
        "_config_for",
        "_counted",
        "_store",
        "_store_key",
        "breaker",
        "commit_journal",
        "failover",
        "fallbacks",
        "finalize",
        "max_backoff",
        "max_extra_passes",
        "on_event",
        "pin_budget",
        "pin_task",
        "plugins",
        "reduce_tokens",
        "retries",
        "retry_backoff",
        "should_retry",
        "store",
        "summarizer",
        "summarizer_input_tokens",
        "summarizer_timeout",
        "summarizer_window",
        "summary_budget",
        "token_counter",
        "user_message_budget",
        "user_message_filter",
    )

    def __init__(
        self,
        summarizer: Summarizer | None = None,
        *,
        plugins: Iterable[Plugin] = (),
        token_counter: TokenCounter | None = None,
        fallbacks: Sequence[Summarizer] = (),
        retries: int = 3,
        retry_backoff: float = 0.5,
        max_backoff: float = 30.0,
        should_retry: ShouldRetry | None = None,
        failover: Failover | None = None,
        summarizer_input_tokens: int | None = None,
        finalize: Finalize | None = None,
        user_message_budget: int | None = None,
        user_message_filter: Callable[[Message], bool] | None = None,
        pin_task: bool = True,
        pin_budget: int | None = None,
        reduce_tokens: int | None = 2_000,
        summary_budget: int | None = None,
        max_extra_passes: int = 2,
        on_event: EventSink | None = None,
        summarizer_timeout: float | None = 300.0,
        summarizer_window: int | None = None,
        store: str | os.PathLike[str] | Store | None = None,
        commit_journal: bool = True,
        breaker: SummarizerBreaker | None = None,
    ) -> None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ConfigError(f"retries must be an integer >= 0, got {retries!r}")
        if isinstance(retry_backoff, bool) or not isinstance(retry_backoff, (int, float)) or retry_backoff < 0:
            raise ConfigError(f"retry_backoff must be a number >= 0, got {retry_backoff!r}")
        if isinstance(max_backoff, bool) or not isinstance(max_backoff, (int, float)) or max_backoff < 0:
            raise ConfigError(f"max_backoff must be a number >= 0, got {max_backoff!r}")
        for what, value in (
            ("user_message_budget", user_message_budget),
            ("pin_budget", pin_budget),
            ("reduce_tokens", reduce_tokens),
            ("summary_budget", summary_budget),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{what} must be an integer >= 1 or None, got {value!r}")
        if isinstance(max_extra_passes, bool) or not isinstance(max_extra_passes, int) or max_extra_passes < 0:
            raise ConfigError(f"max_extra_passes must be an integer >= 0, got {max_extra_passes!r}")
        if summarizer_timeout is not None and (
            isinstance(summarizer_timeout, bool)
            or not isinstance(summarizer_timeout, (int, float))
            or not 0 < summarizer_timeout < math.inf
        ):
            raise ConfigError(
                f"summarizer_timeout must be a positive number of seconds or None, got {summarizer_timeout}"
            )
        for what, fn in (
            ("should_retry", should_retry),
            ("failover", failover),
            ("finalize", finalize),
            ("user_message_filter", user_message_filter),
        ):
            if fn is not None and not callable(fn):
                raise ConfigError(f"{what} must be callable, got {fn!r}")
        if summarizer_window is not None and (
            isinstance(summarizer_window, bool) or not isinstance(summarizer_window, int) or summarizer_window < 1
        ):
            raise ConfigError(f"summarizer_window must be an integer >= 1 or None, got {summarizer_window!r}")
        if summarizer_input_tokens is not None and (
            isinstance(summarizer_input_tokens, bool)
            or not isinstance(summarizer_input_tokens, int)
            or summarizer_input_tokens < 1
        ):
            raise ConfigError(f"summarizer_input_tokens must be an integer >= 1, got {summarizer_input_tokens!r}")
        for s in (summarizer, *fallbacks):
            if s is not None and not (hasattr(s, "complete") or callable(s)):
                raise ConfigError(f"a summarizer must be a provider or an async callable, got {s!r}")
        self.summarizer: Summarizer = summarizer if summarizer is not None else ExtractiveSummarizer()
        self.fallbacks = tuple(fallbacks)
        self.plugins: tuple[Plugin, ...] = sort_plugins(plugins)
        self.token_counter = token_counter
        self.retries = retries
        self.retry_backoff = float(retry_backoff)
        self.max_backoff = float(max_backoff)
        self.should_retry: ShouldRetry = should_retry or default_should_retry
        self.failover = failover
        self.summarizer_input_tokens = summarizer_input_tokens
        self.finalize: Finalize = finalize or default_finalize
        self.user_message_budget = user_message_budget
        self.user_message_filter = user_message_filter
        self.pin_task = pin_task
        self.pin_budget = pin_budget
        self.reduce_tokens = reduce_tokens
        self.summary_budget = summary_budget
        self.max_extra_passes = max_extra_passes
        self.on_event = on_event
        self.summarizer_timeout = summarizer_timeout
        self.summarizer_window = summarizer_window
        self._config_for: tuple[Mapping[str, Any], CompactConfig] | None = None
        self._counted: tuple[State, int] | None = None  # the last state counted by token_counter
        self._store: OffloadStore | None = None
        # store: where every agent's journal goes (a directory, a postgresql:// URL or a store
        # object); None: each state's compact_offload_dir
        self.store: Store | None = None if store is None else open_store(store)
        self._store_key: Path | None = None
        self.commit_journal = bool(commit_journal)
        if breaker is not None and not isinstance(breaker, SummarizerBreaker):
            raise ConfigError(f"breaker must be a SummarizerBreaker or None, got {breaker!r:.80}")
        self.breaker = breaker

    def add_plugin(self, plugin: Plugin) -> None:
        """Register a plugin (kept in priority order)."""
        self.plugins = sort_plugins((*self.plugins, plugin))

    # -- the decision: O(1) in the history's length ----------------------------------------
    def compact_config(self, state: State) -> CompactConfig:
        """The compaction settings of `state.config` (validated; cached per config object)."""
        cached = self._config_for
        if cached is not None and cached[0] is state.config:
            return cached[1]
        config = _parse_config(state.config)
        self._config_for = (state.config, config)
        if self.store is None:
            self.store_for(config)  # the offload directory is made absolute now, at first use
        return config

    def _sum(self, messages: Sequence[Message]) -> int:
        if self.token_counter is None:  # estimates are cached on the messages
            return sum(m._tokens or estimate_message_tokens(m) for m in messages)
        return sum(self.count(m) for m in messages)

    def count(self, message: Message) -> int:
        """Tokens of one message, by the custom counter if one was given."""
        if self.token_counter is None:
            return estimate_message_tokens(message)
        n = self.token_counter(message)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"token_counter returned {n!r} for message {message.id}; expected an int >= 0")
        return n

    def estimate_tokens(self, state: State) -> int:
        """The context's size: the last reported usage plus estimates of later messages.

        With the default estimator this is `state.token_usage` (kept up to date by `State`).
        A custom counter counts only the messages after the baseline, and for a state that grew
        by appends from the last one counted, only the new messages."""
        if self.token_counter is None:
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

    # -- the action ---------------------------------------------------------------------------
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
        if reason not in ("auto", "forced", "manual"):
            raise ConfigError(f"reason must be 'auto', 'forced' or 'manual', got {reason!r}")
        if instruction is not None and not isinstance(instruction, str):
            raise ConfigError(f"instruction must be a string, got {type(instruction).__name__}")
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise ConfigError(f"window must be an integer >= 1, got {window!r}")
        return await self._compact(state, reason, instruction, window)

    async def clip_tail(self, state: State) -> State | None:
        """When the kept messages alone overflow the model: the trailing tool results longer
        than `reduce_tokens` (default 2,000) are journaled whole, then replaced by their head and
        a pointer to the journal. None when there is nothing to clip."""
        limit = self.reduce_tokens or 2_000
        end = len(state.messages)
        start = end
        while start > 0 and state.messages[start - 1].role == "tool":
            start -= 1
        large = [m for m in state.messages[start:end] if self.count(m) > limit]
        if not large:
            return None
        config = self.compact_config(state)
        store = self.store_for(config)
        written = await store.append(state.agent_id, large, compaction=state.compactions, **_expect(store, state))
        by_id = {m.id: m for m in large}
        pointer = f"the full result is in the journal {written.path}, records {written.first_seq}-{written.last_seq}"
        clipped = []
        for m in state.messages[start:end]:
            if m.id in by_id:
                m = Message.tool_result(
                    m.tool_call_id or "",
                    clip_tokens(m.text, limit, keep="head", marker=_TAIL_MARKER, note=pointer),
                    is_error=m.is_error,
                    metadata={**m.metadata, "cmdc.clipped_from": m.id},
                )
            clipped.append(m)
        messages = (*state.messages[:start], *clipped)
        self._emit(TOOL_RESULTS_CLIPPED, state, clipped=len(large), offload_path=str(written.path))
        return state.evolve(messages=messages, usage_floor=len(messages), **_journal_fields(state, written))

    def store_for(self, config: CompactConfig) -> OffloadStore | Store:
        """The compactor's store, else the journal store of `config.offload_dir`; a relative
        directory is made absolute once, when this compactor first uses it (a later `chdir`
        does not split the journal)."""
        if self.store is not None:
            return self.store
        store = self._store
        if store is None or self._store_key != config.offload_dir:
            store = self._store = shared_store(Path(os.path.abspath(config.offload_dir)))
            self._store_key = config.offload_dir
            if store.on_event is None:
                store.on_event = self.on_event
        return store

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
            await store.commit(state.agent_id, attempts, **_expect(store, state))

    def _emit(self, kind: str, state: State, **data: Any) -> None:
        emit(self.on_event, Event(kind, state.agent_id, data, trio.current_time()))

    def _plugin_error(self, state: State, hook: str) -> Callable[[Plugin, BaseException], None]:
        def report(plugin: Plugin, exc: BaseException) -> None:
            self._emit(PLUGIN_ERROR, state, plugin=plugin.name, hook=hook, error=repr(exc))

        return report

    def _split(
        self,
        state: State,
        config: CompactConfig,
        pinned_ids: Iterable[str] = (),
        *,
        keep: Threshold | None = None,
        unpinned: Iterable[str] = (),
    ) -> Split:
        return split_messages(
            state.messages,
            keep or config.keep,
            context_window=config.context_window,
            count=self.count,
            pinned_ids=frozenset(pinned_ids),
            unpinned_ids=frozenset(unpinned),
            index=state.call_index,
        )

    async def _compact(
        self, state: State, reason: str, instruction: str | None, window: int | None = None
    ) -> Compacted | Skipped:
        """`_passes`, then (with `commit_journal`) the journal commit of the compacted state."""
        try:
            result = await self._passes(state, reason, instruction, window)
        except CompactionIncomplete as exc:
            if self.commit_journal and isinstance(exc.state, State):
                await self._commit_or_fail(exc.state, state, reason)
            raise
        if self.commit_journal and isinstance(result, Compacted):
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

        for _ in range(self.max_extra_passes):
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

    def _task_id(self, state: State, lead: int = 0) -> str | None:
        """The session's first user message: the first non-summary user message."""
        for m in state.messages:
            if m.role == "user" and not m.is_summary:
                return m.id
        return None

    def _split_with_pins(
        self, state: State, config: CompactConfig, keep: Threshold, extra: Iterable[str], window: int | None = None
    ) -> Split:
        task = self._task_id(state) if self.pin_task else None
        pins = {*extra, task} - {None}
        split = self._split(state, config, pins, keep=keep)  # type: ignore[arg-type]
        budget = self.pin_budget if self.pin_budget is not None else _share(config, 4, 20_000, window)
        open_groups = {state.messages[g.index].id for g in state.call_index.open}
        open_results = {state.messages[i].id for g in state.call_index.open for i in g.results}
        pinned = [m for m in split.held if m.id not in open_groups and m.id not in open_results]
        total = sum(self.count(m) for m in pinned)
        if total <= budget:
            return split
        # Over the pin budget: the oldest pins go (the task last) and are summarized instead.
        order = [m for m in pinned if m.id != task] + [m for m in pinned if m.id == task]
        dropped: list[str] = []
        for m in order:
            if total <= budget:
                break
            dropped.append(m.id)
            total -= self.count(m)
        self._emit(PINS_OVER_BUDGET, state, budget=budget, unpinned=tuple(dropped), pinned_tokens=total)
        return self._split(state, config, pins - set(dropped), keep=keep, unpinned=dropped)  # type: ignore[arg-type]

    def budgets(self, config: CompactConfig, window: int | None = None) -> tuple[int, int, int]:
        """(summary budget, preserved user messages' budget, the summarizer's output limit), in
        tokens, for `config` and a window the model reported (see the class docstring)."""
        cap = self.summary_budget if self.summary_budget is not None else SUMMARY_BUDGET
        total = min(cap, max(SUMMARY_FLOOR, _share(config, 4, cap, window)))
        users = total * 2 // 3 if self.user_message_budget is None else min(self.user_message_budget, total * 3 // 4)
        return total, users, max(1, total - users)

    def _skip(self, state: State, why: str) -> Skipped:
        self._emit(COMPACTION_SKIPPED, state, reason=why, skipped_by=None)
        return Skipped(state, why)

    async def _compact_once(
        self, state: State, reason: str, instruction: str | None, keep: Threshold, window: int | None = None
    ) -> Compacted | Skipped:
        started = trio.current_time()
        config = self.compact_config(state)
        budget, user_budget, answer_budget = self.budgets(config, window)
        split = self._split_with_pins(state, config, keep, (), window)
        oversized = tuple(m for m in split.kept if m.is_summary and self.count(m) > budget)
        if oversized:  # a summary over its budget is never kept as it is: it is re-summarized
            split = attrs.evolve(
                split,
                evicted=(*oversized, *split.evicted),
                kept=tuple(m for m in split.kept if m not in oversized),
                held=tuple(m for m in split.held if m not in oversized),
            )
        if not split.evicts_anything and not (
            split.evicted and sum(self.count(m) for m in split.evicted) > budget
        ):  # a summary alone is evicted only when it is over its budget (it is re-summarized)
            return self._skip(state, "nothing can be evicted")
        tokens_before = self.estimate_tokens(state)
        self._emit(COMPACTION_START, state, reason=reason, tokens=tokens_before, messages=len(state.messages))

        split, skipped = await self._before_compact(state, config, split, reason, instruction, keep, window)
        if skipped is not None:
            return skipped
        evicted_tokens = self._sum(split.evicted)
        compaction = state.compactions + 1
        smallest = self.count(_pointer(state, compaction, len(split.evicted), str(self._journal(state, config))))
        if evicted_tokens <= smallest:
            return self._skip(
                state,
                f"the {len(split.evicted)} evictable message(s) ({evicted_tokens} tokens) cost no more than the "
                f"smallest summary that could replace them ({smallest} tokens)",
            )

        # Write-ahead: the evicted messages are durable before anything else happens, as an
        # attempt that becomes visible when the compaction's state is committed.
        store = self.store_for(config)
        try:
            written = await store.append(
                state.agent_id,
                split.evicted,
                compaction=compaction,
                attempt=new_attempt_id(),
                **_expect(store, state),
                commit=False,
            )
        except OffloadError as exc:
            self._emit(COMPACTION_FAILED, state, reason=reason, error=str(exc))
            raise

        # The previous summary goes first, then every other evicted message, large parts clipped.
        # Media become placeholders. The pinned task stays in the context verbatim, so it is
        # not restated: the summary refers to it.
        ordered = _reduced(_summaries_first(state, split.evicted), self.reduce_tokens, written)
        task = self._task_id(state) if self.pin_task else None
        kept_task = task if task is not None and any(m.id == task for m in split.kept) else None
        prompt = config.summary_prompt
        if kept_task is not None:
            prompt += (
                "\n\nThe session's first user message (the task) stays in the context verbatim after "
                "your summary: refer to it, do not restate it."
            )
        if instruction:
            prompt = f"{prompt}\n\nAdditional instruction for this summary: {instruction}"
        try:
            model_window = self.summarizer_window or window or config.context_window
            text, used, attempts = await self._summarize(state, ordered, prompt, answer_budget, model_window)
            context = FinalizeContext(
                summary=text,
                evicted=split.evicted,
                state=state,
                compaction=compaction,
                offload_path=str(written.path),
                first_seq=written.first_seq,
                last_seq=written.last_seq,
                user_message_budget=user_budget,
                user_message_filter=self.user_message_filter,
                kept=split.kept,
                task_id=kept_task,
            )
            try:
                inserted = await run_finalize(self.finalize, context)
            except Exception as exc:
                raise CompactionError(f"the finalizer failed: {type(exc).__name__}: {exc}") from exc
        except CompactionError as exc:
            self._emit(COMPACTION_FAILED, state, reason=reason, error=str(exc))
            raise
        # The contraction rule: what is inserted fits the budget and costs less than what it replaces.
        pointer = _pointer(
            state, compaction, len(split.evicted), str(written.path), written.first_seq, written.last_seq
        )
        inserted, fallback = self._contract(inserted, min(budget, evicted_tokens - 1), pointer)
        if fallback is not None:
            self._emit(
                COMPACTION_FALLBACK,
                state,
                fallback=fallback,
                budget=budget,
                evicted_tokens=evicted_tokens,
                summary_tokens=sum(self.count(m) for m in inserted),
            )
        if fallback == "skipped":  # not even a pointer is smaller (a custom counter's quirk)
            return self._skip(state, "not even a pointer-only summary is smaller than the evicted messages")
        # Kept messages older than everything evicted (the pinned task) stay before the summary.
        before = _held_before_evicted(state, split)
        messages = (*split.pinned, *split.kept[:before], *_tag_summaries(inserted, written), *split.kept[before:])
        new_state = state.evolve(
            messages=messages, compactions=compaction, usage_floor=len(messages), **_journal_fields(state, written)
        )
        report = CompactionReport(
            reason=reason,
            tokens_before=tokens_before,
            tokens_after=self.estimate_tokens(new_state),
            messages_before=len(state.messages),
            messages_after=len(messages),
            evicted=len(split.evicted),
            offload_path=str(written.path),
            first_seq=written.first_seq,
            last_seq=written.last_seq,
            compaction=compaction,
            summary_tokens=sum(self.count(m) for m in inserted),
            summarizer=used,
            attempts=attempts,
            duration=trio.current_time() - started,
            summary_budget=budget,
            fallback=fallback,
        )
        after = await self._after_compact(new_state, report)
        if after is not new_state:
            new_state = after
            report = attrs.evolve(report, tokens_after=self.estimate_tokens(after), messages_after=len(after.messages))
        report = attrs.evolve(report, duration=trio.current_time() - started)
        self._emit(COMPACTION_END, state, report=report)
        return Compacted(new_state, report)

    async def _before_compact(
        self,
        state: State,
        config: CompactConfig,
        split: Split,
        reason: str,
        instruction: str | None,
        keep: Threshold,
        window: int | None,
    ) -> tuple[Split, Skipped | None]:
        if not any(p.implements("before_compact") for p in self.plugins):
            return split, None
        offered = {m.id for m in split.evicted}

        ctx = BeforeCompact(state, split.evicted, split.kept, reason, instruction)
        folded = await fold(
            self.plugins,
            "before_compact",
            ctx,
            split.evicted,
            rebind=lambda c, evicted: attrs.evolve(c, evicted=evicted),
            on_error=self._plugin_error(state, "before_compact"),
        )
        if isinstance(folded.stop, Abort):
            self._emit(COMPACTION_SKIPPED, state, reason=folded.stop.reason, skipped_by=folded.stopped_by)
            raise CompactionAborted(f"plugin {folded.stopped_by} aborted the compaction: {folded.stop.reason}")
        if folded.stop is not None:
            self._emit(COMPACTION_SKIPPED, state, reason=folded.stop.reason, skipped_by=folded.stopped_by)
            return split, Skipped(state, folded.stop.reason or "skipped by a plugin", folded.stopped_by)
        chosen = {m.id for m in folded.value}
        if chosen != offered:
            # Keep what the plugins took out, and re-close the call groups around it.
            split = self._split_with_pins(state, config, keep, offered - chosen, window)
            if not split.evicts_anything:
                why = "plugins left nothing to evict"
                self._emit(COMPACTION_SKIPPED, state, reason=why, skipped_by=None)
                return split, Skipped(state, why)
        return split, None

    async def _after_compact(self, state: State, report: CompactionReport) -> State:
        folded = await fold(
            self.plugins,
            "after_compact",
            AfterCompact(state, report),
            state,
            rebind=lambda c, s: attrs.evolve(c, state=s),
            on_error=self._plugin_error(state, "after_compact"),
        )
        result = folded.value
        if folded.stop is not None:  # too late to veto: the offload has happened
            self._emit(
                PLUGIN_ERROR,
                state,
                plugin=folded.stopped_by,
                hook="after_compact",
                error=f"{type(folded.stop).__name__} ignored after compaction: {folded.stop.reason}",
            )
        if result is not state:
            # No reply has come since the compaction: every reported usage in it is stale.
            result = result.evolve(
                usage_floor=len(result.messages),
                compactions=state.compactions,
                journal_id=state.journal_id,
                journal_seq=state.journal_seq,
            )
        return result

    def _journal(self, state: State, config: CompactConfig) -> str:
        store = self.store_for(config)
        if isinstance(store, OffloadStore):
            return str(store.path_for(state.agent_id))
        return store.location(state.agent_id)

    def _shrunk(self, message: Message, room: int) -> Message | None:
        """`message` with its text clipped so that it counts at most `room` tokens, or None."""
        cost = self.count(message)
        if cost <= room:
            return message
        # A summary's header (where the evicted messages went) is kept whole; its body is clipped.
        head, sep, text = message.text.partition("\n\n") if message.is_summary else ("", "", message.text)
        if not sep:
            head, text = "", message.text
        target = room - (cost - estimate_text_tokens(text)) - 1
        for _ in range(4):
            if target < _MIN_SUMMARY_TEXT:
                return None
            clipped = message.evolve(content=head + sep + clip_tokens(text, target, note=_CLIPPED_NOTE))
            got = self.count(clipped)
            if got <= room:
                return clipped
            target = target * room // max(1, got) - 1
        return None

    def _contract(self, inserted: list[Message], limit: int, pointer: Message) -> tuple[list[Message], str | None]:
        """The inserted messages within `limit` tokens, stepping down as needed: (messages, the
        fallback used or None). "clipped": the summary message clipped; "summary only": other
        inserted messages dropped and the summary clipped; "pointer only": a summary that only
        names the journal records; "skipped": not even that fits."""
        cost = sum(self.count(m) for m in inserted)
        if cost <= limit:
            return inserted, None
        at = next((i for i, m in enumerate(inserted) if m.is_summary), None)
        if at is not None:
            shrunk = self._shrunk(inserted[at], limit - (cost - self.count(inserted[at])))
            if shrunk is not None:
                return [*inserted[:at], shrunk, *inserted[at + 1 :]], "clipped"
            alone = inserted[at].evolve(
                metadata={k: v for k, v in inserted[at].metadata.items() if k != USER_MESSAGES_KEY}
            )
            shrunk = self._shrunk(alone, limit)
            if shrunk is not None and len(inserted) > 1:
                return [shrunk], "summary only"
        if self.count(pointer) <= limit:
            return [pointer], "pointer only"
        return inserted, "skipped"

    async def _summarize(
        self,
        state: State,
        messages: Sequence[Message],
        prompt: str,
        max_tokens: int | None = None,
        window: int | None = None,
    ) -> tuple[str, str, int]:
        """Retries, fallbacks, failover: the text, the summarizer that wrote it, attempts used.
        Every answer is bounded by `max_tokens`; a model's request fits `window`."""
        tries = _Tries(self, state, prompt, max_tokens, window)
        breaker = self.breaker if self.fallbacks or self.failover is not None else None
        suspended: str | None = None
        if breaker is not None and not breaker.admit():
            result = None
            suspended = (
                f"{summarizer_name(self.summarizer)}: suspended after failing {breaker.failures} compactions "
                f"in a row ({breaker.skipping} more skip it)"
            )
        else:
            result = await tries.run("primary", self.summarizer, messages, self.retries)
            if breaker is not None and breaker.record(result is not None):
                self._emit(
                    SUMMARIZER_SUSPENDED,
                    state,
                    summarizer=summarizer_name(self.summarizer),
                    failures=breaker.failures,
                    compactions=breaker.suspended_for,
                    error=None if tries.last is None else _describe(tries.last),
                )
        if result is None and suspended is None:
            tries.primary_failed = tries.last
        for fallback in self.fallbacks:
            if result is not None:
                break
            result = await tries.run("failover", fallback, messages, self.retries)
        if result is None and self.failover is not None:
            for _ in range(self.retries + 1):
                try:
                    choice = self.failover(tries.last)
                    if inspect.isawaitable(choice):
                        choice = await choice
                    if choice is None:
                        break
                    summarizer, inputs = choice
                    inputs = list(inputs)
                except Exception as exc:
                    raise SummarizerError(f"the failover callable failed: {type(exc).__name__}: {exc}") from exc
                result = await tries.run("failover", summarizer, inputs, 0)
                if result is not None:
                    break
        if result is None:
            last = tries.last
            why = "no summarizer was tried" if last is None else _describe(last)
            raise SummarizerError(f"every summarizer attempt failed ({tries.count} attempts); last: {why}")
        if tries.primary_failed is not None or suspended is not None:
            error = suspended if tries.primary_failed is None else _describe(tries.primary_failed)
            self._emit(SUMMARIZER_FALLBACK, state, summarizer=result[1], attempts=tries.count, error=error)
        return result[0], result[1], tries.count


def _expect(store: object, state: State) -> dict[str, Any]:
    """The journal identity `state` expects: every store checks it before appending or
    committing (the store protocol's `expect`)."""
    return {"expect": JournalRef(state.journal_id, state.journal_seq)}


def _journal_fields(state: State, written: AppendResult) -> dict[str, Any]:
    """The state's journal identity after `written`: its journal, the last record it names."""
    return {"journal_id": written.journal, "journal_seq": max(state.journal_seq, written.last_seq)}


def _tag_summaries(inserted: Sequence[Message], written: AppendResult) -> tuple[Message, ...]:
    """The summary messages carry the journal's identity and the attempts to commit with them."""
    tags = {JOURNAL_KEY: written.journal, ATTEMPTS_KEY: list(written.pending)}
    return tuple(m.evolve(metadata={**m.metadata, **tags}) if m.is_summary else m for m in inserted)


_STORES: weakref.WeakValueDictionary[Path, OffloadStore] = weakref.WeakValueDictionary()


def shared_store(root: Path) -> OffloadStore:
    """One `OffloadStore` per directory for every compactor of the process, so the journals'
    locks and sequence numbers are shared (it lives while a compactor holds it)."""
    store = _STORES.get(root)
    if store is None:
        store = _STORES[root] = OffloadStore(root)
    return store


_PARSED: dict[int, tuple[Mapping[str, Any], CompactConfig]] = {}


def _parse_config(config: Mapping[str, Any]) -> CompactConfig:
    """`CompactConfig.from_mapping`, shared by every compactor that sees the same (immutable)
    config object: agents spawned with one config parse it once. A small, bounded cache."""
    hit = _PARSED.get(id(config))
    if hit is not None and hit[0] is config:
        return hit[1]
    parsed = CompactConfig.from_mapping(config)
    if len(_PARSED) >= 256:
        _PARSED.clear()
    _PARSED[id(config)] = (config, parsed)
    return parsed


@attrs.frozen
class SummaryAttempt:
    """One summarizer call, as `should_retry` and `failover` see it."""

    number: int
    summarizer: str
    role: str  # "primary" or "failover"
    answer: str | None
    error: BaseException | None
    messages: Sequence[Message] = attrs.field(repr=False, default=())
    stop_reason: str | None = None
    prompt: str = attrs.field(repr=False, default="")

    @property
    def clipped(self) -> bool:
        """True when the answer was over its output budget and was clipped (`ANSWER_MARKER`)."""
        return self.answer is not None and "bytes of the summarizer's answer clipped" in self.answer

    @property
    def truncated(self) -> bool:
        """True when the model stopped on its output limit or a full window (`length`,
        `max_tokens`): the answer was cut off, not finished."""
        return self.stop_reason in TRUNCATED_STOPS

    @property
    def missing(self) -> list[str]:
        """The sections the prompt asked for (its `## ` headings) that the answer lacks."""
        return missing_sections(self.answer or "", self.prompt)

    @property
    def off_task(self) -> bool:
        """True when the prompt asks for sections and the answer has fewer than half of them
        (a small model answering the conversation instead of summarizing it)."""
        asked = missing_sections("", self.prompt)
        return bool(asked) and len(self.missing) * 2 > len(asked)


ShouldRetry = Callable[[SummaryAttempt], bool]
Failover = Callable[
    [SummaryAttempt | None],
    "tuple[Summarizer, Sequence[Message]] | Awaitable[tuple[Summarizer, Sequence[Message]] | None] | None",
]


def default_should_retry(attempt: SummaryAttempt) -> bool:
    """Unusable: an error, an empty answer, an answer cut off by its output limit or a full
    window (`attempt.truncated`), or a model's answer without the structure its prompt asked
    for (`attempt.off_task`: fewer than half of the prompt's `## ` sections). "A model's
    answer" is a provider reply that says how it stopped (every HTTP provider does); a callable
    summarizer, or a test double that reports no stop reason, is judged on errors and
    emptiness alone. Any other answer is used."""
    return (
        attempt.error is not None
        or not (attempt.answer or "").strip()
        or attempt.truncated
        or (attempt.stop_reason is not None and attempt.off_task)
    )


def _describe(attempt: SummaryAttempt) -> str:
    if attempt.error is not None:
        return f"{attempt.summarizer}: {type(attempt.error).__name__}: {attempt.error}"
    if not (attempt.answer or "").strip():
        return f"{attempt.summarizer}: returned an empty summary"
    if attempt.truncated:
        return f"{attempt.summarizer}: the answer was cut off (stop reason {attempt.stop_reason!r})"
    if attempt.stop_reason is not None and attempt.off_task:
        return f"{attempt.summarizer}: the answer lacks the sections asked for ({', '.join(attempt.missing)})"
    return f"{attempt.summarizer}: answer judged unusable by should_retry"


class _Tries:
    """Runs summarizer attempts for one compaction, counting them and emitting an event each."""

    def __init__(
        self,
        compactor: Compactor,
        state: State,
        prompt: str,
        max_tokens: int | None = None,
        window: int | None = None,
    ) -> None:
        self.compactor, self.state, self.prompt, self.max_tokens = compactor, state, prompt, max_tokens
        self.window = window  # the summarizing model's context window, when known
        if window is not None and max_tokens is not None and max_tokens > max(1, window // 4):
            self.max_tokens = max(1, window // 4)  # the output counts against the window: a quarter at most
        self.primary_failed: SummaryAttempt | None = None  # the primary's last attempt, if it gave up
        self.count = 0
        self.last: SummaryAttempt | None = None

    def input_room(self) -> int | None:
        """How many (estimated) tokens of transcript fit one request to a summarizing model:
        its window less the output budget, the instruction and a margin for the estimate's
        error and the chat template (15% and 32 tokens). None when the window is unknown."""
        if self.window is None:
            return None
        fixed = (self.max_tokens or 0) + estimate_text_tokens(self.prompt) + 32
        return max(1, int((self.window - fixed) * 0.85))

    def _emit(self, name: str, role: str, **data: Any) -> None:
        self.compactor._emit(SUMMARIZER_ATTEMPT, self.state, summarizer=name, role=role, attempt=self.count, **data)

    async def run(
        self, role: str, summarizer: Summarizer, messages: Sequence[Message], retries: int
    ) -> tuple[str, str] | None:
        """Up to `retries + 1` attempts with backoff. A `ContextOverflow` is not a failure while
        the input can still be cut smaller: the chunks are halved (to at most half the reported
        window) and the call is made again at once, O(log n) times."""
        c = self.compactor
        name = summarizer_name(summarizer)
        chunk = c.summarizer_input_tokens
        room = None if callable(summarizer) else self.input_room()
        # The input's size, from the estimates cached on the messages (needed for a model's room)
        whole = sum(m._tokens or estimate_message_tokens(m) for m in messages) if room is not None else 0
        if room is not None and whole > room:
            # Room for the summary: the input plus the output budget must fit the model's window.
            # Past it, chunks, each leaving room for the partial summary rolled into the next.
            chunk = max(1, min(chunk or room, room - (self.max_tokens or 0)))
        fitted = False
        retry = 0
        while retry <= retries:
            self.count += 1
            answer: str | None = None
            error: BaseException | None = None
            stop: str | None = None
            try:
                with trio.fail_after(c.summarizer_timeout or math.inf):
                    answer, stop = await summarize_chunks(summarizer, messages, self.prompt, chunk, self.max_tokens)
            except trio.TooSlowError:
                error = SummarizerTimeout(f"{name}: no answer within summarizer_timeout={c.summarizer_timeout} s")
            except ContextOverflow as exc:
                error = exc
                if exc.limit and self.max_tokens is not None and self.max_tokens > max(1, exc.limit // 4):
                    # The output limit counts against the summarizer's window: a quarter of it at most.
                    self.max_tokens = max(1, exc.limit // 4)
                    self._emit(name, role, ok=False, error=str(exc), output_tokens=self.max_tokens)
                    continue
                size = chunk or whole or estimate_tokens_from_messages(messages)
                smaller = size // 2
                if exc.limit:
                    smaller = min(smaller, exc.limit // 2)
                    cap = max(_MIN_SUMMARY_TEXT, exc.limit // 4)
                    if not fitted and largest_message(messages) > cap:
                        # One message alone is too large for the summarizer (a huge summary or
                        # paste): every message is cut to a quarter of its window (whole in the journal).
                        messages, fitted = [_within(m, cap) for m in messages], True
                        chunk = min(size, exc.limit // 2)
                        self._emit(name, role, ok=False, error=str(exc), chunk_tokens=chunk)
                        continue
                if 1 <= smaller < size and largest_message(messages) <= smaller * 2:
                    chunk = smaller
                    self._emit(name, role, ok=False, error=str(exc), chunk_tokens=chunk)
                    continue
            except Exception as exc:
                error = exc
            attempt = SummaryAttempt(self.count, name, role, answer, error, messages, stop, self.prompt)
            self.last = attempt
            try:
                unusable = bool(c.should_retry(attempt))
            except Exception as exc:  # a broken predicate: count the attempt as unusable
                unusable = True
                error = error or exc
            usable = not unusable and answer is not None and bool(answer.strip())
            self._emit(name, role, ok=usable, error=None if usable else _describe(attempt))
            if usable:
                assert answer is not None
                return answer, name
            if not unusable and error is not None:
                return None  # the predicate says this error is not worth retrying
            if attempt.truncated and error is None:
                # Cut off: the next attempt reads smaller chunks (a shorter partial each time).
                whole = whole or estimate_tokens_from_messages(messages)
                size = chunk or whole
                smaller, largest = size // 2, largest_message(messages)
                if 1 <= smaller < size and largest < size and largest <= smaller * 2:
                    chunk = smaller
                else:
                    return None  # no smaller input to give it: the same request would be cut off again
            if retry < retries and c.retry_backoff:
                await trio.sleep(min(c.max_backoff, c.retry_backoff * 2**retry))
            retry += 1
        return None


SUMMARY_BUDGET = 20_000
"""The default absolute cap on what one compaction inserts, in tokens (see `Compactor`)."""

SUMMARY_FLOOR = 256
"""No share of a small trigger or window takes the summary budget below this (tokens)."""

_MIN_SUMMARY_TEXT = 32  # a summary clipped below this many tokens says too little: step down
_CLIPPED_NOTE = "; the evicted messages are whole in the journal"


def _pointer(
    state: State, compaction: int, evicted: int, path: str, first: int = 10**12, last: int = 10**12
) -> Message:
    """The smallest summary: it only says where the evicted messages went (the default record
    numbers are wider than any real ones, so its cost is an upper bound before the offload)."""
    return pointer_message(compaction=compaction, evicted=evicted, offload_path=path, first_seq=first, last_seq=last)


def _share(config: CompactConfig, divisor: int, fallback: int, window: int | None = None) -> int:
    """A budget as a share of the smallest of the token trigger and the context windows known
    (configured, or reported by the model), else `fallback`."""
    bases = [b for b in (config.token_trigger, config.context_window, window) if b]
    return max(1, min(bases) // divisor) if bases else fallback


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


def _reduced(messages: Sequence[Message], limit: int | None, written: AppendResult) -> Sequence[Message]:
    """What the summarizer reads: media as placeholders naming the part, tool results and
    tool-call arguments longer than `limit` tokens cut to a head with a pointer to the journal
    (which holds them whole)."""
    where = f"journal {written.path}, records {written.first_seq}-{written.last_seq}"
    # One pass over the cached encodings: only a message that may hold media (a data URL, or
    # long enough for a base64 run) is looked at closely, only a large one is clipped.
    out: list[Message] | None = None
    large: list[int] = []
    cap = limit if limit is not None else 1 << 62
    for i, m in enumerate(messages):
        tokens = m._tokens or estimate_message_tokens(m)
        if tokens < _MEDIA_MIN_TOKENS:  # too small for an image part or a base64 run
            continue
        encoded = m.to_json()
        if b"base64," in encoded or may_hold_base64(encoded):
            plain = without_media(m, where)
            if plain is not m:
                if out is None:
                    out = list(messages)
                out[i] = m = plain
                tokens = estimate_message_tokens(m)
        if tokens > cap:
            large.append(i)
    if out is not None:
        messages = out
    if not large:
        return messages
    assert limit is not None
    pointer = f"the full text is in the {where}"
    out = list(messages)
    for i in large:
        m = out[i]
        if m.role == "tool":
            out[i] = m.evolve(content=clip_tokens(m.text, limit, keep="head", marker=_INPUT_MARKER, note=pointer))
        elif m.tool_calls:
            calls = tuple(
                attrs.evolve(c, arguments={k: _clip_value(v, limit, pointer) for k, v in c.arguments.items()})
                for c in m.tool_calls
            )
            out[i] = m.evolve(tool_calls=calls)
        elif not m.is_summary:  # a huge user or assistant message: head and tail
            out[i] = m.evolve(content=clip_tokens(m.text, limit * 4, note=f"; {pointer}"))
    return out


# A message below this estimate holds no image part and no base64 run worth a placeholder.
_MEDIA_MIN_TOKENS = min(IMAGE_TOKENS, MEDIA_MIN_BYTES // 4)

_TAIL_MARKER = "\n[… {omitted} more bytes clipped to fit the context; {note}]"
_INPUT_MARKER = "\n[… {omitted} more bytes clipped; {note}]"


def _within(message: Message, cap: int) -> Message:
    """`message` cut to about `cap` tokens for a summarizer's window (a summary keeps its header)."""
    if estimate_message_tokens(message) <= cap:
        return message
    note = "; whole in the journal"
    head, sep, body = message.text.partition("\n\n") if message.is_summary else ("", "", message.text)
    if not sep:
        head, body = "", message.text
    room = max(16, cap - estimate_message_tokens(Message.user(head)) - 16)
    calls = tuple(
        attrs.evolve(c, arguments={k: _clip_value(v, max(16, cap // 4), note) for k, v in c.arguments.items()})
        for c in message.tool_calls
    )
    return message.evolve(content=head + sep + clip_tokens(body, room, note=note), tool_calls=calls)


def _clip_value(value: Any, limit: int, pointer: str) -> Any:
    if isinstance(value, str):
        return clip_tokens(value, limit, keep="head", marker=_INPUT_MARKER, note=pointer)
    return value


def largest_message(messages: Sequence[Message]) -> int:
    return max((estimate_message_tokens(m) for m in messages), default=0)


def _held_before_evicted(state: State, split: Split) -> int:
    """How many of `split.kept` come before the first evicted message: held messages (the
    pinned task) older than everything the summary replaces, which stay before it."""
    held = {m.id for m in split.held}
    n, i = 0, len(split.pinned)
    while i < len(state.messages) and state.messages[i].id in held:
        n, i = n + 1, i + 1
    return n


def _summaries_first(state: State, evicted: tuple[Message, ...]) -> Sequence[Message]:
    """`evicted` with earlier summaries first. A summary sits right after the pinned system
    messages, so it is usually first already; only otherwise is the list reordered."""
    summaries = [state.messages[i] for i in state.call_index.summaries]
    if not summaries or (len(summaries) == 1 and evicted and evicted[0] is summaries[0]):
        return evicted
    ids = {m.id for m in summaries}
    return [m for m in evicted if m.id in ids] + [m for m in evicted if m.id not in ids]
