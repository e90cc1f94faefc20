"""The old path of `cmdc.store.file.index` (the file store's search index): this name is that module.

`sys.modules` maps `cmdc._index` to `cmdc.store.file.index` itself, so imports and monkeypatches of the
old path reach the real module. (A package rather than `_index.py`, so that git still sees the
move as a rename.)"""

import sys
from typing import TYPE_CHECKING

from ..store.file import index as _moved

if TYPE_CHECKING:
    from ..store.file.index import *  # noqa: F403

sys.modules[__name__] = _moved
