"""The old path of `cmdc.store.search` (the shared search ranking helpers): this name is that module.

`sys.modules` maps `cmdc._search` to `cmdc.store.search` itself, so imports and monkeypatches of the
old path reach the real module. (A package rather than `_search.py`, so that git still sees the
move as a rename.)"""

import sys
from typing import TYPE_CHECKING

from ..store import search as _moved

if TYPE_CHECKING:
    from ..store.search import *  # noqa: F403

sys.modules[__name__] = _moved
