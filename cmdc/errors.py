"""The cmdc error hierarchy: every error cmdc raises on purpose derives from `CmdcError`."""

from __future__ import annotations


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


class CompactionAborted(CompactionError):
    """A `before_compact` plugin returned `Abort`."""


class OffloadError(CmdcError):
    """Writing to or reading from the offload journal failed."""


class OffloadCorrupted(OffloadError):
    """The offload journal is damaged before its last line; cmdc will not guess."""


class ProviderError(CmdcError):
    """A model provider failed for a reason other than context overflow."""


class PluginAborted(CmdcError):
    """A plugin returned `Abort(reason)`: the turn ends with this error."""


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


class InvalidState(CmdcError, ValueError):
    """A serialized `State` is malformed."""


class CheckpointError(CmdcError):
    """Saving, loading or deleting an agent's checkpoint failed."""


class CheckpointCorrupted(CheckpointError):
    """A checkpoint file exists but does not hold a valid `State`."""
