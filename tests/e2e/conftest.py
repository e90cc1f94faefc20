"""The e2e suite's server: one `llama-server` per test session, started when a test first needs
it and stopped by PID at the end. Without a cached server the tests are skipped with the command
that gets one; `CMDC_E2E=require` (CI) makes that a failure, `CMDC_E2E=0` skips them anyway.

The agent runs (20+ turns each, many minutes on a small machine: a compaction whose model
summaries are refused costs four summarizer requests before the offline fallback) are `long`:
they run only with `CMDC_E2E=long`, so neither the everyday `python -m pytest` nor CI waits
for them; `python -m benchmarks.e2e_llama` runs them and prints the table."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from tests.e2e import llama_server

_timing = {"seconds": 0.0, "tests": 0, "started": 0.0}


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
        yield server


@pytest.fixture
def long_run(request: pytest.FixtureRequest) -> llama_server.LlamaServer:
    """The server, for a test that takes minutes: skipped unless `CMDC_E2E=long`."""
    if os.environ.get("CMDC_E2E") != "long":
        pytest.skip("a 20-turn agent run takes minutes: CMDC_E2E=long python -m pytest tests/e2e")
    server: llama_server.LlamaServer = request.getfixturevalue("llama")
    return server


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "e2e" in report.keywords and report.when == "call" and not report.skipped:
        _timing["seconds"] += report.duration
        _timing["tests"] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _timing["tests"]:
        terminalreporter.write_line(
            f"e2e: {_timing['tests']} tests against llama-server in {_timing['seconds']:.0f} s "
            f"(server start {_timing['started']:.1f} s)"
        )
