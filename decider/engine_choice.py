"""Which engine loads a model: the one asked for, the one its catalog entry pins, or by
default (engine "auto") the one that fits the host: the Triton engine where CUDA is
present and it runs the architecture, llama.cpp elsewhere; a checkpoint directory, which
llama.cpp cannot read, always goes to the Triton engine (on the CPU: reference kernels).
A load option the chosen engine lacks is still refused by name (load_engine): it is
the operator who says which engine an option was meant for. The choice is logged with
its reason and carried in every decision's provenance."""

from __future__ import annotations

from pathlib import Path

import structlog

from .catalog import ModelEntry

log = structlog.get_logger("decider")


def choose_engine(entry: ModelEntry, path: Path, asked: str | None = None) -> str:
    if asked:
        name, why = asked, "asked for"
    elif entry.engine != "auto":
        name, why = entry.engine, "the catalog entry names it"
    elif Path(path).is_dir():
        name, why = "triton", "a checkpoint directory: only the torch engines read it"
    else:
        from .engines.host import triton_fits  # torch only if it is installed and needed

        fits, why = triton_fits(Path(path))
        name = "triton" if fits else "llama"
    log.info("engine chosen", model=entry.name, engine=name, reason=why)
    return name
