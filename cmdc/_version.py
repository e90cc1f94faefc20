"""The version of cmdc: from the installed distribution's metadata, else the source tree's own.

The import name is `cmdc`; the distribution is `cmdc-agents` (`cmdc` on PyPI is an unrelated
package, so its metadata is never read here)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "cmdc-agents"
"""The distribution's name (pyproject's `[project] name`): what `pip install` takes."""

SOURCE_VERSION = "0.1.0"
"""The version in this source tree (`pyproject.toml` reads it from here): what `__version__`
falls back to when cmdc runs from a checkout that is not installed."""


def install_hint(extras: str) -> str:
    """How to install an extra (`"postgres"`, `"ray,postgres"`): from a package index, and from
    a checkout of the source."""
    return f"pip install '{DISTRIBUTION}[{extras}]' (from a checkout: pip install -e '.[{extras}]')"


def _version(distribution: str = DISTRIBUTION) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return SOURCE_VERSION


__version__ = _version()
