"""`python -m bench`: the same as `aspen-bench`."""

import sys

from .cli import main

sys.exit(main())
