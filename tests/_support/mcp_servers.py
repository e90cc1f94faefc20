"""The real MCP servers of the MCP tests: two from the npm registry, one from PyPI.

    python -m tests._support.mcp_servers fetch     # install the npm ones (pinned by tests/npm/package-lock.json)
    python -m tests._support.mcp_servers status    # where they are

`@modelcontextprotocol/server-everything` and `@modelcontextprotocol/server-filesystem` are
installed with `npm ci` (the lockfile pins every version) into `$CMDC_MCP_CACHE`, else
`~/.cache/cmdc/mcp`; the tests run their installed `bin` scripts directly with node, so nothing
reaches the network at test time (no `npx`). `mcp-server-time` comes from PyPI with the `dev`
extra and runs as `python -m mcp_server_time`.

Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

FETCH_COMMAND = "python -m tests._support.mcp_servers fetch"
SPEC = Path(__file__).resolve().parents[1] / "npm"
BINS = ("mcp-server-everything", "mcp-server-filesystem")


def cache_dir() -> Path:
    explicit = os.environ.get("CMDC_MCP_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cmdc" / "mcp"


def _stamp() -> str:
    return hashlib.sha256((SPEC / "package-lock.json").read_bytes()).hexdigest()


def installed() -> bool:
    stamp = cache_dir() / "installed.sha256"
    return stamp.is_file() and stamp.read_text().strip() == _stamp() and all(bin_path(b).is_file() for b in BINS)


def bin_path(name: str) -> Path:
    return cache_dir() / "node_modules" / ".bin" / name


def fetch() -> None:
    if installed():
        print(f"mcp servers: cached in {cache_dir()}", file=sys.stderr)
        return
    npm = shutil.which("npm")
    if npm is None:
        raise SystemExit("mcp servers: npm is not on PATH (install node and npm)")
    target = cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copyfile(SPEC / name, target / name)
    (target / "installed.sha256").unlink(missing_ok=True)
    subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"], cwd=target, check=True
    )
    (target / "installed.sha256").write_text(_stamp() + "\n")
    print(f"mcp servers: installed in {target}", file=sys.stderr)


def main(argv: list[str]) -> None:
    command = argv[0] if argv else "status"
    if command == "fetch":
        fetch()
    elif command == "status":
        print(f"{cache_dir()}: {'installed' if installed() else 'not installed (' + FETCH_COMMAND + ')'}")
    else:
        raise SystemExit(f"usage: {FETCH_COMMAND} | python -m tests._support.mcp_servers status")


if __name__ == "__main__":
    main(sys.argv[1:])
