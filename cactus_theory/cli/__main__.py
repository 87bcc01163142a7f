"""``python -m cactus_theory.cli``: the ``cactus-theory`` command."""

import sys

from . import main

sys.exit(main())
