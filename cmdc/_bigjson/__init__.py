"""The old path of `cmdc.store.bigjson` (the large-message JSON helpers): this name is that module.

`sys.modules` maps `cmdc._bigjson` to `cmdc.store.bigjson` itself, so imports and monkeypatches of the
old path reach the real module. (A package rather than `_bigjson.py`, so that git still sees the
move as a rename.)"""

import sys
from typing import TYPE_CHECKING

from ..store import bigjson as _moved

if TYPE_CHECKING:
    from ..store.bigjson import *  # noqa: F403

sys.modules[__name__] = _moved
