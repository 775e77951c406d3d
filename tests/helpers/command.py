"""`decider` as a process, for the tests that run its CLI or its daemon. Importing this
needs nothing beyond the standard library (the GPU machine's tests load conftest.py too)."""

import sys

# -P keeps the checkout's directory off sys.path, where its kernels/ would shadow the
# `kernels` package that transformers imports
DECIDER = (sys.executable, "-P", "-m", "decider")
