"""One classifier from a failed model response to a cmdc error.

`classify(status, headers, body)` reads an HTTP status, the response headers and the body (bytes,
text, or an already parsed JSON object such as an error event inside a 200 stream) and returns
`ContextOverflow` (or `OutputBudgetOverflow`, when lowering the output limit is enough) with the
token figures wherever the text gives them, or one of the `HTTPProviderError` subclasses:
`RateLimited`, `Overloaded`, `AuthError`, `QuotaExceeded`, `BadRequest`, `ServerError`.

Structured fields decide first (`error.code`, `error.type`, llama.cpp's `n_prompt_tokens` /
`n_ctx`), then message patterns (OpenAI, Anthropic, Gemini, vLLM, TGI, llama.cpp, Mistral,
OpenRouter, Bedrock, Cohere, xAI). A 400 about something else that is "too long" (a string above
its maximum length, an output limit above the model's maximum, an invalid tool schema) is a
`BadRequest`, never an overflow. This module is pure: no I/O, no httpx.
"""

from __future__ import annotations

import email.utils
import math
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import orjson

from .._check import is_int
from .._clip import clip
from ..errors import (
    AuthError,
    BadRequest,
    CmdcError,
    ContextOverflow,
    HTTPProviderError,
    OutputBudgetOverflow,
    Overloaded,
    QuotaExceeded,
    RateLimited,
    ServerError,
)

__all__ = ["classify", "error_details", "is_overflow_text", "parse_retry_after"]

_MESSAGE_CHARS = 600

# -- structured fields -----------------------------------------------------------------------------

_OVERFLOW_CODES = frozenset(
    {"context_length_exceeded", "exceed_context_size_error", "context_window_exceeded", "model_context_window_exceeded"}
)
# Codes that say "too long" about something other than the context: never an overflow.
_NOT_OVERFLOW_CODES = frozenset(
    {"string_above_max_length", "array_above_max_length", "invalid_function_parameters", "request_too_large"}
)
_QUOTA_CODES = frozenset({"insufficient_quota", "billing_error", "billing_hard_limit_reached", "quota_exceeded"})
_RATE_CODES = frozenset(
    {"rate_limit_error", "rate_limit_exceeded", "rate_limited", "too_many_requests", "throttlingexception"}
)
_OVERLOADED_CODES = frozenset(
    {"overloaded_error", "overloaded", "server_overloaded", "unavailable", "serviceunavailableexception"}
)
_AUTH_CODES = frozenset(
    {
        "authentication_error",
        "permission_error",
        "invalid_api_key",
        "unauthenticated",
        "permission_denied",
        "unauthorized",
        "forbidden",
        "accessdeniedexception",
        "unrecognizedclientexception",
    }
)

# -- message patterns ------------------------------------------------------------------------------

_N = r"(\d[\d,_]*)"  # a token count, possibly with thousands separators


def _num(text: str | None) -> int | None:
    if text is None:
        return None
    digits = re.sub(r"[,_]", "", text)
    return int(digits) if digits.isdigit() else None


def _flags(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE | re.DOTALL)


# Any of these marks the text as a context overflow (figures are looked for separately).
_OVERFLOW_HINTS = _flags(
    "|".join(
        [
            r"context[ _-]?(?:length|window|size)[ _-]?(?:is[ _])?exceeded",
            r"exceeds? (?:the |its |this model's |the model's )?(?:available |maximum |max )?context"
            r"(?:[ _-]?(?:window|length|size|limit))",
            r"exceed context limit",
            r"maximum context length is",
            r"maximum context length of",
            r"prompt is too long",
            r"prompt too long",
            r"input is too long",
            r"longer than the maximum model length",
            r"input token count.{0,40}exceeds the maximum number of tokens",
            r"input tokens exceed the configured limit",
            r"maximum prompt length is",
            r"too large for model with \d[\d,]* maximum context length",
            r"total number of tokens in the prompt cannot exceed",
            r"`inputs` tokens \+ `max_new_tokens` must be",
            r"`inputs` must have less than",
            r"reduce the length of the (?:messages|input|prompt)",
        ]
    )
)

_Figures = tuple[int | None, int | None, int | None]
"""prompt tokens, context limit, requested output tokens (each when the text gives it)."""


def _fig(
    pattern: str, prompt: int | None = None, limit: int | None = None, output: int | None = None
) -> tuple[re.Pattern[str], Callable[[re.Match[str]], _Figures]]:
    """A pattern and which of its groups are the prompt, the limit and the requested output."""

    def pick(m: re.Match[str]) -> _Figures:
        def group(i: int | None) -> int | None:
            return None if i is None else _num(m.group(i))

        return group(prompt), group(limit), group(output)

    return _flags(pattern), pick


_FIGURES = [
    # Anthropic: "input length and `max_tokens` exceed context limit: 190000 + 20000 > 200000"
    _fig(rf"exceed context limit:\s*{_N}\s*\+\s*{_N}\s*>\s*{_N}", prompt=1, output=2, limit=3),
    # Anthropic, Bedrock: "prompt is too long: 210000 tokens > 200000 maximum"
    _fig(rf"prompt is too long:\s*{_N}\s*tokens?\s*>\s*{_N}", prompt=1, limit=2),
    # OpenAI: "... maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens"
    _fig(rf"maximum context length is {_N} tokens.{{0,40}}?messages resulted in {_N} tokens", limit=1, prompt=2),
    # OpenAI, vLLM, DeepSeek, Groq: "... is 4096 tokens. However, you requested 5000 tokens (4000 in the
    # messages, 1000 in the completion)"
    _fig(
        rf"maximum context length is {_N} tokens.{{0,80}}?\({_N} in the messages, {_N} in the completion\)",
        limit=1,
        prompt=2,
        output=3,
    ),
    # OpenAI (older): "... is 4097 tokens, however you requested 5000 tokens (4000 in your prompt; 1000 for the
    # completion)"
    _fig(
        rf"maximum context length is {_N} tokens.{{0,80}}?\({_N} in your prompt; {_N} for the completion\)",
        limit=1,
        prompt=2,
        output=3,
    ),
    # vLLM (newer): "... maximum context length is 4096 tokens and your request has 3500 input tokens"
    _fig(rf"maximum context length is {_N} tokens.{{0,40}}?request has {_N} input tokens", limit=1, prompt=2),
    # OpenAI: "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in 300000 tokens"
    _fig(rf"configured limit of {_N} tokens.{{0,40}}?resulted in {_N} tokens", limit=1, prompt=2),
    # Gemini: "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)"
    _fig(rf"input token count \(?{_N}\)? exceeds the maximum number of tokens allowed \(?{_N}\)?", prompt=1, limit=2),
    # vLLM: "The decoder prompt (length 5000) is longer than the maximum model length of 4096"
    _fig(rf"length (?:of )?{_N}\)? is longer than the maximum model length of {_N}", prompt=1, limit=2),
    # Mistral: "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length"
    _fig(rf"prompt contains {_N} tokens.{{0,60}}?too large for model with {_N} maximum", prompt=1, limit=2),
    # TGI: "`inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 1000 `max_new_tokens`"
    _fig(rf"must be <= {_N}\. Given: {_N} `inputs` tokens and {_N} `max_new_tokens`", limit=1, prompt=2, output=3),
    # TGI: "`inputs` must have less than 4096 tokens. Given: 5000"
    _fig(rf"`inputs` must have less than {_N} tokens\. Given: {_N}", limit=1, prompt=2),
    # xAI: "This model's maximum prompt length is 131072 but the request contains 200000 tokens."
    _fig(rf"maximum prompt length is {_N} but the request contains {_N} tokens", limit=1, prompt=2),
    # Cohere: "too many tokens: total number of tokens in the prompt cannot exceed 4081 - received 5000"
    _fig(rf"prompt cannot exceed {_N} - received {_N}", limit=1, prompt=2),
    # OpenRouter: "This endpoint's maximum context length is 200000 tokens. However, you requested about
    # 236255 tokens (228064 of text input, 8191 in the output)"
    _fig(
        rf"maximum context length is {_N} tokens.{{0,80}}?"
        rf"\({_N} of text input,(?: {_N} of tool input,)? {_N} in the output",
        limit=1,
        prompt=2,
        output=4,
    ),
    # fallbacks: a limit alone, a requested total alone
    _fig(rf"maximum context length (?:is|of) {_N}", limit=1),
]
# OpenRouter counts tool input apart from text input: both are the prompt.
_OPENROUTER_TOOL_INPUT = _flags(rf"{_N} of text input, {_N} of tool input")


def is_overflow_text(text: str) -> bool:
    """Whether an error message says the prompt does not fit the context window."""
    return _OVERFLOW_HINTS.search(text) is not None


def _figures(text: str) -> _Figures:
    prompt = limit = output = None
    for pattern, pick in _FIGURES:
        m = pattern.search(text)
        if m is None:
            continue
        p, lim, out = pick(m)
        prompt = prompt if prompt is not None else p
        limit = limit if limit is not None else lim
        output = output if output is not None else out
        if prompt is not None and limit is not None:
            break
    tools = _OPENROUTER_TOOL_INPUT.search(text)
    if tools is not None:
        prompt = (_num(tools.group(1)) or 0) + (_num(tools.group(2)) or 0)
    return prompt, limit, output


def _overflow(text: str, fields: Mapping[str, Any]) -> ContextOverflow:
    prompt, limit, output = _figures(text)
    # llama.cpp: {"type": "exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096}
    prompt = _int_field(fields, "n_prompt_tokens", prompt)
    limit = _int_field(fields, "n_ctx", limit)
    message = f"context window exceeded: {_clip(text)}"
    mentions_output = output is not None or re.search(r"max_tokens|max_completion_tokens|completion", text) is not None
    if prompt is not None and limit is not None and prompt < limit and mentions_output:
        # The prompt fits; the prompt plus the output limit does not. Lowering the limit helps.
        return OutputBudgetOverflow(message, prompt_tokens=prompt, limit=limit, reduce_output_to=limit - prompt)
    return ContextOverflow(message, prompt_tokens=prompt, limit=limit)


def _int_field(fields: Mapping[str, Any], key: str, default: int | None) -> int | None:
    value = fields.get(key)
    if is_int(value) and value >= 0:
        return value
    return default


# -- the body --------------------------------------------------------------------------------------


def _parse_body(body: bytes | str | Mapping[str, Any] | None) -> tuple[object, str]:
    """The parsed JSON (or None) and the body as text."""
    if body is None:
        return None, ""
    if isinstance(body, Mapping):
        try:
            text = orjson.dumps(body, default=_plain).decode()
        except TypeError:
            text = repr(body)
        return body, text
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        return orjson.loads(text), text
    except orjson.JSONDecodeError:
        return None, text


def _plain(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(type(value).__name__)


def error_details(body: object) -> Mapping[str, Any] | None:
    """The error object of a parsed error body, whatever its shape: `{"error": {...}}` (OpenAI,
    Anthropic, Gemini, OpenRouter, llama.cpp), `{"error": "text"}`, a bare error object
    (`{"object": "error", "message": ...}` from older vLLM, `{"message": ...}` from Bedrock,
    `{"detail": ...}`), or a list holding one of those (Gemini). None when there is no error."""
    if isinstance(body, list) and body:
        return error_details(body[0])
    if not isinstance(body, Mapping):
        return None
    err = body.get("error")
    if isinstance(err, Mapping):
        return err
    if isinstance(err, str) and err:
        return {"message": err}
    if body.get("object") == "error" or body.get("type") == "error":
        return body
    if any(isinstance(body.get(k), str) for k in ("message", "detail", "Message")) and "choices" not in body:
        return body
    return None


def _text_of(err: Mapping[str, Any] | None, raw: str) -> str:
    if err is None:
        return raw.strip()
    parts: list[str] = []
    for key in ("message", "detail", "Message", "error"):
        value = err.get(key)
        if isinstance(value, str) and value:
            parts.append(value)
            break
    metadata = err.get("metadata")
    if isinstance(metadata, Mapping):  # OpenRouter passes the upstream error along in metadata.raw
        upstream = metadata.get("raw")
        if isinstance(upstream, str) and upstream:
            parts.append(upstream)
    return " ".join(parts) if parts else raw.strip()


def _code_names(err: Mapping[str, Any] | None, headers: Mapping[str, str]) -> set[str]:
    names: set[str] = set()
    if err is not None:
        for key in ("code", "type", "status", "__type"):
            value = err.get(key)
            if isinstance(value, str) and value:
                names.add(value.lower())
    amzn = headers.get("x-amzn-errortype")
    if amzn:
        names.add(amzn.split(":")[0].lower())
    return names


def _clip(text: str) -> str:
    return clip(" ".join(text.split()), _MESSAGE_CHARS, keep="head", marker="…")


# -- retry-after -----------------------------------------------------------------------------------


def parse_retry_after(headers: Mapping[str, str], *, now: datetime | None = None) -> float | None:
    """The wait, in seconds, a response asks for: `retry-after-ms` (milliseconds), else
    `retry-after` as seconds or as an HTTP date (relative to `now`, default the wall clock).
    None when neither is present or readable; never negative."""
    lowered = {k.lower(): v for k, v in headers.items()}
    ms = _finite(lowered.get("retry-after-ms"))
    if ms is not None:
        return max(0.0, ms / 1000.0)
    value = lowered.get("retry-after")
    if value is None:
        return None
    seconds = _finite(value)
    if seconds is not None:
        return max(0.0, seconds)
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = now if now is not None else datetime.now(UTC)
    return max(0.0, (when - current).total_seconds())


def _finite(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) else None


# -- the classifier --------------------------------------------------------------------------------


def classify(status: int, headers: Mapping[str, str], body: bytes | str | Mapping[str, Any] | None) -> CmdcError:
    """The cmdc error for a failed response: `status` is the HTTP status (200 for an error
    object inside a 200 body or stream: the status it names, if any, is used), `headers` the
    response headers (any case), `body` the raw body or a parsed error object."""
    lowered = {k.lower(): v for k, v in headers.items()}
    parsed, raw = _parse_body(body)
    err = error_details(parsed)
    text = _text_of(err, raw)
    codes = _code_names(err, lowered)
    if err is not None and isinstance(err.get("error"), Mapping):  # {"type": "error", "error": {...}}
        inner = err["error"]
        codes |= _code_names(inner, {})
        text = _text_of(inner, text)
    named = err.get("code") if err is not None else None
    if 200 <= status < 400 and isinstance(named, int) and 400 <= named < 600:
        status = named  # OpenRouter: {"error": {"code": 429, ...}} inside a 200 body or stream
    in_band = 200 <= status < 300
    retry_after = parse_retry_after(lowered)
    fields: Mapping[str, Any] = err if err is not None else {}

    # 1. context overflow: structured codes first, then message patterns; never for auth,
    #    quota and rate-limit statuses, never for codes that mean some other "too long".
    if codes & _OVERFLOW_CODES:
        return _overflow(text, fields)
    if not (codes & _NOT_OVERFLOW_CODES) and status not in (401, 402, 403, 404, 429) and is_overflow_text(text):
        return _overflow(text, fields)

    where = f"HTTP {status}" if not in_band else "error in a 200 response"
    label = sorted(codes & (_QUOTA_CODES | _RATE_CODES | _OVERLOADED_CODES | _AUTH_CODES))
    detail = f"{where}{f' ({label[0]})' if label else ''}: {_clip(text) or '(no message)'}"
    kwargs: dict[str, Any] = {"status": status, "body": raw or None, "retry_after": retry_after}

    # 2. other structured codes
    if codes & _QUOTA_CODES or status == 402:
        return QuotaExceeded(detail, **kwargs)
    if codes & _AUTH_CODES or status in (401, 403):
        return AuthError(detail, **kwargs)
    if codes & _OVERLOADED_CODES or status in (503, 529):
        return Overloaded(detail, **kwargs)
    if codes & _RATE_CODES or "resource_exhausted" in codes or status == 429:
        return RateLimited(detail, **kwargs)

    # 3. by status
    if status in (408, 409) or status >= 500 or in_band:
        return ServerError(detail, **kwargs)
    return BadRequest(detail, **kwargs)


def retryable(error: BaseException) -> bool:
    """Whether the HTTP providers retry `error`: only `HTTPProviderError`s marked retryable
    (rate limits, overload, server errors, cut connections); never an overflow."""
    return isinstance(error, HTTPProviderError) and error.retryable
