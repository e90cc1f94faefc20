"""The old path of `cmdc.store.postgres.store` (the PostgreSQL store): this name is that module.

`sys.modules` maps `cmdc.postgres` to `cmdc.store.postgres.store` itself, so imports and monkeypatches of the
old path reach the real module. (A package rather than `postgres.py`, so that git still sees the
move as a rename.)"""

import sys
from typing import TYPE_CHECKING

from ..store.postgres import store as _moved

if TYPE_CHECKING:
    from ..store.postgres.store import *  # noqa: F403

sys.modules[__name__] = _moved
