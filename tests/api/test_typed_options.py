"""mypy sees the options where they are declared once: a user script that misspells or mistypes
a `Compactor`, `HTTPSettings`, provider or `CompactConfig` option fails `mypy --strict` on that
line, and one that uses them as documented passes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

GOOD = """
import attrs
from cmdc import Compactor, CompactConfig, Runtime, State
from cmdc.compaction import CompactorOptions, Threshold
from cmdc.providers import AnthropicProvider, HTTPSettings, OpenAIProvider, ReplyLimits

c = Compactor(retries=2, plugins=[], summarizer_timeout=30.0)
c.options = attrs.evolve(c.options, retries=5)
d = Compactor.from_options(CompactorOptions(retries=1, pin_task=False))
n: int = d.options.retries
p = OpenAIProvider("m", base_url="http://x", settings=HTTPSettings(timeout=5.0), max_retries=1)
q = AnthropicProvider("m", timeout=None, headers={"a": "b"}, limits=ReplyLimits(max_tool_calls=3))
s = State(agent_id="a", config=CompactConfig(keep=("messages", 4), triggers=Threshold("tokens", 9000)))
t = State(agent_id="a", config={"compact_keep": ("messages", 4)})


async def spawn(rt: Runtime) -> None:
    await rt.spawn("a", q, config=CompactConfig(keep=("messages", 4)), max_steps=3)
"""

BAD = """
from cmdc import Compactor, CompactConfig
from cmdc.providers import AnthropicProvider, HTTPSettings, OpenAIProvider

Compactor(retrys=2)
Compactor(summarizer_timeout="soon")
OpenAIProvider("m", timout=5.0)
AnthropicProvider("m", max_retries="3")
HTTPSettings(deadline="never")
CompactConfig(keep=("messages", "6"))
Compactor().retries
"""


def test_mypy_checks_every_option_where_it_is_declared(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    (tmp_path / "good.py").write_text(textwrap.dedent(GOOD))
    (tmp_path / "bad.py").write_text(textwrap.dedent(BAD))
    env = {**os.environ, "MYPYPATH": str(ROOT)}  # this checkout's cmdc, whatever is installed
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), "good.py", "bad.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    errors = [line.split("  [")[0] for line in done.stdout.splitlines() if ": error:" in line]
    assert errors == [
        'bad.py:5: error: Unexpected keyword argument "retrys" for "Compactor"; did you mean "retries"?',
        'bad.py:6: error: Argument "summarizer_timeout" to "Compactor" has incompatible type "str"; '
        'expected "float | None"',
        'bad.py:7: error: Unexpected keyword argument "timout" for "OpenAIProvider"; did you mean "timeout"?',
        'bad.py:8: error: Argument "max_retries" to "AnthropicProvider" has incompatible type "str"; expected "int"',
        'bad.py:9: error: Argument "deadline" to "HTTPSettings" has incompatible type "str"; expected "float | None"',
        'bad.py:10: error: Argument "keep" to "CompactConfig" has incompatible type "tuple[str, str]"; '
        'expected "Threshold | tuple[str, int | float]"',
        'bad.py:11: error: "Compactor" has no attribute "retries"',
    ], done.stdout + done.stderr
