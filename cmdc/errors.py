"""The cmdc error hierarchy: every error cmdc raises on purpose derives from `CmdcError`.

Every class here is exported from `cmdc` too. Catch `CmdcError` for anything cmdc raised on
purpose, or a branch for one kind of failure. The tree (a class under its first base; `also`
names its other bases, builtin ones included, so `except ValueError` still catches a
`ConfigError`):

    CmdcError
    ├── ConfigError (also ValueError)
    │   └── InvalidPlugin (also TypeError)
    ├── InvalidMessage (also ValueError)
    ├── ContextOverflow
    │   └── OutputBudgetOverflow
    ├── CompactionError
    │   ├── SummarizerError
    │   ├── CompactionIncomplete
    │   ├── CompactionThrashing
    │   ├── CompactionAborted
    │   └── SummarizerTimeout
    ├── OffloadError
    │   ├── IndexUnavailable
    │   ├── OffloadCorrupted
    │   ├── JournalLost
    │   ├── StoreUnavailable (also CheckpointError)
    │   ├── StoreRefused (also CheckpointError)
    │   └── LeaseLost (also CheckpointError)
    ├── ProviderError
    │   ├── ProviderTimeout
    │   ├── ReplyTooLarge
    │   │   └── TooManyToolCalls
    │   └── HTTPProviderError
    │       ├── RateLimited
    │       ├── Overloaded
    │       ├── ServerError
    │       ├── ConnectionFailed
    │       │   └── IncompleteStream
    │       ├── AuthError
    │       ├── QuotaExceeded
    │       └── BadRequest
    ├── PluginAborted
    ├── PluginReturnError (also TypeError)
    ├── MailboxFull
    ├── AgentStopped
    ├── TurnAborted
    ├── StepLimitReached
    ├── RequestSkipped
    ├── AgentNotFound
    ├── ToolArgumentsError (also ValueError)
    ├── DelegationRefused
    ├── InvalidState (also ValueError)
    ├── CheckpointError
    │   └── CheckpointCorrupted
    ├── ChatFileError
    ├── UsageError
    ├── DemoError
    ├── NameLeased
    ├── NodeLost
    ├── MCPServerError
    └── MCPToolError

    DeprecationWarning (a warning, not an error)
    └── CmdcDeprecationWarning

`HTTPProviderError.retryable` says which HTTP failures the providers retry. `IndexUnavailable`
is raised and caught inside the stores (readers fall back to a scan); it is exported so that
the hierarchy is whole. `tests/api/test_errors.py` checks this drawing against the classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # names only: errors are layer 0 and import nothing at run time
    from collections.abc import Sequence
    from pathlib import Path

    from ._report import CompactionReport
    from .state import State


class CmdcError(Exception):
    """Root of every error cmdc raises on purpose."""


class ConfigError(CmdcError, ValueError):
    """A configuration value, an option or an identifier is malformed."""


class InvalidMessage(CmdcError, ValueError):
    """A message (or its serialized form) is malformed."""


class ContextOverflow(CmdcError):
    """The prompt does not fit the model's context window.

    `prompt_tokens` and `limit` carry the figures when they are known.
    """

    def __init__(
        self,
        message: str = "context window exceeded",
        *,
        prompt_tokens: int | None = None,
        limit: int | None = None,
    ) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.limit = limit

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_overflow, (str(self), self.prompt_tokens, self.limit))


def _rebuild_overflow(message: str, prompt_tokens: int | None, limit: int | None) -> ContextOverflow:
    return ContextOverflow(message, prompt_tokens=prompt_tokens, limit=limit)


class CompactionError(CmdcError):
    """A compaction failed; the caller's `State` is unchanged."""


class SummarizerError(CompactionError):
    """Every summarizer attempt (retries and failovers) failed or gave an unusable answer."""


class CompactionIncomplete(CompactionError):
    """After every allowed pass the context is still over a trigger. `state` is the compacted
    state (the evicted messages are journaled), `report` the combined report."""

    def __init__(self, message: str, *, state: State, report: CompactionReport) -> None:
        super().__init__(message)
        self.state = state
        self.report = report


class CompactionThrashing(CompactionError):
    """Compactions kept repeating while the context kept coming back over the trigger (the
    thrash guard: `compact_thrash` compactions within that many model requests). The turn
    fails instead of spinning the summarizer; the message says what is too big. `culprit`: one
    of "pins", "kept", "message", "summary" (the largest share of what a compaction cannot
    remove); `figures`: the token figures behind it."""

    def __init__(self, message: str, *, culprit: str, figures: dict[str, int]) -> None:
        super().__init__(message)
        self.culprit = culprit
        self.figures = figures


class CompactionAborted(CompactionError):
    """A `before_compact` plugin returned `Abort`."""


class OffloadError(CmdcError):
    """Writing to or reading from the offload journal failed."""


class IndexUnavailable(OffloadError):
    """A journal's search and offsets index cannot be used (its directory is not writable,
    SQLite failed twice). Internal: readers catch it and scan the journal instead."""


class OffloadCorrupted(OffloadError):
    """A journal record is damaged (a checksum mismatch, a broken line). Readers skip damaged
    records and count them; this is raised where a damaged record cannot be skipped."""


class JournalLost(OffloadError):
    """The journal a state expects has disappeared, was replaced by another one, or was
    truncated below the last record the state names. Detected before anything is appended;
    the store has durably recorded the loss (a successor journal numbering on from
    `expected_seq`), so a retry writes the whole batch again and never reuses a record number."""

    def __init__(
        self,
        message: str,
        *,
        expected: str | None = None,
        found: str | None = None,
        expected_seq: int = 0,
        found_seq: int = 0,
        why: str = "",
    ) -> None:
        super().__init__(message)
        self.expected = expected
        self.found = found
        self.expected_seq = expected_seq
        self.found_seq = found_seq
        self.why = why


class ProviderError(CmdcError):
    """A model provider failed for a reason other than context overflow."""


class PluginAborted(CmdcError):
    """A plugin returned `Abort(reason)`: the turn ends with this error."""


class PluginReturnError(CmdcError, TypeError):
    """A hook returned a value that is not a valid subject for it (the fold reports it as an
    event and skips the plugin)."""


class InvalidPlugin(ConfigError, TypeError):
    """Something given as a plugin does not subclass `cmdc.Plugin`."""


class MailboxFull(CmdcError):
    """A `*_nowait` send found the agent's mailbox full."""


class AgentStopped(CmdcError):
    """The agent stopped (or the runtime closed) before it could answer."""


class TurnAborted(CmdcError):
    """The running turn was aborted (`abort()`); the state stays at its last committed point."""


class StepLimitReached(CmdcError):
    """A turn used `max_steps` model requests without a final answer. `reply` is the last one."""

    def __init__(self, message: str, reply: object = None) -> None:
        super().__init__(message)
        self.reply = reply


class RequestSkipped(CmdcError):
    """A `before_request` plugin returned `Skip`: the turn ends without a model request."""


class AgentNotFound(CmdcError):
    """No agent is registered under that name."""


_SHOWN = 20  # problems a ToolArgumentsError's text lists
_ERROR_CHARS = 300  # characters of one problem shown


class ToolArgumentsError(CmdcError, ValueError):
    """A model's tool arguments do not match the tool's schema; `errors` lists every problem."""

    def __init__(self, errors: Sequence[str], tool: str | None = None) -> None:
        self.errors = tuple(errors)
        self.tool = tool
        head = f"invalid arguments for tool {tool!r}" if tool else "invalid arguments"
        # The text the model reads is bounded: the first problems, each clipped, then a count.
        shown = [e if len(e) <= _ERROR_CHARS else f"{e[:_ERROR_CHARS]}... (clipped)" for e in self.errors[:_SHOWN]]
        if len(self.errors) > _SHOWN:
            shown.append(f"... and {len(self.errors) - _SHOWN:,} more listed problems not shown")
        super().__init__(f"{head}:\n" + "\n".join(f"- {e}" for e in shown))

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.errors, self.tool))


class DelegationRefused(CmdcError):
    """A delegation the runtime will not make: the target was not granted to the delegating
    agent, does not accept tasks from it, would close a wait-for cycle (a deadlock), or a
    bound (depth, children at once) is reached. The `delegate` tool turns it into an error
    result the model can read."""


class ProviderTimeout(ProviderError):
    """A provider call ran past its overall `deadline`, or one response past
    `ReplyLimits.max_stream_seconds`. Not retried by the HTTP providers."""


class ReplyTooLarge(ProviderError):
    """A model endpoint's reply broke a `ReplyLimits` bound: the body, one SSE line, or the
    number of tool calls. Not retried: the same request would likely do it again."""


class TooManyToolCalls(ReplyTooLarge):
    """A reply asked for more tool calls than `ReplyLimits.max_tool_calls`."""


class SummarizerTimeout(CompactionError):
    """One summarizer attempt ran past the compactor's `summarizer_timeout`: a failed attempt,
    retried and failed over like any other."""


class InvalidState(CmdcError, ValueError):
    """A serialized `State` is malformed."""


class CheckpointError(CmdcError):
    """Saving, loading or deleting an agent's checkpoint failed."""


class CheckpointCorrupted(CheckpointError):
    """A checkpoint file exists but does not hold a valid `State`."""


class StoreUnavailable(OffloadError, CheckpointError):
    """A store's database could not be reached, after its bounded retries. Nothing was
    half-written: the operation happened whole or not at all, and repeating it is safe."""


class StoreRefused(OffloadError, CheckpointError):
    """A store's database refused an operation for a reason a retry would not change (a limit
    such as PostgreSQL's, a value it rejects). Not retried; the operation's transaction was
    rolled back, so nothing of it was written. The message names the server's error class."""


class ChatFileError(CmdcError):
    """A conversation file that cannot be used: `where` is `path:line` or `path: [index]`."""

    def __init__(self, path: Path, problem: str, *, line: int | None = None, index: int | None = None) -> None:
        self.path = path
        self.line = line
        self.index = index
        self.problem = problem
        if line is not None:
            where = f"{path}:{line}"
        elif index is not None:
            where = f"{path}: element [{index}]"
        else:
            where = str(path)
        super().__init__(f"{where}: {problem}")


class CmdcDeprecationWarning(DeprecationWarning):
    """A cmdc API that is deprecated; the message names its replacement. The project's own
    tests turn it into an error (pyproject's `filterwarnings`), so cmdc never uses one itself."""


class UsageError(CmdcError):
    """A usage or input error of the `cmdc` command: exit code 2, nothing written."""


class DemoError(CmdcError):
    """A demo that cannot start (a missing key, a missing extra); the message says what to do."""


class NameLeased(CmdcError):
    """The agent's name is leased to another runtime (another process or node) that has it
    active: this one may not activate it until that lease is released or expires."""


class LeaseLost(OffloadError, CheckpointError):
    """A write for an agent whose name lease this runtime no longer holds (it expired and
    another runtime took the name, or it was broken): refused, so a stale owner never writes
    over the new one. The agent leaves memory; the next call activates it again from the store."""


class NodeLost(CmdcError):
    """A cluster node died (or became unreachable) while it served this call. A turn that was
    running there may or may not have committed: read the agent's state to know. The next call
    on the agent activates it on another node from its last commit."""


# -- HTTP providers ----------------------------------------------------------------------------
# `cmdc.providers.overflow.classify` turns a failed HTTP response (or an error event inside a
# 200 stream) into one of these, or into `ContextOverflow` / `OutputBudgetOverflow`.


class OutputBudgetOverflow(ContextOverflow):
    """The prompt fits, but the prompt plus the requested output limit does not
    ("input length and `max_tokens` exceed context limit: A + B > C").

    `reduce_output_to` is the largest output limit that fits (C - A) when the text gives the
    figures: lowering the limit is the first remedy, compaction the second. The HTTP providers
    retry once with the lower limit when it leaves a useful budget, then raise this error (a
    `ContextOverflow`, so the agent compacts).
    """

    def __init__(
        self,
        message: str = "prompt plus output limit exceed the context window",
        *,
        prompt_tokens: int | None = None,
        limit: int | None = None,
        reduce_output_to: int | None = None,
    ) -> None:
        super().__init__(message, prompt_tokens=prompt_tokens, limit=limit)
        self.reduce_output_to = reduce_output_to

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_budget, (str(self), self.prompt_tokens, self.limit, self.reduce_output_to))


def _rebuild_budget(
    message: str, prompt_tokens: int | None, limit: int | None, reduce_output_to: int | None
) -> OutputBudgetOverflow:
    return OutputBudgetOverflow(message, prompt_tokens=prompt_tokens, limit=limit, reduce_output_to=reduce_output_to)


class HTTPProviderError(ProviderError):
    """A model endpoint answered with an error. `status` is the HTTP status (or the status an
    error event inside a 200 stream names); `body` the response body as text, when there is one;
    `retry_after` the wait in seconds the server asked for (`retry-after-ms`, `retry-after`), if any."""

    retryable = False
    """Whether the HTTP providers retry this error (with backoff)."""

    def __init__(
        self, message: str, *, status: int | None = None, body: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_http_error, (type(self), str(self), self.status, self.body, self.retry_after))


def _rebuild_http_error(
    cls: type[HTTPProviderError], message: str, status: int | None, body: str | None, retry_after: float | None
) -> HTTPProviderError:
    return cls(message, status=status, body=body, retry_after=retry_after)


class RateLimited(HTTPProviderError):
    """429 (or `rate_limit_error`): too many requests. Retried, waiting at least `retry_after`
    seconds when the server said."""

    retryable = True


class Overloaded(HTTPProviderError):
    """529 / 503 (or `overloaded_error`): the service is overloaded. Retried, honouring
    `retry_after` like `RateLimited`."""

    retryable = True


class ServerError(HTTPProviderError):
    """A transient failure on the server's side: a 5xx, 408 (timeout), 409 (conflict), or an
    unclassified error inside a 200 stream. Retried."""

    retryable = True


class ConnectionFailed(HTTPProviderError):
    """The endpoint could not be reached, timed out, or cut the connection. Retried."""

    retryable = True


class IncompleteStream(ConnectionFailed):
    """A streamed reply ended before its terminal event (`[DONE]` / a finish reason,
    `message_stop`): never taken as a complete reply. Retried like a cut connection."""


class AuthError(HTTPProviderError):
    """401 / 403 (`authentication_error`, `permission_error`): the key is missing, wrong or not
    allowed. Never retried."""


class QuotaExceeded(HTTPProviderError):
    """The account is out of credit or quota (`insufficient_quota`, `billing_error`, 402).
    Never retried: waiting does not help."""


class BadRequest(HTTPProviderError):
    """The endpoint refused the request for a reason other than its length (a malformed field,
    an invalid tool schema, a string above a size limit, an unknown model). Never retried."""


class MCPServerError(CmdcError):
    """An MCP server (`cmdc.mcp`) could not start, or failed or died while a call was in flight."""


class MCPToolError(CmdcError):
    """An MCP tool answered with an error, or its server refused the call (its text is what the
    model reads)."""


__all__ = [
    "AgentNotFound",
    "AgentStopped",
    "AuthError",
    "BadRequest",
    "ChatFileError",
    "CheckpointCorrupted",
    "CheckpointError",
    "CmdcDeprecationWarning",
    "CmdcError",
    "CompactionAborted",
    "CompactionError",
    "CompactionIncomplete",
    "CompactionThrashing",
    "ConfigError",
    "ConnectionFailed",
    "ContextOverflow",
    "DelegationRefused",
    "DemoError",
    "HTTPProviderError",
    "IncompleteStream",
    "IndexUnavailable",
    "InvalidMessage",
    "InvalidPlugin",
    "InvalidState",
    "JournalLost",
    "LeaseLost",
    "MCPServerError",
    "MCPToolError",
    "MailboxFull",
    "NameLeased",
    "NodeLost",
    "OffloadCorrupted",
    "OffloadError",
    "OutputBudgetOverflow",
    "Overloaded",
    "PluginAborted",
    "PluginReturnError",
    "ProviderError",
    "ProviderTimeout",
    "QuotaExceeded",
    "RateLimited",
    "ReplyTooLarge",
    "RequestSkipped",
    "ServerError",
    "StepLimitReached",
    "StoreRefused",
    "StoreUnavailable",
    "SummarizerError",
    "SummarizerTimeout",
    "TooManyToolCalls",
    "ToolArgumentsError",
    "TurnAborted",
    "UsageError",
]
