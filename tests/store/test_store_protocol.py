"""The one store protocol: both shipped stores satisfy it (mypy checks the assignments in
`cmdc.store.file.store` and `cmdc.store.postgres.store`; this checks the signatures at run time
too), its methods are fully typed (no `**options`), and a store belongs to whoever opened it:
no process-wide cache hands one compactor's store (and its `on_event`) to another."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from fakes import state_in

from cmdc import Compactor, Event, Message, OffloadStore
from cmdc.store import FileStore, JournalReader, Store, open_store
from cmdc.store.protocol import Checkpoints, Leases
from cmdc.testing import RecordingSummarizer, conversation


def _members(protocol: type) -> dict[str, inspect.Signature | None]:
    """A protocol's methods and their signatures (None for a property)."""
    out: dict[str, inspect.Signature | None] = {}
    for klass in protocol.__mro__:
        for name, value in vars(klass).items():
            if name.startswith("_") or name in out:
                continue
            if isinstance(value, property):
                out[name] = None
            elif callable(value):
                out[name] = inspect.signature(value)
    return out


def _same_shape(protocol: type, cls: type) -> list[str]:
    """How `cls`'s methods differ from `protocol`'s: missing, or other parameter names, kinds
    or defaults (a store may add keyword-only parameters with defaults)."""
    problems = []
    for name, wanted in _members(protocol).items():
        if wanted is None:  # an attribute (`checkpoints`): the isinstance checks see it on instances
            continue
        got = getattr(cls, name, None)
        if got is None:
            problems.append(f"{name}: missing")
            continue
        have = inspect.signature(got).parameters
        for param in wanted.parameters.values():
            mine = have.get(param.name)
            if mine is None or mine.kind != param.kind or mine.default != param.default:
                problems.append(f"{name}({param.name}): {mine} is not {param}")
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in have.values()):
            problems.append(f"{name}: takes **options")
    return problems


def test_the_file_store_has_the_protocols_methods_as_typed(tmp_path: Path) -> None:
    assert _same_shape(Store, FileStore) == []
    assert isinstance(FileStore(tmp_path), Store)
    assert isinstance(open_store(tmp_path), Store)


def test_the_postgres_store_has_the_protocols_methods_as_typed() -> None:
    pytest.importorskip("psycopg")
    from cmdc.store.postgres.store import PostgresStore

    assert _same_shape(Store, PostgresStore) == []
    assert isinstance(PostgresStore("postgresql://nobody@localhost:1/none"), Store)  # not connected


def test_the_bare_journal_is_a_reader_not_a_store(tmp_path: Path) -> None:
    """`OffloadStore` (the public journal class) reads like any store, so recall and the UI take
    it; it has no checkpoints or leases, so it is not a `Store`."""
    assert _same_shape(JournalReader, OffloadStore) == []
    journal = OffloadStore(tmp_path)
    assert isinstance(journal, JournalReader)
    assert not isinstance(journal, Store)
    assert journal.location("a1") == str(tmp_path / "a1.jsonl")


def test_the_protocol_is_one_with_leases_and_checkpoints() -> None:
    assert issubclass(Store, Leases) and issubclass(Store, JournalReader)
    assert _members(Store)["checkpoints"] is None  # a property giving `Checkpoints`
    assert {"save", "load", "delete", "agents"} <= set(_members(Checkpoints))
    assert "on_numbered" in _members(Store)["append"].parameters  # type: ignore[union-attr]


async def test_an_unknown_append_option_is_a_type_error(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="bogus"):
        await FileStore(tmp_path).append("a1", [Message.user("x")], bogus=1)  # type: ignore[call-arg]
    assert not (tmp_path / "a1.jsonl").exists()


async def test_two_compactors_on_one_directory_do_not_share_a_store_or_its_on_event(tmp_path: Path) -> None:
    """Each compactor opens its own store of the offload directory, carrying its own `on_event`
    (a process-wide cache used to give the second compactor the first one's store, so the
    first's sink got the second's events)."""
    first_events: list[Event] = []
    second_events: list[Event] = []
    first = Compactor(RecordingSummarizer(), on_event=first_events.append)
    second = Compactor(RecordingSummarizer(), on_event=second_events.append)
    state = state_in(tmp_path, conversation(30), compact_trigger=("messages", 20))
    config = first.compact_config(state)
    a, b = first.store_for(config), second.store_for(config)
    assert a is not b and isinstance(a, FileStore) and isinstance(b, FileStore)
    await a.append("a1", [Message.user("one"), Message.user("two")])
    journal = tmp_path / "offload" / "a1.jsonl"
    lines = journal.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b"one", b"0ne")  # the first record's checksum no longer matches
    journal.write_bytes(b"\n".join(lines))
    assert [m.text for m in await b.read("a1")] == ["two"]  # read through the second compactor's store
    assert [e.kind for e in second_events] == ["journal_damaged"]
    assert first_events == []  # the first compactor hears nothing of the second's reads
    await first.aclose()
    await second.aclose()


async def test_a_compactor_closes_only_the_store_it_opened(tmp_path: Path) -> None:
    state = state_in(tmp_path, conversation(10))
    mine = Compactor(RecordingSummarizer())
    config = mine.compact_config(state)
    opened = mine.store_for(config)
    await opened.append("a1", [Message.user("kept")])
    await mine.aclose()
    reopened = mine.store_for(config)  # closed and forgotten: the next use opens a new one
    assert reopened is not opened
    assert [m.text for m in await reopened.read("a1")] == ["kept"]
    await mine.aclose()

    given = FileStore(tmp_path / "given")
    theirs = Compactor(RecordingSummarizer(), store=given)
    assert theirs.store_for(theirs.compact_config(state)) is given
    await theirs.aclose()  # not its store: left open, still the one it uses
    assert theirs.store_for(theirs.compact_config(state)) is given
    await given.append("a1", [Message.user("still usable")])
    assert [m.text for m in await given.read("a1")] == ["still usable"]
