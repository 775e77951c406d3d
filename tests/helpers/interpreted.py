"""Imported first by the test modules that run Triton kernels in the interpreter on the
CPU: the interpreter must be on before triton is first imported (triton.language
decorates its own helpers, tl.zeros and the rest, at import), so a process that already
imported it to compile (the GPU tests first) skips those modules."""

from __future__ import annotations

import os
import sys

import pytest

if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("triton was imported without TRITON_INTERPRET=1 in this process: "
                "run this file in its own pytest process", allow_module_level=True)
os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton", reason="triton is not installed (the gpu extra)")
