"""Name leases: a name is active in at most one runtime among all sharing a store (issue 17).

Both stores have leases (the PostgreSQL store: a lease row with an expiry and a fencing token
checked by every write; the file store: a flock held while the lease is). The race test runs
two real processes that try to activate the same names at the same instant."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import trio

from cmdc import ConfigError, LeaseLost, Message, NameLeased, State, open_runtime
from cmdc.providers import ModelRequest, ScriptedProvider
from cmdc.store import Leases, Store, open_store

ROOT = Path(__file__).resolve().parents[2]


def leases(store: Store) -> Leases:
    assert isinstance(store, Leases)
    return store


def echo(request: ModelRequest) -> str:
    users = [m.text for m in request.messages if m.role == "user"]
    return f"echo {len(users)}: {users[-1]}"


async def test_a_held_name_is_refused_to_another_owner_and_free_after_release(store: Store) -> None:
    one = leases(store)
    other = leases(open_store(getattr(store, "url", None) or str(getattr(store, "root", ""))))
    await other.start()  # type: ignore[attr-defined]
    try:
        token = await one.acquire_lease("a1", "owner-1", ttl=30)
        with pytest.raises(NameLeased, match="a1"):
            await other.acquire_lease("a1", "owner-2", ttl=30)
        again = await one.acquire_lease("a1", "owner-1", ttl=30)  # the same owner: a new grant
        assert again > token
        await one.release_lease("a1", "owner-1", token)  # an older grant's release changes nothing
        with pytest.raises(NameLeased):
            await other.acquire_lease("a1", "owner-2", ttl=30)
        assert await one.renew_leases("owner-1", ttl=30) == ["a1"]
        await one.release_lease("a1", "owner-1", again)
        assert await other.acquire_lease("a1", "owner-2", ttl=30) > 0
        assert await other.acquire_lease("b1", "owner-2", ttl=30) > 0
        assert await other.break_leases("owner-2") == 2
        assert await one.acquire_lease("b1", "owner-1", ttl=30) > 0
    finally:
        await one.break_leases("owner-1")
        await other.aclose()  # type: ignore[attr-defined]


async def test_hostile_lease_arguments_are_refused(store: Store) -> None:
    for bad in ("../x", "", "a/b", ".hidden", "x" * 200):
        with pytest.raises(ConfigError):
            await leases(store).acquire_lease(bad, "o", ttl=1)
    if "postgres" in type(store).__name__.lower():
        for ttl in (0, -1, float("nan"), float("inf"), True, "5"):
            with pytest.raises(ConfigError):
                await leases(store).acquire_lease("a", "o", ttl=ttl)  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            await leases(store).acquire_lease("a", "", ttl=1)
    for kw in ({"lease_ttl": 0}, {"lease_ttl": True}, {"lease_ttl": 1, "lease_owner": ""}):
        with pytest.raises(ConfigError):
            async with open_runtime(store=store, **kw):  # type: ignore[arg-type]
                pass
    with pytest.raises(ConfigError, match="store"):
        async with open_runtime(lease_ttl=5):
            pass


async def test_postgres_expiry_takeover_and_fencing(postgres_url: str) -> None:
    """A stale owner (its lease expired and was taken) cannot write: journal append, commit and
    checkpoint save all raise LeaseLost, inside the write's own transaction."""
    a = open_store(postgres_url)
    b = open_store(postgres_url)
    await a.start()
    await b.start()
    try:
        la, lb = leases(a), leases(b)
        await la.acquire_lease("x", "A", ttl=0.3)
        await a.checkpoints.save(State(agent_id="x").append(Message.user("by A")))
        with pytest.raises(NameLeased, match="'A'"):
            await lb.acquire_lease("x", "B", ttl=30)
        await trio.sleep(0.5)  # A's lease expires (A stalled: no renewal)
        await lb.acquire_lease("x", "B", ttl=30)
        assert await la.renew_leases("A", ttl=30) == []  # A learns it lost the name
        await la.acquire_lease("y", "A", ttl=30)
        await lb.acquire_lease("z", "B", ttl=30)
        stale = open_store(postgres_url)  # a store that still believes it holds x (as A did)
        await stale.start()
        try:
            stale._held["x"] = ("A", 1)  # type: ignore[attr-defined]
            with pytest.raises(LeaseLost):
                await stale.checkpoints.save(State(agent_id="x").append(Message.user("stale")))
            with pytest.raises(LeaseLost):
                await stale.append("x", [Message.user("stale journal")])
            with pytest.raises(LeaseLost):
                await stale.commit("x", ["k0"])
            with pytest.raises(LeaseLost):
                await stale.checkpoints.delete("x")
        finally:
            await stale.aclose()
        await b.checkpoints.save(State(agent_id="x").append(Message.user("by B")))
        loaded = await b.checkpoints.load("x")
        assert loaded is not None and [m.text for m in loaded.messages] == ["by B"]
        assert await b.read("x") == []
        # takeover of an owner known to be dead, without waiting for the expiry
        await la.acquire_lease("z", "A", ttl=30, takeover=["B"])
        with pytest.raises(LeaseLost):
            await b.checkpoints.save(State(agent_id="z"))
    finally:
        await a.aclose()
        await b.aclose()


async def test_two_runtimes_never_have_one_name_active_and_a_lost_lease_leaves_memory(postgres_url: str) -> None:
    async with (
        open_runtime(store=postgres_url, lease_ttl=30, lease_owner="A", max_resident=10, log_events=False) as ra,
        open_runtime(store=postgres_url, lease_ttl=30, lease_owner="B", max_resident=10, log_events=False) as rb,
    ):
        xa = await ra.spawn("x", ScriptedProvider([echo], cycle=True))
        assert (await xa.prompt("one")).text == "echo 1: one"
        with pytest.raises(NameLeased, match="'A'"):
            await rb.spawn("x", ScriptedProvider([echo], cycle=True), resume=True)
        assert rb.whereis("x") is None
        # A deactivates x: the name is free, and B goes on from A's commit
        assert await ra.deactivate("x")
        await trio.sleep(0.1)  # the release runs in the background
        xb = await rb.spawn("x", ScriptedProvider([echo], cycle=True), resume=True)
        assert (await xb.prompt("two")).text == "echo 2: two"
        # A's handle now needs an activation, which B's lease refuses
        with pytest.raises(NameLeased, match="'B'"):
            await xa.prompt("three")
        # B is declared dead (its lease broken) and A takes over; B's agent, still in memory,
        # cannot write: its next turn fails with LeaseLost and it leaves memory
        async with open_runtime(store=postgres_url, log_events=False) as admin:
            assert await leases(admin.store).break_leases("B") == 1  # type: ignore[arg-type]
        assert (await xa.prompt("three")).text == "echo 3: three"
        with pytest.raises(LeaseLost):
            await xb.prompt("from the stale owner")
        assert not xb.resident and xb.running
        state = await xa.state()
        texts = [m.text for m in state.messages]
        assert texts == ["one", "echo 1: one", "two", "echo 2: two", "three", "echo 3: three"]


def racer(store: str, names: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests._support.lease_racer", store, *names],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def read_until(proc: subprocess.Popen[str], last: str) -> list[str]:
    assert proc.stdout is not None
    lines = []
    while True:
        line = proc.stdout.readline()
        assert line, f"racer ended early: {lines}"
        lines.append(line.strip())
        if line.strip() == last:
            return lines


def tell(proc: subprocess.Popen[str], word: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(word + "\n")
    proc.stdin.flush()


async def test_two_processes_race_to_activate_the_same_names_and_one_wins_each(store_spec: str) -> None:
    names = [f"r{i}" for i in range(20)]
    procs = [racer(store_spec, names) for _ in range(2)]
    try:
        with trio.fail_after(60):
            for p in procs:
                await trio.to_thread.run_sync(read_until, p, "ready")
            for p in procs:
                tell(p, "go")
            outcomes = [await trio.to_thread.run_sync(read_until, p, "done") for p in procs]
        for name in names:
            results = sorted(line.split()[0] for out in outcomes for line in out if line.endswith(f" {name}"))
            assert results == ["lost", "won"], (name, outcomes)
    finally:
        for p in procs:
            if p.poll() is None:
                tell(p, "end")
        for p in procs:
            assert p.wait(timeout=30) == 0
    # each name was prompted once, by its one winner
    store = open_store(store_spec)
    await store.start()
    try:
        for name in names:
            state = await store.checkpoints.load(name)
            assert state is not None
            assert [m.role for m in state.messages] == ["user", "assistant"]
    finally:
        await store.aclose()
