"""The old path of `cmdc.store.file.checkpoints` (the file store's checkpoints): this name is that module.

`sys.modules` maps `cmdc.checkpoint` to `cmdc.store.file.checkpoints` itself, so imports and monkeypatches of the
old path reach the real module. (A package rather than `checkpoint.py`, so that git still sees the
move as a rename.)"""

import sys
from typing import TYPE_CHECKING

from ..store.file import checkpoints as _moved

if TYPE_CHECKING:
    from ..store.file.checkpoints import *  # noqa: F403

sys.modules[__name__] = _moved
