"""``python -m paper_repro``: see ``paper_repro.main``."""

import sys

from .main import main

sys.exit(main())
