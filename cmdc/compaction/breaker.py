"""When to stop asking a summarizer that keeps failing: a circuit breaker over compactions.

A small model can fail every summary it is asked for (cut off by its output limit, or answering
the conversation instead of summarizing it); each refused attempt costs a full model request.
`SummarizerBreaker` counts the compactions in a row in which a compactor's primary summarizer
gave up, suspends it for a while (its fallbacks write the summaries), then tries it again.
Counted in compactions, not seconds: deterministic, and the same on a fast or a slow machine.
"""

from __future__ import annotations

import attrs

from .._check import integer, validator

_at_least_one = validator(integer, "{}")


@attrs.define
class SummarizerBreaker:
    """After `threshold` compactions in a row in which the primary summarizer gave up (every
    attempt failed or was refused), it is suspended: the next `cooldown` compactions go straight
    to the fallbacks without asking it. The compaction after that tries it again; a success
    closes the breaker, a failure suspends it again for twice as long (at most `max_cooldown`).

    One breaker belongs to one compactor (one agent's summarizer): it is mutable state. A
    compactor with no fallback and no failover never skips its summarizer (nothing else could
    write the summary)."""

    threshold: int = attrs.field(default=2, validator=_at_least_one)
    cooldown: int = attrs.field(default=4, validator=_at_least_one)
    max_cooldown: int = attrs.field(default=64, validator=_at_least_one)
    failures: int = attrs.field(default=0, init=False)
    """Compactions in a row in which the summarizer gave up."""
    skipping: int = attrs.field(default=0, init=False)
    """Compactions still to skip it for (0: it is asked)."""
    suspended_for: int = attrs.field(default=0, init=False)
    """The length of the current (or last unclosed) suspension; 0 once a summary succeeded."""

    def admit(self) -> bool:
        """Whether this compaction asks the summarizer (a skipped compaction is counted)."""
        if self.skipping > 0:
            self.skipping -= 1
            return False
        return True

    def record(self, ok: bool) -> int:
        """The outcome of a compaction that asked the summarizer; returns the number of
        compactions it is now suspended for (0: not suspended)."""
        if ok:
            self.failures = self.suspended_for = 0
            return 0
        self.failures += 1
        if self.suspended_for == 0 and self.failures < self.threshold:
            return 0
        # First suspension: `cooldown`; a failed try after one: twice the last (capped).
        self.suspended_for = min(self.max_cooldown, self.cooldown if not self.suspended_for else self.suspended_for * 2)
        self.skipping = self.suspended_for
        return self.suspended_for
