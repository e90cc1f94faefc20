"""What tracing costs per turn: off, on a provider that records nothing, and recording.

Run: python -m benchmarks.bench_otel  (add --quick for a short run)

Each turn is a tool call and an answer from an instantly answering model (two requests, one
tool call: four spans when traced), so the figures are the runtime's own cost per turn:
- off: `open_runtime()` without `tracing=` (no tracing code runs);
- no-op: `Tracing()` on the global provider nobody set (OpenTelemetry's non-recording spans);
- SDK: `Tracing(tracer_provider=...)` with the SDK and an in-memory exporter;
- SDK + content: the same with `include_content=True`.
Figures are medians of several runs; they vary with the machine's load.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Any

import trio

import cmdc
import cmdc.otel
from benchmarks.bench_runtime import Instant, echo


async def per_turn(turns: int, tracing: Any, offload_dir: str) -> float:
    config = {"compact_offload_dir": offload_dir, "compact_trigger": ("tokens", 10_000_000)}
    async with cmdc.open_runtime(log_events=False, tracing=tracing) as rt:
        agent = await rt.spawn("a1", Instant(), tools=[echo], config=config)
        await agent.prompt("warm up")
        t0 = time.perf_counter()
        for i in range(turns):
            await agent.prompt(f"turn {i}")
        return (time.perf_counter() - t0) / turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer turns and runs (100 x 3)")
    parser.add_argument("--turns", type=int, help="turns per run (default 500)")
    parser.add_argument("--runs", type=int, help="runs per case (default 5)")
    args = parser.parse_args()
    turns, runs = (100, 3) if args.quick else (500, 5)
    turns, runs = args.turns or turns, args.runs or runs

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    def sdk(content: bool) -> cmdc.otel.Tracing:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        return cmdc.otel.Tracing(tracer_provider=provider, include_content=content)

    cases = {
        "off (no tracing=)": lambda: None,
        "no-op provider": lambda: cmdc.otel.Tracing(),
        "SDK, in-memory exporter": lambda: sdk(False),
        "SDK + include_content": lambda: sdk(True),
    }
    print(f"cost per turn (2 requests + 1 tool call), median of {runs} runs of {turns} turns")
    base: float | None = None
    with tempfile.TemporaryDirectory() as tmp:
        for label, make in cases.items():
            figures = [trio.run(per_turn, turns, make(), tmp) for _ in range(runs)]
            median = statistics.median(figures)
            base = median if base is None else base
            extra = "" if median is base else f"  (+{(median - base) * 1e6:,.0f} µs)"
            print(f"  {label:<26} {median * 1e6:>8,.0f} µs{extra}")


if __name__ == "__main__":
    main()
