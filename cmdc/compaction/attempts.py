"""Getting a summary: attempts with retries and backoff, then the fallback summarizers, then
the failover callable. Each attempt is judged by `should_retry` and reported as an event."""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..errors import ContextOverflow, SummarizerError, SummarizerTimeout
from ..events import SUMMARIZER_ATTEMPT, SUMMARIZER_FALLBACK, SUMMARIZER_SUSPENDED
from ..message import Message, TokenUsage
from ..providers.base import STOP_REASON_KEY, ModelRequest, Provider
from ..tokens import estimate_message_tokens, estimate_text_tokens, estimate_tokens_from_messages
from .clip import MIN_SUMMARY_TEXT, largest_message, within
from .summary import (
    TRUNCATED_STOPS,
    Summarizer,
    bound_answer,
    missing_sections,
    summarize_chunks,
    summarizer_name,
)
from .warm import record_usage

if TYPE_CHECKING:
    from .options import CompactorOptions

_WARM = "warm"  # the role of a summarizer request made on the agent's own cached context


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
Emit = Callable[..., None]  # emit(kind, **data): an event of the compaction


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


def describe(attempt: SummaryAttempt) -> str:
    """Why `attempt` was not used, in one line."""
    if attempt.error is not None:
        return f"{attempt.summarizer}: {type(attempt.error).__name__}: {attempt.error}"
    if not (attempt.answer or "").strip():
        return f"{attempt.summarizer}: returned an empty summary"
    if attempt.truncated:
        return f"{attempt.summarizer}: the answer was cut off (stop reason {attempt.stop_reason!r})"
    if attempt.stop_reason is not None and attempt.off_task:
        return f"{attempt.summarizer}: the answer lacks the sections asked for ({', '.join(attempt.missing)})"
    return f"{attempt.summarizer}: answer judged unusable by should_retry"


@attrs.frozen
class Summary:
    """A usable answer: its text, the summarizer that wrote it, the attempts it took, and the
    primary's last unusable attempt when a fallback or the failover wrote it."""

    text: str
    summarizer: str
    attempts: int
    primary_failed: SummaryAttempt | None = None
    usage: TokenUsage | None = None  # every summarizer request's, summed (None: none reported)
    warm: bool = False  # written on the agent's cached prefix (`cmdc.compaction.warm`)


async def summarize(
    options: CompactorOptions,
    messages: Sequence[Message],
    prompt: str,
    emit: Emit,
    max_tokens: int | None = None,
    window: int | None = None,
    warm: ModelRequest | None = None,
) -> Summary:
    """The primary with retries (unless its breaker is open), then each fallback with the same
    retries, then the failover (at most `retries + 1` times). With `warm` (a request on the
    agent's cached prefix, `cmdc.compaction.warm`), the primary's attempts are that request;
    only an overflow sends the rest of them to the cold request (the instruction and a
    transcript). Every answer is bounded by `max_tokens`; a model's request
    fits `window`. Raises `SummarizerError` when every attempt failed."""
    tries = Attempts(options, prompt, emit, max_tokens, window)
    breaker = options.breaker if options.fallbacks or options.failover is not None else None
    primary = summarizer_name(options.summarizer)
    skipped: str | None = None  # why the primary was not asked (its breaker is open)
    primary_failed: SummaryAttempt | None = None
    hot = False  # the primary's answer came on the warm cache
    if breaker is not None and not breaker.admit():
        result = None
        skipped = (
            f"{primary}: suspended after failing {breaker.failures} compactions in a row "
            f"({breaker.skipping} more skip it)"
        )
    else:
        made, hot = 0, False
        if warm is not None and not callable(options.summarizer):
            result, made = await tries.run_warm(options.summarizer, warm, options.retries)
            hot = result is not None
        if warm is None or (made <= options.retries and result is None):
            result = await tries.run("primary", options.summarizer, messages, options.retries - made)
        if result is None:
            primary_failed = tries.last
        if breaker is not None and breaker.record(result is not None):
            emit(
                SUMMARIZER_SUSPENDED,
                summarizer=primary,
                failures=breaker.failures,
                compactions=breaker.suspended_for,
                error=None if tries.last is None else describe(tries.last),
            )
    for fallback in options.fallbacks:
        if result is not None:
            break
        result = await tries.run("failover", fallback, messages, options.retries)
    if result is None and options.failover is not None:
        for _ in range(options.retries + 1):
            try:
                choice = options.failover(tries.last)
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
        why = "no summarizer was tried" if tries.last is None else describe(tries.last)
        raise SummarizerError(f"every summarizer attempt failed ({tries.count} attempts); last: {why}")
    if primary_failed is not None or skipped is not None:
        error = skipped if primary_failed is None else describe(primary_failed)
        emit(SUMMARIZER_FALLBACK, summarizer=result[1], attempts=tries.count, error=error)
    return Summary(result[0], result[1], tries.count, primary_failed, warm=hot and result[1] == primary)


class Attempts:
    """Runs summarizer attempts for one compaction, counting them and emitting an event each."""

    def __init__(
        self,
        options: CompactorOptions,
        prompt: str,
        emit: Emit,
        max_tokens: int | None = None,
        window: int | None = None,
    ) -> None:
        self.options, self.prompt, self.emit, self.max_tokens = options, prompt, emit, max_tokens
        self.window = window  # the summarizing model's context window, when known
        if window is not None and max_tokens is not None and max_tokens > max(1, window // 4):
            self.max_tokens = max(1, window // 4)  # the output counts against the window: a quarter at most
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

    async def run_warm(
        self, summarizer: Provider, request: ModelRequest, retries: int
    ) -> tuple[tuple[str, str] | None, int]:
        """Up to `retries + 1` attempts of `request` (on the agent's cached prefix: each costs
        the provider little), and how many were made; a `ContextOverflow` ends them early (the
        cold request is smaller: the caller makes it with the attempts left)."""
        o = self.options
        name = summarizer_name(summarizer)
        made = 0
        while made <= retries:
            self.count += 1
            made += 1
            answer: str | None = None
            error: BaseException | None = None
            stop: str | None = None
            try:
                with trio.fail_after(o.summarizer_timeout or math.inf):
                    reply = await summarizer.complete(request)
                if not isinstance(reply, Message):
                    raise SummarizerError(f"summarizer provider returned {type(reply).__name__}, not a Message")
                record_usage(reply.usage)
                raw = reply.metadata.get(STOP_REASON_KEY)
                stop = raw if isinstance(raw, str) else None
                answer = bound_answer(reply.text, self.max_tokens)
            except trio.TooSlowError:
                error = SummarizerTimeout(f"{name}: no answer within summarizer_timeout={o.summarizer_timeout} s")
            except ContextOverflow as exc:
                self._emit(name, _WARM, ok=False, error=str(exc))
                return None, made
            except Exception as exc:
                error = exc
            attempt = SummaryAttempt(self.count, name, _WARM, answer, error, request.messages, stop, self.prompt)
            self.last = attempt
            try:
                unusable = bool(o.should_retry(attempt))
            except Exception:
                unusable = True
            usable = not unusable and answer is not None and bool(answer.strip())
            self._emit(name, _WARM, ok=usable, error=None if usable else describe(attempt))
            if usable and answer is not None:
                return (answer, name), made
            if not unusable and error is not None:
                return None, retries + 1  # the predicate says this error is not worth retrying
            if made <= retries and o.retry_backoff:
                await trio.sleep(min(o.max_backoff, o.retry_backoff * 2 ** (made - 1)))
        return None, made

    def _emit(self, name: str, role: str, **data: Any) -> None:
        self.emit(SUMMARIZER_ATTEMPT, summarizer=name, role=role, attempt=self.count, **data)

    async def run(
        self, role: str, summarizer: Summarizer, messages: Sequence[Message], retries: int
    ) -> tuple[str, str] | None:
        """Up to `retries + 1` attempts with backoff. A `ContextOverflow` is not a failure while
        the input can still be cut smaller: the chunks are halved (to at most half the reported
        window) and the call is made again at once, O(log n) times."""
        o = self.options
        name = summarizer_name(summarizer)
        chunk = o.summarizer_input_tokens
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
                with trio.fail_after(o.summarizer_timeout or math.inf):
                    answer, stop = await summarize_chunks(summarizer, messages, self.prompt, chunk, self.max_tokens)
            except trio.TooSlowError:
                error = SummarizerTimeout(f"{name}: no answer within summarizer_timeout={o.summarizer_timeout} s")
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
                    cap = max(MIN_SUMMARY_TEXT, exc.limit // 4)
                    if not fitted and largest_message(messages) > cap:
                        # One message alone is too large for the summarizer (a huge summary or
                        # paste): every message is cut to a quarter of its window (whole in the journal).
                        messages, fitted = [within(m, cap) for m in messages], True
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
                unusable = bool(o.should_retry(attempt))
            except Exception as exc:  # a broken predicate: count the attempt as unusable
                unusable = True
                error = error or exc
            usable = not unusable and answer is not None and bool(answer.strip())
            self._emit(name, role, ok=usable, error=None if usable else describe(attempt))
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
            if retry < retries and o.retry_backoff:
                await trio.sleep(min(o.max_backoff, o.retry_backoff * 2**retry))
            retry += 1
        return None
