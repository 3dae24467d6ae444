"""`python -m intercept ...` is the `intercept` command."""

import sys

from ._cli import main

sys.exit(main())
