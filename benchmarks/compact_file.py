"""`cmdc compact` on a large chat file: wall time and peak memory of the command.

Run: python -m benchmarks.compact_file [--mb 100] [--format jsonl|json] [--keep-file PATH]

Writes a conversation file of about `--mb` megabytes (OpenAI-style messages: a user request,
an assistant tool call, its ~1 KB tool result, an assistant answer, repeated; the issue's file
had 95,231 messages in 100 MB), then runs `python -m cmdc compact FILE` in a child process and
prints its wall time and peak resident memory (the child's `ru_maxrss`, from
`resource.getrusage(RUSAGE_CHILDREN)`), next to the targets: time <= 15 s, peak <= 3x the file.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

TARGET_SECONDS = 15.0
TARGET_RATIO = 3.0
WORDS = [f"w{i}" for i in range(3_000)] + ["error", "fixed", "config", "parser", "tests", "module"]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(WORDS, k=n))


def write_chat(path: Path, size: int, fmt: str = "jsonl", seed: int = 0) -> int:
    """Write about `size` bytes of chat messages to `path`; return how many messages."""
    rng = random.Random(seed)
    count = written = 0
    objects: list[dict[str, object]] = [{"role": "system", "content": "You are a careful coding agent."}]
    step = 0
    with path.open("wb") as f:
        if fmt == "json":
            f.write(b"[\n")
        first = True
        while written < size or objects:
            if not objects:
                call = f"call_{step}"
                objects = [
                    {"role": "user", "content": f"Step {step}: " + _text(rng, 30)},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": call,
                                "type": "function",
                                "function": {
                                    "name": "read_file",
                                    "arguments": orjson.dumps({"path": f"src/m{step}.py"}).decode(),
                                },
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": call, "content": _text(rng, 560)},
                    {"role": "assistant", "content": _text(rng, 60)},
                ]
                step += 1
            obj = objects.pop(0)
            data = orjson.dumps(obj)
            if fmt == "json":
                data = (b"" if first else b",\n") + data
            else:
                data += b"\n"
            f.write(data)
            first = False
            written += len(data)
            count += 1
        if fmt == "json":
            f.write(b"\n]\n")
    return count


def run(path: Path, out: Path) -> tuple[float, float, int, int]:
    """Run `cmdc compact` on `path`; return (wall seconds, CPU seconds, peak RSS in bytes, exit
    code). The CPU time (user + system) is the steadier figure on a shared machine."""
    env = {**os.environ}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "cmdc", "compact", str(path), "--out", str(out), "--offload-dir", str(out.parent / "j")],
        env=env,
        capture_output=True,
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    peak = after.ru_maxrss * 1024  # kilobytes on Linux; the only child so far
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr.decode(errors="replace"))
    return elapsed, cpu, peak, proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0, help="size of the chat file in MB (default 100)")
    parser.add_argument("--format", choices=("jsonl", "json"), default="jsonl")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cmdc-bench-compact-") as tmp:
        path = Path(tmp) / f"chat.{args.format}"
        messages = write_chat(path, int(args.mb * 1_000_000), args.format)
        size = path.stat().st_size
        seconds, cpu, peak, code = run(path, Path(tmp) / f"out.{args.format}")
        ratio = peak / size
        print(f"cmdc compact: {size / 1e6:.1f} MB, {messages:,} messages ({args.format})")
        print(
            f"  time {seconds:.1f} s wall, {cpu:.1f} s CPU "
            f"(target <= {TARGET_SECONDS:.0f} s; load average {os.getloadavg()[0]:.1f})"
        )
        print(f"  peak RSS {peak / 1e6:.0f} MB = {ratio:.2f}x the file (target <= {TARGET_RATIO:.0f}x)")
        print(f"  exit code {code}")
        return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
