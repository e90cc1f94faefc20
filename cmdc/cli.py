"""The `cmdc` command."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import trio

from .compaction import Compacted, Compactor
from .errors import CmdcError
from .offload import OffloadStore
from .state import State
from .synthetic import conversation


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cmdc", description="An actor runtime for LLM agents, on trio.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compact a long generated conversation, offline, and print the reports")
    demo.add_argument("--messages", type=_positive, default=5_000, help="messages per round (default 5000)")
    demo.add_argument("--rounds", type=_positive, default=3, help="rounds of growth and compaction (default 3)")
    demo.add_argument("--keep", type=_positive, default=20, help="messages kept after each compaction")
    demo.add_argument("--offload-dir", type=Path, default=None, help="journal directory (default: a new temp dir)")
    return parser


async def _demo(args: argparse.Namespace) -> int:
    offload_dir = args.offload_dir or Path(tempfile.mkdtemp(prefix="cmdc-demo-"))
    config = {
        "compact_trigger": [("tokens", 50_000), ("messages", args.messages)],
        "compact_keep": ("messages", args.keep),
        "compact_offload_dir": str(offload_dir),
    }
    compactor = Compactor()  # the embedded offline extractive summarizer
    state = State(agent_id="demo", config=config)
    print(f"cmdc demo: {args.rounds} rounds of {args.messages} messages, journal in {offload_dir}")
    header = f"{'round':>5} {'reason':>6} {'msgs before':>11} {'msgs after':>10} {'tokens before':>13} "
    header += f"{'tokens after':>12} {'evicted':>7} {'records':>11} {'ms':>7}"
    print(header)
    for round_no in range(1, args.rounds + 1):
        state = state.append(*conversation(args.messages, seed=round_no, system=round_no == 1))
        result = await compactor.maybe_compact(state)
        if not isinstance(result, Compacted):
            print(f"{round_no:>5} skipped: {result.reason}")
            continue
        r = result.report
        state = result.state
        print(
            f"{round_no:>5} {r.reason:>6} {r.messages_before:>11} {r.messages_after:>10} {r.tokens_before:>13} "
            f"{r.tokens_after:>12} {r.evicted:>7} {f'{r.first_seq}-{r.last_seq}':>11} {r.duration * 1000:>7.1f}"
        )
    journal = compactor.store_for(compactor.compact_config(state)).path_for(state.agent_id)
    offloaded = await OffloadStore(offload_dir).read(state.agent_id)
    print(f"\njournal: {journal} ({journal.stat().st_size:,} bytes, {len(offloaded)} messages, each once)")
    print(
        f"context now: {len(state.messages)} messages, ~{state.token_usage:,} tokens, {state.compactions} compactions"
    )
    summary = next(m for m in state.messages if m.is_summary)
    print("\nthe latest summary message begins:\n")
    print("\n".join(summary.text.splitlines()[:14]))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            return trio.run(_demo, args)
    except CmdcError as exc:
        print(f"cmdc: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 2  # pragma: no cover - argparse requires a command


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
