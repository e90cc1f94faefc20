"""Load with faults, scaled down for CI (benchmarks/load_faults.py runs 2,000 agents x 30 turns):
200 agents x 10 turns at once, compaction on, 5% of provider calls and 1% of tool calls failing.
Every turn completes or raises a typed error; every agent ends consistent and on its own."""

from __future__ import annotations

from pathlib import Path

from benchmarks import load_faults


def test_load_with_faults(tmp_path: Path) -> None:
    lines: list[str] = []
    f = load_faults.run(200, 10, trigger=1_000, seed=3, directory=tmp_path, out=lines.append)
    assert f["failures"] == [], "\n".join(lines)
    assert f["untyped"] == 0 and f["hung"] == 0
    assert f["completed"] + sum(f["typed_errors"].values()) == f["turns"] == 2_000
    assert set(f["typed_errors"]) <= {"ProviderError", "ContextOverflow"}
    assert f["consistent_agents"] == 200
    # the faults did happen, and so did compactions of both kinds
    assert f["provider_errors"] > 0 and f["overflows"] > 0 and f["tool_errors"] > 0
    assert f["compactions"].get("auto", 0) > 0 and f["compactions"].get("forced", 0) > 0
    assert f["completed"] > 1_500
    assert any(line.startswith("throughput:") for line in lines)
    assert any("p99" in line for line in lines)
