"""`python -m cmdc`: the `cmdc` command."""

import sys

from .cli import main

sys.exit(main())
