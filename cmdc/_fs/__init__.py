"""The old path of `cmdc.store.fs` (the file helpers): this name is that module.

`sys.modules` maps `cmdc._fs` to `cmdc.store.fs` itself, so imports and monkeypatches of the
old path reach the real module. (A package rather than `_fs.py`, so that git still sees the
move as a rename.)"""

import sys
from typing import TYPE_CHECKING

from ..store import fs as _moved

if TYPE_CHECKING:
    from ..store.fs import *  # noqa: F403

sys.modules[__name__] = _moved
