"""The faults of a pass that writes nothing, as the guard must see them, for any engine
that owns its output buffer (the fault hook: engines/faults.py)."""

from __future__ import annotations

import pytest

from decider.errors import EngineNoLogits
from decider.guard import LogitsGuard

TELLS = (("skip-decode", "sentinel"), ("zero-logits", "zeros"), ("stale-logits", "previous pass"))


def assert_unwritten_rows_refused(engine, job, other, fault_file) -> LogitsGuard:
    """After a whole call on `job`, a faulty call on `other` (same labels) leaves the
    sentinel, zeros or the previous call's rows, and the guard refuses each; the fault
    is taken. Returns the guard, which has seen the last whole call."""
    guard = LogitsGuard(engine.info.sentinel)
    for fault, tell in TELLS:
        guard.check([job], engine.score([job]))
        fault_file.write_text(fault)
        with pytest.raises(EngineNoLogits, match=tell):
            guard.check([other], engine.score([other]))
        assert not fault_file.exists()
    return guard
