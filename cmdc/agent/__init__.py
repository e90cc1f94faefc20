"""The old path of `cmdc.runtime.agent`: this module *is* that one (an alias, so that a patch
on `cmdc.agent.X` patches the agent's own name)."""

import sys

from ..runtime import agent as _agent
from ..runtime.agent import *  # noqa: F403  # the names, for type checkers

sys.modules[__name__] = _agent
