"""The store tests' shared fixtures: each test that takes `store` (or `store_spec`) runs on both
shipped stores, the file store in a temporary directory and PostgreSQL in a fresh database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cmdc.store import Store, open_store


@pytest.fixture(params=["file", "postgres"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store's spec: a directory, or a fresh PostgreSQL database's URL."""
    if request.param == "file":
        return str(tmp_path / "store")
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
async def store(store_spec: str) -> AsyncIterator[Store]:
    """That store, started, and closed after the test."""
    made = open_store(store_spec)
    await made.start()
    try:
        yield made
    finally:
        await made.aclose()
