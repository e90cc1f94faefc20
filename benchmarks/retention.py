"""Retention probes: what survives compaction. A scripted session with a task statement, ten
user constraints spread over time, identifiers, pinned facts and a tool call pending at the
moment of a compaction, compacted at least five times with the offline summarizer. After each
compaction it checks that the context still holds the task, every user message (within the
preserved-messages budget), every pinned message, the pending call and the identifiers.

Run: python -m benchmarks.retention   (prints the retention table)
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from typing import Any

import attrs
import trio

from cmdc import Compacted, Compactor, Message, State, ToolCall, estimate_message_tokens
from cmdc.message import PINNED_KEY

TASK = "TASK: migrate the billing service to the invoice API v2 (ticket PAY-4821); keep src/legacy/ untouched."
CONSTRAINTS = [
    "Constraint 1: all amounts stay in integer cents.",
    "Constraint 2: never call the production endpoint api.billing.example/v1 from tests.",
    "Constraint 3: keep parse_invoice() backwards compatible.",
    "Constraint 4: log every retry in src/billing/retry.py.",
    "Constraint 5: ticket OPS-1177 must be referenced in the changelog.",
    "Constraint 6: the timeout for invoice fetches is 7 seconds.",
    "Constraint 7: do not add new dependencies.",
    "Constraint 8: docs go to docs/billing/migration.md.",
    "Constraint 9: currency codes are ISO 4217, upper case.",
    "Constraint 10: the feature flag is INVOICE_V2_ENABLED.",
]
PINS = ["PIN: the staging database is db-stg-07.", "PIN: the release owner is Dana (on-call OPS-2210)."]
IDENTIFIERS = [
    "PAY-4821",
    "src/legacy/",
    "parse_invoice()",
    "src/billing/retry.py",
    "OPS-1177",
    "docs/billing/migration.md",
]
FILES = ["src/billing/client.py", "src/billing/models.py", "src/billing/retry.py", "tests/test_billing.py"]


@attrs.frozen
class Check:
    compaction: int
    tokens_before: int
    tokens_after: int
    messages_after: int
    task: bool
    users: tuple[int, int]
    pins: tuple[int, int]
    pending: bool | None
    identifiers: tuple[int, int]

    @property
    def ok(self) -> bool:
        return (
            self.task
            and self.users[0] == self.users[1]
            and self.pins[0] == self.pins[1]
            and self.pending is not False
            and self.identifiers[0] == self.identifiers[1]
        )


def _context_text(state: State) -> str:
    return (
        "\n".join(m.text for m in state.messages)
        + "\n"
        + "\n".join(str(c.arguments) for m in state.messages for c in m.tool_calls)
    )


def _within(users: Sequence[Message], budget: int) -> list[Message]:
    """The user messages the summary budget promises to keep: the task (pinned), then the newest
    that fit in `budget` tokens."""
    out, left = [], budget
    for u in reversed(users[1:]):
        left -= estimate_message_tokens(u)
        if left < 0:
            break
        out.append(u)
    return [users[0], *out] if users else out


def _check(
    state: State,
    report: Any,
    users: Sequence[Message],
    pins: Sequence[Message],
    pending: str | None,
    seen: set[str],
    user_budget: int,
) -> Check:
    ids = {m.id for m in state.messages}
    text = " ".join(_context_text(state).split())
    task = any(m.text == TASK for m in state.messages)
    users = _within(users, user_budget)
    users_in = sum(1 for u in users if u.id in ids or " ".join(u.text.split()) in text)
    pins_in = sum(1 for p in pins if p.id in ids)
    mentioned = [i for i in IDENTIFIERS if i in seen]
    idents = sum(1 for i in mentioned if i in text)
    return Check(
        compaction=report.compaction,
        tokens_before=report.tokens_before,
        tokens_after=report.tokens_after,
        messages_after=report.messages_after,
        task=task,
        users=(users_in, len(users)),
        pins=(pins_in, len(pins)),
        pending=None if pending is None else pending in ids,
        identifiers=(idents, len(mentioned)),
    )


async def run_session(offload_dir: str, *, rounds: int = 80, compactor: Compactor | None = None) -> list[Check]:
    """The scripted session; returns one `Check` per compaction."""
    compactor = compactor or Compactor()  # the offline extractive summarizer
    state = State(
        agent_id="retention",
        messages=(Message.system("You are a careful coding agent."), Message.user(TASK)),
        config={
            "compact_offload_dir": offload_dir,
            "compact_trigger": ("tokens", 6_000),
            "compact_keep": ("messages", 6),
        },
    )
    users: list[Message] = [state.messages[1]]
    pins: list[Message] = []
    checks: list[Check] = []

    seen: set[str] = set()

    async def compact(pending: str | None = None) -> None:
        nonlocal state
        if pending is None:
            result = await compactor.maybe_compact(state)
        else:  # compact now, while the call waits for its result
            result = await compactor.force_compact(state)
        if isinstance(result, Compacted):
            state = result.state
            user_budget = compactor.budgets(compactor.compact_config(state))[1]
            checks.append(_check(state, result.report, users, pins, pending, seen, user_budget))

    constraints = iter(CONSTRAINTS)
    for r in range(rounds):
        constraint = next(constraints, None) if r % 7 == 2 else None
        text = constraint or f"Round {r}: continue with {FILES[r % len(FILES)]}."
        user = Message.user(text)
        users.append(user)
        seen.update(i for i in IDENTIFIERS if i in text or i in TASK)
        state = state.append(user)
        if r in (7, 23):
            pin = Message.user(PINS[len(pins)], metadata={PINNED_KEY: True})
            pins.append(pin)
            state = state.append(pin)
        call = ToolCall(id=f"c{r}", name="read_file", arguments={"path": FILES[r % len(FILES)]})
        asking = Message.assistant(f"Reading {FILES[r % len(FILES)]}.", tool_calls=(call,))
        state = state.append(asking)
        if r == 31:  # a compaction while this call waits for its result
            await compact(pending=asking.id)
        body = f"# {FILES[r % len(FILES)]}\n" + "\n".join(f"line {i}: amount_cents = {r * 100 + i}" for i in range(40))
        state = state.append(Message.tool_result(call.id, body))
        state = state.append(Message.assistant(f"Updated {FILES[r % len(FILES)]} for round {r}."))
        await compact()
    return checks


def table(checks: Sequence[Check]) -> str:
    rows = [
        f"{'#':>3} {'tokens before':>13} {'after':>6} {'msgs':>5} {'task':>5} {'users':>7} {'pins':>5} "
        f"{'pending':>8} {'idents':>7}  ok"
    ]
    for c in checks:
        pending = "-" if c.pending is None else ("yes" if c.pending else "LOST")
        rows.append(
            f"{c.compaction:>3} {c.tokens_before:>13} {c.tokens_after:>6} {c.messages_after:>5} "
            f"{'yes' if c.task else 'LOST':>5} {f'{c.users[0]}/{c.users[1]}':>7} {f'{c.pins[0]}/{c.pins[1]}':>5} "
            f"{pending:>8} {f'{c.identifiers[0]}/{c.identifiers[1]}':>7}  {'✓' if c.ok else '✗'}"
        )
    return "\n".join(rows)


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        checks = await run_session(tmp)
    print("cmdc retention probes: an 80-round session, offline summarizer, trigger 6,000 tokens, keep 6")
    print(table(checks))
    print(f"\n{len(checks)} compactions; all checks hold: {all(c.ok for c in checks)}")


if __name__ == "__main__":
    trio.run(main)
