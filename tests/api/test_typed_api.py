"""The typed faces a type checker sees: `spawn`'s agent options are typed (`SpawnOptions`), so a
misspelt or mistyped keyword is a mypy error in the user's program, not a surprise at run time;
and both agent handles, the local `AgentRef` and the cluster's `ClusterAgentRef`, are
`AgentHandle`s. mypy --strict runs on small user programs against this checkout's cmdc."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

GOOD = """
import cmdc
from cmdc import AgentHandle, AgentOptions, AgentRef, SpawnOptions
from cmdc.providers import SimulatedModel
from cmdc.ray import ClusterAgentRef, ClusterRuntime


async def spawn_forms(rt: cmdc.Runtime, cluster: ClusterRuntime) -> None:
    await rt.spawn("a", SimulatedModel())
    await rt.spawn("b", SimulatedModel(), max_steps=5, tool_timeout=None, restart="permanent")
    await rt.spawn("c", SimulatedModel(), options=AgentOptions(max_steps=5), max_queued=9)
    given: SpawnOptions = {"max_steps": 3, "summarizer_timeout": 1.5}
    await rt.spawn("d", SimulatedModel(), **given)
    await cluster.spawn("e", SimulatedModel(), max_children=2)


async def talk(agent: AgentHandle) -> str:
    await agent.send("first")
    reply = await agent.prompt("second")
    await agent.ping()
    state = await agent.state()
    outcome = await agent.compact("focus on the API")
    if agent.running:
        await agent.stop()
    return f"{agent.name}: {reply.text} {state.compactions} {outcome.state.agent_id}"


def local(ref: AgentRef) -> AgentHandle:
    return ref


def remote(ref: ClusterAgentRef) -> AgentHandle:
    return ref
"""

BAD = """
import cmdc
from cmdc.providers import SimulatedModel


async def main(rt: cmdc.Runtime) -> None:
    await rt.spawn("a", SimulatedModel(), max_step=5)
    await rt.spawn("b", SimulatedModel(), max_steps="5")
    await rt.spawn("c", SimulatedModel(), restart="sometimes")
"""


def mypy(tmp_path: Path, **programs: str) -> list[str]:
    for name, source in programs.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    command = [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--cache-dir", str(tmp_path / "cache")]
    command += ["--config-file", os.devnull, *(f"{name}.py" for name in programs)]
    env = {**os.environ, "MYPYPATH": str(ROOT)}  # this checkout's cmdc, before an installed one
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return [line for line in done.stdout.splitlines() if ": error:" in line]


def test_spawn_keywords_and_handles_are_typed(tmp_path: Path) -> None:
    pytest.importorskip("ray")  # the cluster ref's module imports ray (its types too)
    errors = mypy(tmp_path, good=GOOD, bad=BAD)
    assert not [e for e in errors if e.startswith("good.py")], errors
    bad = [e for e in errors if e.startswith("bad.py")]
    assert len(bad) == 3, errors
    assert bad[0].startswith("bad.py:7: error:") and '"max_step"' in bad[0]
    assert bad[1].startswith("bad.py:8: error:") and '"max_steps"' in bad[1] and '"str"' in bad[1]
    assert bad[2].startswith("bad.py:9: error:") and '"restart"' in bad[2]


NAMES = """
import cmdc

restarts = cmdc.mcp.Restarts()
tracing: cmdc.otel.Tracing | None = None
compactor = cmdc.Compacter()
"""


def test_a_misspelt_top_level_name_is_a_type_error(tmp_path: Path) -> None:
    # `cmdc.mcp` and `cmdc.otel` are imported on first use; a module `__getattr__` the type
    # checker saw would type every `cmdc.<anything>` as `object`, so a misspelt name would pass
    # as an `object` ("not callable" at best) instead of "has no attribute".
    errors = mypy(tmp_path, names=NAMES)
    assert len(errors) == 1, errors
    assert errors[0].startswith("names.py:6: error:") and 'no attribute "Compacter"' in errors[0], errors
