"""A process in the lease race test. It opens a runtime with name leases on the store, prints
`ready`, waits for a `go` line on stdin, then tries to spawn (with `resume=True`) each of the
given agent names at once, and prints `won NAME` or `lost NAME` for each. It prompts each agent
it won once, prints `done`, and holds the names until an `end` line (or stdin closing)."""

from __future__ import annotations

import sys

import trio

from cmdc import NameLeased, open_runtime
from cmdc.providers import ScriptedProvider


async def main(store: str, names: list[str]) -> None:
    async with open_runtime(store=store, lease_ttl=30, log_events=False) as rt:
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)  # go
        won: list[str] = []

        async def race(name: str) -> None:
            try:
                await rt.spawn(name, ScriptedProvider(["ok"], cycle=True), resume=True)
            except NameLeased:
                print(f"lost {name}", flush=True)
                return
            won.append(name)
            print(f"won {name}", flush=True)

        async with trio.open_nursery() as nursery:
            for name in names:
                nursery.start_soon(race, name)
        for name in won:
            await rt.get(name).prompt(f"hello from {rt.lease_owner}")
        print("done", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)  # end


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2:])
