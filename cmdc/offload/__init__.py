"""The old path of `cmdc.store.file.journal` (the file store's journal): this name is that module.

`sys.modules` maps `cmdc.offload` to `cmdc.store.file.journal` itself, so imports and monkeypatches of the
old path reach the real module. (A package rather than `offload.py`, so that git still sees the
move as a rename.)"""

import sys
from typing import TYPE_CHECKING

from ..store.file import journal as _moved

if TYPE_CHECKING:
    from ..store.file.journal import *  # noqa: F403

sys.modules[__name__] = _moved
