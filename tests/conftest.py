"""Shared fixtures. `postgres_url`: a fresh, empty PostgreSQL database for one test.

PostgreSQL tests run when `CMDC_TEST_POSTGRES_URL` names a server (`eval "$(scripts/pg_test.sh
start)"` starts a throwaway one) and are skipped otherwise, unless `CMDC_REQUIRE_POSTGRES=1`
(as in CI), which makes a missing server or driver a failure.

Hypothesis runs under the profile "cmdc" (loaded here, before any test module builds its
settings, so theirs inherit it): no per-example deadline and no too-slow health check, since
tests never depend on timing and a loaded 2-core machine stalls single examples; example counts
stay hypothesis' default (100) unless a test sets its own. `CMDC_HYPOTHESIS_PROFILE=thorough`
runs ten times as many examples.
"""

from __future__ import annotations

import os
import secrets
import urllib.parse
from collections.abc import Iterator

import pytest
import structlog
from hypothesis import HealthCheck, settings

settings.register_profile("cmdc", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", settings.get_profile("cmdc"), max_examples=1_000)
settings.load_profile(os.environ.get("CMDC_HYPOTHESIS_PROFILE", "cmdc"))


@pytest.fixture(autouse=True)
def structlog_as_found() -> Iterator[None]:
    """Every test leaves structlog as it found it. `structlog.testing.capture_logs` and
    `structlog.configure` leave it configured, and a configured structlog takes cmdc's events
    (printed to stdout by its default logger) from the stdlib logger `cmdc` that `caplog` reads."""
    was_configured, config = structlog.is_configured(), structlog.get_config()
    yield
    structlog.reset_defaults()
    if was_configured:
        structlog.configure(**config)


HOW = (
    'PostgreSQL tests need a server: run `eval "$(scripts/pg_test.sh start)"`, rerun pytest, '
    "then `scripts/pg_test.sh stop`"
)


def _require() -> bool:
    return os.environ.get("CMDC_REQUIRE_POSTGRES", "") not in ("", "0")


def with_database(url: str, name: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + name))


@pytest.fixture
def postgres_url() -> Iterator[str]:
    base = os.environ.get("CMDC_TEST_POSTGRES_URL", "")
    if not base:
        if _require():
            pytest.fail("CMDC_REQUIRE_POSTGRES is set but CMDC_TEST_POSTGRES_URL is not. " + HOW)
        pytest.skip(HOW)
    try:
        import psycopg
    except ImportError:
        if _require():
            raise
        pytest.skip("PostgreSQL tests need psycopg: pip install -e '.[postgres]'")
    name = f"cmdc_t_{secrets.token_hex(6)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    try:
        yield with_database(base, name)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
