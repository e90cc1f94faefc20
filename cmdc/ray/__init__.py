"""cmdc agents on a Ray cluster (extra `ray`): `async with cmdc.ray.open_cluster(...) as rt`.

The entry point of `cmdc.cluster` (see `cmdc.cluster.runtime`): this module *is* that one (an
alias). Importing it imports ray; `import cmdc` never does."""

import sys

from ..cluster import runtime as _cluster
from ..cluster.runtime import *  # noqa: F403  # the names, for type checkers

sys.modules[__name__] = _cluster
