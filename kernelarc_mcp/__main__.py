"""``python -m kernelarc_mcp``: the ``kernelarc`` command line."""

import sys

from .cli import main

sys.exit(main())
