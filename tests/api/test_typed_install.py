"""Type checkers work after the README's install command (`pip install -e .`): the editable
install is a plain `.pth` path entry (hatchling), not an import hook mypy cannot follow, and
`mypy --strict` on a user's program that uses cmdc's typed API passes."""

from __future__ import annotations

import ast
import subprocess
import sys
import sysconfig
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

USER_PROGRAM = """
import trio
import cmdc
from cmdc.providers import SimulatedModel


class Audit(cmdc.Plugin):
    async def after_compact(self, ctx: cmdc.AfterCompact) -> None:
        print(ctx.report.tokens_before - ctx.report.tokens_after)


@cmdc.tool
async def read_file(path: str) -> str:
    \"\"\"Read a file.\"\"\"
    return path


async def main() -> None:
    async with cmdc.open_runtime() as rt:
        agent = await rt.spawn("a1", SimulatedModel(), tools=[read_file], plugins=[Audit()])
        reply: cmdc.Message = await agent.prompt("hi")
        state: cmdc.State = await agent.state()
        print(reply.text, state.compactions, cmdc.__version__)


trio.run(main)
"""

TYPO = """
import cmdc


class Audit(cmdc.Plugin):
    async def after_compact(self, ctx: cmdc.AfterCompact) -> None:
        print(ctx.report.tokens_befor)
"""


def build_editable(tmp_path: Path) -> Path:
    pytest.importorskip("hatchling")
    code = "import sys; from hatchling.build import build_editable; print(build_editable(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return tmp_path / done.stdout.strip().splitlines()[-1]


def test_the_editable_install_is_a_plain_path_entry(tmp_path: Path) -> None:
    wheel = build_editable(tmp_path)
    assert wheel.name.startswith("cmdc_agents-")  # the distribution's name, not PyPI's unrelated `cmdc`
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert any(n.startswith("cmdc_agents-") and n.endswith(".dist-info/METADATA") for n in names), names
        pths = [n for n in names if n.endswith(".pth")]
        assert len(pths) == 1, names
        assert zf.read(pths[0]).decode().split() == [str(ROOT)]
    assert not [n for n in names if n.endswith(".py")], names  # no import-hook finder module


def test_mypy_strict_sees_cmdc_after_an_editable_install(tmp_path: Path) -> None:
    """A fresh environment (cmdc's dependencies from this one) where cmdc is only reachable
    through the editable wheel's `.pth`, as `pip install -e .` leaves it."""
    wheel = build_editable(tmp_path / "wheel")
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    with zipfile.ZipFile(wheel) as zf:  # what pip does with the wheel's files
        zf.extractall(site)
    deps = sysconfig.get_paths()["purelib"]  # trio, attrs, structlog, orjson
    (site / "_deps.pth").write_text(deps + "\n")
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(USER_PROGRAM))
    typo = tmp_path / "typo.py"
    typo.write_text(textwrap.dedent(TYPO))

    command = [sys.executable, "-m", "mypy", "--strict", "--python-executable", str(python)]
    command += ["--cache-dir", str(tmp_path / "cache"), str(program), str(typo)]
    done = subprocess.run(
        command,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    # the program type-checks; the typo is caught, since the hooks' contexts are typed
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert errors == [
        'typo.py:7: error: "CompactionReport" has no attribute "tokens_befor"; maybe "tokens_before"?  [attr-defined]'
    ], done.stdout + done.stderr


def test_no_attrs_default_is_set_by_a_decorator() -> None:
    """pyright reads attrs classes through `dataclass_transform`, which does not see a default
    set by `@field.default`: `TokenUsage(input_tokens=10, output_tokens=3)` (docs/providers.md)
    failed pyright with 'Argument missing for parameter "total_tokens"' while mypy's attrs plugin
    passed it. A default goes in `attrs.field(default=...)` (`attrs.Factory(f, takes_self=True)`)."""
    found = []
    for path in sorted((ROOT / "cmdc").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                found += [
                    f"{path.relative_to(ROOT)}:{d.lineno}"
                    for d in node.decorator_list
                    if isinstance(d, ast.Attribute) and d.attr == "default" and isinstance(d.value, ast.Name)
                ]
    assert found == []
