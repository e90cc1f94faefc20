"""The throwaway PostgreSQL server the store tests run against (see tests/conftest.py)."""

from __future__ import annotations

import psycopg


def test_each_test_gets_a_fresh_empty_database(postgres_url: str) -> None:
    with psycopg.connect(postgres_url) as conn:
        version = conn.execute("SHOW server_version_num").fetchone()
        tables = conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()
        name = conn.execute("SELECT current_database()").fetchone()
    assert version is not None and int(version[0]) >= 150000
    assert tables == (0,)
    assert name is not None and name[0].startswith("cmdc_t_")
