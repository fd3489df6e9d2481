"""``python -m jupyter_agentruns.cli``: the same as ``jupyter agentruns``."""

import sys

from . import main

sys.exit(main())
