"""The `decider` command, one module per group of commands (run, serve and health, models
and pull, bench); parser.py holds every flag. Answers go to stdout; logs, progress and
errors to stderr.

Exit codes: 0 success; 2 usage and validation errors (bad flag, bad field, unknown
model, bad load-time setting); 1 refusals (over the window) and engine errors.
Never interactive: with no TEXT and a terminal on stdin it refuses instead of waiting.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import import_module
from typing import TYPE_CHECKING

from ..errors import DeciderError, InvalidRequest

if TYPE_CHECKING:
    from ..config import Config

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2  # parser.USAGE_ERROR is EXIT_USAGE


def exit_code(error: DeciderError) -> int:
    return EXIT_USAGE if error.kind in ("invalid", "not_found") else EXIT_REFUSED


def flag_config(args: argparse.Namespace) -> Config:
    """The flags given, checked as the config file's keys are (a bad one exits 2 naming
    it, before anything loads). `run` and `bench` take MODEL as an argument, not a flag."""
    from ..config import FLAGS, Config, with_flags

    skip = () if args.command == "serve" else ("model",)
    return with_flags(Config(), {dest: getattr(args, dest, None) for dest in FLAGS
                                 if dest not in skip})


def load_options(cfg: Config) -> dict:
    m = cfg.model
    opts = {"engine": m.engine or None, "n_ctx": m.n_ctx or None,
            "prefix_cache_bytes": cfg.cache.budget()}
    if m.threads:
        opts["n_threads"] = m.threads
    if m.dtype:
        opts["dtype"] = m.dtype
    if m.calibration:
        opts["calibration"] = m.calibration
    return opts


def report(error: DeciderError) -> int:
    print(f"decider: {error.reason}: {error.message}", file=sys.stderr)
    return exit_code(error)


# each command's module in decider/commands, which holds its cmd_<command>(args)
COMMANDS = {"run": "run", "serve": "serve", "health": "serve", "models": "models",
            "pull": "models", "bench": "bench", "calibrate": "quality", "eval": "quality"}


def main(argv: Sequence[str] | None = None) -> int:
    from .parser import parser

    args = parser().parse_args(argv)
    from ..logs import configure

    configure(level=["warning", "info", "debug"][min(args.verbose, 2)], stream=sys.stderr)
    try:
        module = import_module(f"decider.commands.{COMMANDS[args.command]}")
        return getattr(module, f"cmd_{args.command}")(args)
    except DeciderError as e:
        if isinstance(e, InvalidRequest) and len(e.violations) > 1:
            for v in e.violations:
                print(f"decider: {v.field}: {v.description}", file=sys.stderr)
            print(f"decider: {e.reason}: {len(e.violations)} fields refused (above)",
                  file=sys.stderr)
            return exit_code(e)
        return report(e)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # stdout closed early (`| head`): stop quietly, as a shell would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141

