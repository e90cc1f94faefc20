"""The old path of `cmdc.runtime.bus`: this module *is* that one (an alias)."""

import sys

from ..runtime import bus as _bus
from ..runtime.bus import *  # noqa: F403  # the names, for type checkers

sys.modules[__name__] = _bus
