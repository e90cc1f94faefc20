"""The version of cmdc: from the installed package's metadata, else the source tree's own."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

SOURCE_VERSION = "0.1.0"
"""The version in this source tree (`pyproject.toml` reads it from here): what `__version__`
falls back to when cmdc runs from a checkout that is not installed."""


def _version() -> str:
    try:
        return version("cmdc")
    except PackageNotFoundError:
        return SOURCE_VERSION


__version__ = _version()
