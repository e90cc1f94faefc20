"""The settings the HTTP providers share: `HTTPSettings` (timeouts, retries, headers, limits)
and `ReplyLimits` (bounds on what an endpoint sends back), frozen values in the style of
httpx's `Timeout` and `Limits`. Plain data: importing them needs no `http` extra."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TypedDict

import attrs

from .._check import integer, optional_seconds, validator
from ..errors import ConfigError, TooManyToolCalls

DEFAULT_TIMEOUT = 60.0
"""Seconds: httpx's per-request timeout (connect, and each read: for a stream, the gap between chunks)."""
DEFAULT_MAX_RETRIES = 4
DEFAULT_DEADLINE = 900.0
"""Seconds one provider call (`complete`, with its retries and their waits) may take by default."""

@attrs.frozen
class ReplyLimits:
    """Bounds on what a model endpoint may send back, per response. Past one, the reply is
    refused with a typed `ProviderError` (and not retried):

    - `max_reply_bytes`: the body (a JSON reply, or a whole SSE stream): `ReplyTooLarge`;
    - `max_line_bytes`: one SSE line (a line that never ends): `ReplyTooLarge`;
    - `max_tool_calls`: tool calls in one reply: `TooManyToolCalls`;
    - `max_stream_seconds`: one response, from sending the request to its last byte (an endless
      trickle of bytes never trips httpx's read timeout): `ProviderTimeout`; None: no bound.

    Per tool call, not failing the reply: arguments with more than `max_argument_values` values
    in all (object members and array items, through every level; 10,000) or nested deeper than
    `max_argument_depth` (32) are not kept: the call is delivered with arguments `{}` and the
    reason in metadata `cmdc.refused_tool_arguments`, and the agent answers the model with it.
    """

    max_reply_bytes: int = 16 * 1024 * 1024
    max_line_bytes: int = 4 * 1024 * 1024
    max_tool_calls: int = 256
    max_stream_seconds: float | None = 600.0
    max_argument_values: int = 10_000
    max_argument_depth: int = 32

    def __attrs_post_init__(self) -> None:
        integer(self.max_reply_bytes, "ReplyLimits.max_reply_bytes")
        integer(self.max_line_bytes, "ReplyLimits.max_line_bytes")
        integer(self.max_tool_calls, "ReplyLimits.max_tool_calls")
        optional_seconds(self.max_stream_seconds, "ReplyLimits.max_stream_seconds")
        integer(self.max_argument_values, "ReplyLimits.max_argument_values", minimum=1)
        integer(self.max_argument_depth, "ReplyLimits.max_argument_depth", minimum=1)

    def check_tool_calls(self, n: int, name: str) -> None:
        if n > self.max_tool_calls:
            raise TooManyToolCalls(f"{name}: the reply has more than {self.max_tool_calls} tool calls (max_tool_calls)")


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_BAD_VALUE = re.compile(r"[\r\n\x00]")


def check_headers(headers: Mapping[str, str] | None) -> Mapping[str, str]:
    """`headers` as a read-only mapping; `ConfigError` for anything but strings to strings, a
    name that is not an HTTP token, or a value with a line break or NUL (values are never shown
    in the error: they may hold keys)."""
    if headers is None:
        return MappingProxyType({})
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise ConfigError("headers must map strings to strings")
    for name, value in headers.items():
        if _HEADER_NAME.fullmatch(name) is None:
            raise ConfigError(f"header name {name[:80]!r} is not an HTTP token")
        if _BAD_VALUE.search(value):
            raise ConfigError(f"the value of header {name!r} holds a line break or NUL")
    return MappingProxyType(dict(headers))


def _limits(value: ReplyLimits | None) -> ReplyLimits:
    if value is None:
        return ReplyLimits()
    if not isinstance(value, ReplyLimits):
        raise ConfigError(f"limits must be a ReplyLimits, got {value!r:.80}")
    return value


def _timeout(value: float | None) -> float | None:
    return optional_seconds(value, "timeout")


def _deadline(value: float | None) -> float | None:
    return optional_seconds(value, "deadline")


def _redacted(headers: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{k!r}: '***'" for k in headers) + "}"


@attrs.frozen(kw_only=True)
class HTTPSettings:
    """How an HTTP provider (`OpenAIProvider`, `AnthropicProvider`) talks to its endpoint;
    every value checked when built (`ConfigError` naming it).

    **Usage**:

        HTTPSettings()                                   # 60 s per request, 4 retries, 900 s per call
        HTTPSettings(timeout=10.0, max_retries=0)        # fail fast
        HTTPSettings(deadline=None)                      # only the caller's cancel scopes bound a call
        HTTPSettings(headers={"api-key": key})           # Azure: added to every request
        HTTPSettings(limits=ReplyLimits(max_tool_calls=16))
        OpenAIProvider("gpt-4o", settings=HTTPSettings(timeout=10.0))
        OpenAIProvider("gpt-4o", timeout=10.0)           # the same: each field is a keyword too

    - `timeout`: httpx's per-request timeout in seconds (connect, and each read: for a stream,
      the gap between chunks); None: none.
    - `max_retries`: retries after the first attempt (408, 409, 429, 5xx, 529 and connection
      failures; never an overflow, auth, quota or bad request), with exponential backoff.
    - `deadline`: seconds one `complete()` call may take, retries and their waits included
      (`ProviderTimeout`); None: only the caller's cancel scopes bound it.
    - `headers`: added to every request (held read-only; their values never shown in `repr`).
    - `limits`: `ReplyLimits`, what the endpoint may send back.
    """

    timeout: float | None = attrs.field(default=DEFAULT_TIMEOUT, converter=_timeout)
    max_retries: int = attrs.field(default=DEFAULT_MAX_RETRIES, validator=validator(integer, "{}", minimum=0))
    deadline: float | None = attrs.field(default=DEFAULT_DEADLINE, converter=_deadline)
    headers: Mapping[str, str] = attrs.field(
        factory=dict, converter=check_headers, repr=_redacted, hash=False
    )
    limits: ReplyLimits = attrs.field(factory=ReplyLimits, converter=_limits)

    def replace(self, keywords: Mapping[str, Any], owner: str) -> HTTPSettings:
        """These settings with `keywords` (an `HTTPKeywords` given to `owner`, a provider)
        replacing fields; an unknown keyword is a `TypeError`, as Python raises for any call."""
        unknown = sorted(set(keywords) - _FIELDS)
        if unknown:
            raise TypeError(f"{owner}() got an unexpected keyword argument {unknown[0]!r}")
        return attrs.evolve(self, **keywords) if keywords else self

    @classmethod
    def given(cls, settings: HTTPSettings | None, keywords: Mapping[str, Any], owner: str) -> HTTPSettings:
        """What a provider was given: `settings` (default `HTTPSettings()`), then its keywords."""
        if settings is None:
            settings = cls()
        elif not isinstance(settings, HTTPSettings):
            raise ConfigError(f"settings must be an HTTPSettings, got {settings!r:.80}")
        return settings.replace(keywords, owner)


class HTTPKeywords(TypedDict, total=False):
    """`HTTPSettings`' fields as a provider's keywords (`**http: Unpack[HTTPKeywords]`), so the
    shared settings are listed once for every HTTP provider; `test_http_settings` checks that
    these match `HTTPSettings`' fields, name and type."""

    timeout: float | None
    max_retries: int
    deadline: float | None
    headers: Mapping[str, str] | None
    limits: ReplyLimits | None


_FIELDS = frozenset(f.name for f in attrs.fields(HTTPSettings))
