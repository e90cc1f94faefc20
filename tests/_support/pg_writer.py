"""A writer process for the PostgreSQL crash test: appends one-message batches for ever and
prints each acknowledged message id (after `append` returned) on its own line, flushed."""

from __future__ import annotations

import sys

import trio

from cmdc import Message
from cmdc.postgres import PostgresStore


async def main(url: str, agent: str) -> None:
    store = await PostgresStore.open(url)
    i = 0
    while True:
        batch = [Message.user(f"crash record {i} part {k}") for k in range(3)]
        await store.append(agent, batch, compaction=i)
        print(" ".join(m.id for m in batch), flush=True)
        i += 1


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
