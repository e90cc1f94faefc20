"""`cmdc compact --offload-dir URL` and `cmdc history URL AGENT` over the PostgreSQL store."""

from __future__ import annotations

from pathlib import Path

import pytest

from cmdc.cli import main
from tests.cli.test_cli import conversation, write_jsonl


def test_compact_into_postgres_then_read_history(
    postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_jsonl(tmp_path / "chat.jsonl", conversation())
    assert main(["compact", str(path), "--offload-dir", postgres_url, "--keep", "4"]) == 0
    out = capsys.readouterr().out
    assert "#journal/chat" in out and f"cmdc history {postgres_url} chat" in out
    assert not (tmp_path / ".cmdc").exists()  # nothing went to files

    assert main(["history", postgres_url, "chat"]) == 0
    listing = capsys.readouterr().out
    assert "records from 1 compaction(s)" in listing and "mod0.py" in listing

    assert main(["history", postgres_url, "chat", "--search", "mod3"]) == 0
    hits = capsys.readouterr().out
    assert "mod3" in hits and "no records match" not in hits

    assert main(["history", postgres_url, "chat", "--range", "1", "2"]) == 0
    assert capsys.readouterr().out.strip()

    md = tmp_path / "chat.md"
    assert main(["history", postgres_url, "chat", "--markdown", str(md)]) == 0
    assert "## Compaction" in md.read_text()


def test_history_errors_over_a_url(postgres_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["history", postgres_url, "nobody"]) == 2
    assert "no journal records" in capsys.readouterr().err
    assert main(["history", postgres_url, "../etc"]) == 2
    assert main(["history", "postgresql://nobody@/x?host=/nonexistent&connect_timeout=1", "a1"]) in (1, 2)


def test_history_verify_and_repair_over_a_url(
    postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import psycopg

    path = write_jsonl(tmp_path / "chat.jsonl", conversation())
    assert main(["compact", str(path), "--offload-dir", postgres_url, "--keep", "4"]) == 0
    capsys.readouterr()
    # --verify reads the store's journal and says so (it printed the listing and exited 0 before)
    assert main(["history", postgres_url, "chat", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "clean: no damaged record" in out and "0 record(s) of attempts never committed" in out
    assert main(["history", postgres_url, "nobody", "--verify"]) == 2
    assert "no journal for agent 'nobody'" in capsys.readouterr().err
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("UPDATE cmdc_records SET crc = crc # 1 WHERE agent_id = 'chat' AND seq = 2")
    assert main(["history", postgres_url, "chat", "--verify"]) == 1
    assert "damaged: 1 record(s): 2" in capsys.readouterr().out
    assert main(["history", postgres_url, "chat"]) == 0
    listed = capsys.readouterr().out
    # --repair moves the damaged row aside (to cmdc_damaged) and keeps every other one
    assert main(["history", postgres_url, "chat", "--repair"]) == 0
    assert "repaired: 1 damaged record(s) moved aside" in capsys.readouterr().out
    assert main(["history", postgres_url, "chat", "--verify"]) == 0
    assert "clean: no damaged record" in capsys.readouterr().out
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        assert conn.execute("SELECT seq, reason FROM cmdc_damaged WHERE agent_id = 'chat'").fetchall() == [
            (2, "checksum mismatch")
        ]
    assert main(["history", postgres_url, "chat", "--repair"]) == 0
    assert "clean: nothing to repair" in capsys.readouterr().out
    assert main(["history", postgres_url, "chat"]) == 0
    assert capsys.readouterr().out == listed  # readers skipped record 2 before; it is all that moved
    assert main(["history", postgres_url, "nobody", "--repair"]) == 2


def test_history_over_an_unreachable_url_fails_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # no server behind the URL: the work failed (1, as in every subcommand) after the store's few
    # bounded attempts, not the pool reconnecting (and logging each failure) for its whole timeout
    url = f"postgresql://nobody@/db?host={tmp_path}"
    assert main(["history", url, "chat"]) == 1
    err = capsys.readouterr().err
    assert "cannot open" in err and "pool" not in err
    assert main(["history", url, "chat", "--search", "x"]) == 1
    assert "StoreUnavailable" in capsys.readouterr().err
    conversation = tmp_path / "c.jsonl"
    conversation.write_text('{"role": "user", "content": "hi"}\n' * 12)
    assert main(["compact", str(conversation), "--offload-dir", url, "--keep", "2"]) == 1
    assert "StoreUnavailable" in capsys.readouterr().err
    assert not (tmp_path / "c.compacted.jsonl").exists()
