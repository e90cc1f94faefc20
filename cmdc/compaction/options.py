"""The `Compactor`'s options: one frozen, validated attrs class, and the budgets they imply.

`CompactorOptions` is the one list of the compactor's options: every option is declared once,
as a field here, and checked when the class is built (a malformed value raises `ConfigError`
naming the option and the value). `Compactor(...)` takes the same keywords because its
`__init__` is typed by `takes_options` as this class's (attrs-made) `__init__`: mypy checks a
`Compactor(...)` call against these fields, so a misspelt or mistyped keyword is a type error.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any, Concatenate, ParamSpec

import attrs

from .._check import function, integer, optional_integer, optional_seconds, seconds, validator
from ..errors import ConfigError, InvalidPlugin
from ..events import EventSink
from ..message import Message
from ..plugins import Plugin, sort_plugins
from ..store import Store, open_store
from ..tokens import TokenCounter
from .attempts import Failover, ShouldRetry, default_should_retry
from .breaker import SummarizerBreaker
from .config import CompactConfig
from .finalize import Finalize, default_finalize
from .ledger import Ledger, rendered_size
from .summary import ExtractiveSummarizer, Summarizer

SUMMARY_BUDGET = 20_000
"""The default absolute cap on what one compaction inserts, in tokens (see `Compactor`)."""

SUMMARY_FLOOR = 256
"""No share of a small trigger or window takes the summary budget below this (tokens)."""


_count = partial(validator, integer, "{}")
_optional_count = partial(validator, optional_integer, "{}")


def _callable(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        function(value, attribute.name)


def _summarizer(value: Any, what: str) -> None:
    if not (hasattr(value, "complete") or callable(value)):
        raise ConfigError(f"a summarizer must be a provider or an async callable, got {value!r:.80} ({what})")


def _primary(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    _summarizer(value, attribute.name)


def _fallbacks(_: Any, attribute: attrs.Attribute[Any], value: tuple[Any, ...]) -> None:
    for s in value:
        _summarizer(s, attribute.name)


def _breaker(_: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, SummarizerBreaker):
        raise ConfigError(f"breaker must be a SummarizerBreaker or None, got {value!r:.80}")


def _default_summarizer(value: Summarizer | None) -> Summarizer:
    return ExtractiveSummarizer() if value is None else value


def _default_finalize(value: Finalize | None) -> Finalize:
    return default_finalize if value is None else value


def _default_retry(value: ShouldRetry | None) -> ShouldRetry:
    return default_should_retry if value is None else value


def _store(value: str | os.PathLike[str] | Store | None) -> Store | None:
    return None if value is None else open_store(value)


def _sequence(value: Iterable[Summarizer]) -> tuple[Summarizer, ...]:
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError
        return tuple(value)
    except TypeError:
        raise ConfigError(f"fallbacks must be a sequence of summarizers, got {value!r:.80}") from None


def _plugins(value: Iterable[Plugin]) -> tuple[Plugin, ...]:
    if isinstance(value, (str, bytes, Plugin)) or not isinstance(value, Iterable):
        raise InvalidPlugin(f"plugins must be a sequence of cmdc.Plugin, got {value!r:.80}")
    return sort_plugins(value)


def _optional_bool(value: bool | None) -> bool | None:
    return None if value is None else _bool(value)


def _bool(value: bool) -> bool:
    return bool(value)


@attrs.frozen(kw_only=True)
class CompactorOptions:
    """Everything a `Compactor` is configured with, checked when built (`attrs.evolve(options,
    ...)` checks the changed values again). Only `summarizer` may be given by position.

    `plugins`: compaction plugins (`cmdc.Plugin`), kept in run order (`priority`, then as given).

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
    `store`: where every agent's journal goes (a directory, a `postgresql://` URL or a store
    object; None: each state's `compact_offload_dir`). `commit_journal`: see `Compactor`.
    `warm_cache`: ask a model summarizer on the agent's cached prefix (`cmdc.compaction.warm`:
    the agent's context plus the instruction as a last user message, falling back to the
    transcript request when that would not fit the window); None (default): only when the
    summarizer is the agent's own provider; False: never.
    """

    summarizer: Summarizer = attrs.field(default=None, converter=_default_summarizer, validator=_primary, kw_only=False)
    plugins: tuple[Plugin, ...] = attrs.field(default=(), converter=_plugins)
    fallbacks: tuple[Summarizer, ...] = attrs.field(default=(), converter=_sequence, validator=_fallbacks)
    token_counter: TokenCounter | None = attrs.field(default=None, validator=_callable)
    retries: int = attrs.field(default=3, validator=_count(minimum=0))
    retry_backoff: float = attrs.field(default=0.5, validator=validator(seconds, "{}", zero=True))
    max_backoff: float = attrs.field(default=30.0, validator=validator(seconds, "{}", zero=True))
    should_retry: ShouldRetry = attrs.field(default=None, converter=_default_retry, validator=_callable)
    failover: Failover | None = attrs.field(default=None, validator=_callable)
    summarizer_input_tokens: int | None = attrs.field(default=None, validator=_optional_count())
    finalize: Finalize = attrs.field(default=None, converter=_default_finalize, validator=_callable)
    user_message_budget: int | None = attrs.field(default=None, validator=_optional_count())
    user_message_filter: Callable[[Message], bool] | None = attrs.field(default=None, validator=_callable)
    pin_task: bool = attrs.field(default=True, converter=_bool)
    pin_budget: int | None = attrs.field(default=None, validator=_optional_count())
    reduce_tokens: int | None = attrs.field(default=2_000, validator=_optional_count())
    summary_budget: int | None = attrs.field(default=None, validator=_optional_count())
    max_extra_passes: int = attrs.field(default=2, validator=_count(minimum=0))
    on_event: EventSink | None = attrs.field(default=None, validator=_callable)
    summarizer_timeout: float | None = attrs.field(default=300.0, validator=validator(optional_seconds, "{}"))
    summarizer_window: int | None = attrs.field(default=None, validator=_optional_count())
    store: Store | None = attrs.field(default=None, converter=_store)
    commit_journal: bool = attrs.field(default=True, converter=_bool)
    breaker: SummarizerBreaker | None = attrs.field(default=None, validator=_breaker)
    warm_cache: bool | None = attrs.field(default=None, converter=_optional_bool)

    def budgets(self, config: CompactConfig, window: int | None = None) -> tuple[int, int, int]:
        """(summary budget, preserved user messages' budget, the summarizer's output limit), in
        tokens, for `config` and a window the model reported (see `Compactor`)."""
        cap = self.summary_budget if self.summary_budget is not None else SUMMARY_BUDGET
        total = min(cap, max(SUMMARY_FLOOR, share(config, 4, cap, window)))
        users = total * 2 // 3 if self.user_message_budget is None else min(self.user_message_budget, total * 3 // 4)
        return total, users, max(1, total - users)

    def pin_limit(self, config: CompactConfig, window: int | None = None) -> int:
        """How many tokens the pins may take (default a quarter of the trigger or window)."""
        return self.pin_budget if self.pin_budget is not None else share(config, 4, 20_000, window)


P = ParamSpec("P")


def takes_options(
    options: Callable[P, CompactorOptions],
) -> Callable[[Callable[..., None]], Callable[Concatenate[Any, P], None]]:
    """Give an `__init__(self, *args, **keywords)` the parameters of `options` (the
    `CompactorOptions` class) for type checkers, and its signature for `help()` and
    `inspect`: the options are declared once, on `CompactorOptions`, and a call with an unknown
    or mistyped keyword is a mypy error."""
    params = list(inspect.signature(options).parameters.values())
    self = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)

    def wrap(init: Callable[..., None]) -> Callable[Concatenate[Any, P], None]:
        init.__signature__ = inspect.Signature([self, *params], return_annotation=None)  # type: ignore[attr-defined]
        return init

    return wrap


def ledger_shares(total: int, users: int, answer: int, ledger: Ledger, cap: int | None = None) -> tuple[int, int]:
    """(preserved user messages' budget, the summarizer's output limit) once the session ledger
    has its room out of the summary budget `total`: the answer keeps its own budget up to half
    of what the ledger leaves, the user messages (a smaller explicit budget stays) the rest
    (the ledger holds what the user stated: the user messages repeat much of it). With `cap`
    (what a small eviction allows the whole summary), the user messages also fit in what the
    ledger leaves of it (an answer past it is clipped from its end, after the ledger)."""
    if not (ledger.entries or ledger.demoted):
        return users, answer
    ledger_tokens = (rendered_size(ledger) + 3) // 4  # estimate_text_tokens(render(ledger)), not built
    left = max(2, total - ledger_tokens - 4)
    kept = min(users, left - min(answer, left // 2))
    if cap is not None:
        kept = min(kept, max(0, (cap - ledger_tokens - 4) * 2 // 3))
    return kept, max(1, min(answer, left - kept))


def share(config: CompactConfig, divisor: int, fallback: int, window: int | None = None) -> int:
    """A budget as a share of the smallest of the token trigger and the context windows known
    (configured, or reported by the model), else `fallback`."""
    bases = [b for b in (config.token_trigger, config.context_window, window) if b]
    return max(1, min(bases) // divisor) if bases else fallback
