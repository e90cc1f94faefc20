"""The old path of `cmdc.store.cache` (the process-wide store cache): this name is that module.

`sys.modules` maps `cmdc._stores` to `cmdc.store.cache` itself, so imports and monkeypatches of the
old path reach the real module. (A package rather than `_stores.py`, so that git still sees the
move as a rename.)"""

import sys
from typing import TYPE_CHECKING

from ..store import cache as _moved

if TYPE_CHECKING:
    from ..store.cache import *  # noqa: F403

sys.modules[__name__] = _moved
