"""``python -m bench``: see ``bench.runner``."""

import sys

from .runner import main

sys.exit(main())
