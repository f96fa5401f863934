"""`python -m lightpath` is the `lightpath` command."""

import sys

from lightpath.cli import main

sys.exit(main())
