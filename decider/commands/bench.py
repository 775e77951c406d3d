"""`decider bench`: the engine in this process, engines side by side on the same work
(on random weights of a real shape with --shape), or a running daemon (--server)."""

from __future__ import annotations

import argparse

from ..errors import FieldViolation, InvalidRequest, ModelNotFound
from . import EXIT_OK, flag_config, load_options


def cmd_bench(args: argparse.Namespace) -> int:
    from ..bench.daemon import run_service_bench
    from ..bench.engines import run_bench, run_engine_bench

    cfg = flag_config(args)
    if args.engines:
        if args.questions < 1 or 9 * args.questions + 1 > min(
                (*args.prompt_tokens, args.batch_tokens)):
            raise InvalidRequest([FieldViolation("--questions", "at least 1, each 9 tokens "
                                                 "of every prompt after its BOS")])
        run_engine_bench(bench_model_path(args), args.engines.split(","), repeat=args.repeat,
                         prompt_tokens=args.prompt_tokens, n_ctx=cfg.model.n_ctx or 4096,
                         questions=args.questions, batch_tokens=args.batch_tokens)
        return EXIT_OK
    if args.server:
        run_service_bench(args.server, clients=args.clients, per_client=args.per_client,
                          tokens=args.tokens, processes=args.client_processes,
                          model=args.model, max_batch=args.max_batch, pid=args.pid,
                          floor_read_mb=args.floor_read_mb, **load_options(cfg))
        return EXIT_OK
    run_bench(args.model, repeat=args.repeat, tokens=args.tokens, limits=cfg.limits,
              **load_options(cfg))
    return EXIT_OK


def bench_model_path(args: argparse.Namespace) -> str:
    import tempfile

    import numpy as np

    from ..catalog import Catalog

    catalog = Catalog()
    entry = catalog.get(args.model or catalog.default)
    if not args.shape:
        return str(catalog.locate(entry))
    from decider.bench import random_gemma4
    from decider.bench.random_gguf import Q4_K_M, SHAPES, write_tiny_gemma3

    if args.shape not in (*SHAPES, *random_gemma4.SHAPES):
        raise InvalidRequest([FieldViolation("--shape", f"one of {', '.join(SHAPES)}, "
                                             f"{', '.join(random_gemma4.SHAPES)}")])
    needs_one = "llama" in (e.partition(":")[0] for e in args.engines.split(","))
    if args.shape in random_gemma4.SHAPES:  # no Gemma 4 tokenizer here: a made-up one
        path = f"{tempfile.mkdtemp()}/{args.shape}-random.gguf"
        random_gemma4.write_gemma4(path, np.random.default_rng(0), types=random_gemma4.QAT_Q4_0,
                                   raw=True, synthetic_vocab=needs_one,
                                   **random_gemma4.SHAPES[args.shape])
        return path
    # the llama engine loads no GGUF without a tokenizer: the model's, or where it is absent
    # a made-up one; the torch engines score token ids without one (and without llama.cpp)
    tokenizer = None
    if needs_one:
        try:
            tokenizer = catalog.locate(entry)
        except ModelNotFound:
            pass
    path = f"{tempfile.mkdtemp()}/{args.shape}-random.gguf"
    write_tiny_gemma3(path, np.random.default_rng(0), types=Q4_K_M, tokenizer_from=tokenizer,
                      synthetic_vocab=needs_one and tokenizer is None, **SHAPES[args.shape])
    return path

