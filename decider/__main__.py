"""`python -m decider`: the `decider` command."""

import sys

from .commands import main

sys.exit(main())
