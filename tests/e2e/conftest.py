"""The e2e suite's server: one `llama-server` per test session, started when a test first needs
it and stopped by PID at the end. Without a cached server the tests are skipped with the command
that gets one; `CMDC_E2E=require` (CI) makes that a failure, `CMDC_E2E=0` skips them anyway.

The agent runs (four agents of 20 turns, a few minutes in all on an idle 2-core machine, many
more on a busy one) run with `CMDC_E2E=require` (CI) or `CMDC_E2E=long`, not in an everyday
`python -m pytest`; the session ends with their table (turns, compactions, summaries, seconds
per turn). `python -m benchmarks.e2e_llama` prints the same table for longer runs."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e import llama_server

_timing = {"seconds": 0.0, "tests": 0, "started": 0.0, "cpu": 0.0}
_server: list[llama_server.LlamaServer] = []


def _threads() -> int:
    return _server[0].threads if _server else 0


@pytest.fixture(scope="session")
def llama() -> Iterator[llama_server.LlamaServer]:
    setting = os.environ.get("CMDC_E2E", "")
    if setting == "0":
        pytest.skip("CMDC_E2E=0: the llama.cpp end-to-end tests are switched off")
    why = llama_server.missing()
    if why is not None:
        if setting == "require":
            pytest.fail(why)
        pytest.skip(why)
    started = time.monotonic()
    with llama_server.cached_server() as server:
        _timing["started"] = time.monotonic() - started
        _server.append(server)
        yield server
    _timing["cpu"] = server.used_cpu or 0.0


@pytest.fixture
def long_run(request: pytest.FixtureRequest) -> llama_server.LlamaServer:
    """The server, for a test that takes minutes: skipped unless `CMDC_E2E` is `require` or `long`."""
    if os.environ.get("CMDC_E2E") not in ("require", "long"):
        pytest.skip("a 20-turn agent run takes a minute or more: CMDC_E2E=long python -m pytest tests/e2e")
    server: llama_server.LlamaServer = request.getfixturevalue("llama")
    return server


_runs: list[Any] = []


@pytest.fixture
def run_table() -> list[Any]:
    """Where an agent run puts its `benchmarks.e2e_llama.RunResult`: the session prints them."""
    return _runs


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "e2e" in report.keywords and report.when == "call" and not report.skipped:
        _timing["seconds"] += report.duration
        _timing["tests"] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _runs:
        from benchmarks.e2e_llama import table

        terminalreporter.write_line("e2e agent runs (SmolLM2-135M, 2,048-token window):")
        for line in table(_runs).splitlines():
            terminalreporter.write_line("  " + line)
    if _timing["tests"]:
        terminalreporter.write_line(
            f"e2e: {_timing['tests']} tests against llama-server in {_timing['seconds']:.0f} s "
            f"(server start {_timing['started']:.1f} s, server CPU {_timing['cpu']:.0f} s with {_threads()} threads)"
        )
