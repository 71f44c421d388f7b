"""`python -m aspen_cgi.cli`: the `aspen` command."""

import sys

from . import main

sys.exit(main())
