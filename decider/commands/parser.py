"""The `decider` command line: every command's flags, and the types that check them."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..engines import DTYPES
from ..questions import Limits

USAGE_ERROR = 2  # argparse's own exit code for a usage error, and decider's EXIT_USAGE


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's exit code, decider's prefix on its text
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, f"decider: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="decider", description="Typed decisions about a text from the "
                "label-token logits of a local language model.")
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
    run.add_argument("--abstain-below", type=float, metavar="P", help="abstain when the "
                     "answer's confidence (calibrated where a calibration applies) is below P")
    run.add_argument("--min-label-mass", type=float, metavar="M",
                     help="abstain when the label mass is below M")
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
    run.add_argument("--timeout", type=_seconds, default=120.0, metavar="SECONDS",
                     help="with --server: the deadline of each request (default 120)")

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

    cal = sub.add_parser("calibrate", help="fit a calibration on labelled examples")
    cal.add_argument("model", help="catalog name or .gguf path: the model to calibrate")
    cal.add_argument("examples", help="labelled examples, JSONL (docs/calibration.md)")
    cal.add_argument("--output", "-o", required=True, metavar="FILE",
                     help="where to write the calibration (JSON)")
    cal.add_argument("--contextual", action="store_true", help="no labels: fit each "
                     "question's bias on content-free texts (the gold answers are ignored)")
    cal.add_argument("--error-budget", type=_share, metavar="E", help="set each question's "
                     "abstain_below to the confidence that errs at most E held out")
    cal.add_argument("--min-examples", type=_at_least(2), default=50, help="a question with "
                     "fewer takes its shape's fallback temperature (default 50)")
    cal.add_argument("--folds", type=_at_least(2), default=5, help="cross-validation folds")
    cal.add_argument("--seed", type=int, default=0, help="the folds' shuffle")
    _add_load_flags(cal)

    ev = sub.add_parser("eval", help="measure accuracy and calibration on labelled examples")
    ev.add_argument("model", help="catalog name or .gguf path")
    ev.add_argument("examples", help="labelled test examples, JSONL")
    ev.add_argument("--train", metavar="FILE", help="labelled training examples: the "
                    "majority class and the TF-IDF baseline, and, without --calibration, a "
                    "calibration fitted on them")
    ev.add_argument("--bins", type=_at_least(2), default=15, help="equal-mass ECE bins (15)")
    ev.add_argument("--plots", metavar="DIR", help="write each question's reliability "
                    "diagram and coverage curve as a PNG into DIR")
    ev.add_argument("--json", metavar="FILE", help="write the report as JSON ('-': stdout)")
    ev.add_argument("--seed", type=int, default=0, help="the calibration's folds' shuffle")
    _add_load_flags(ev)

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
    bench.add_argument("--pid", type=_at_least(1),
                       help="with --server: the daemon's pid, to measure its CPU per request "
                       "beside a bare server's (found by itself for a unix socket)")
    bench.add_argument("--client-processes", type=_at_least(1), default=4,
                       help="with --server: processes the clients are spread over")
    bench.add_argument("--floor-read-mb", type=_at_least(0), default=0,
                       help="with --server and the daemon's pid: MB the floor's second "
                            "process reads a call, as a CPU engine reads its weights (the "
                            "model file's size for llama.cpp on the CPU)")
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
    p.add_argument("--calibration", metavar="FILE", help="apply a `decider calibrate` file to "
                   "every answer (refused if made for another model or template)")
    p.add_argument("--engine", help="llama | triton | reference (default: the one that fits "
                   "the host, or the catalog entry's)")
    p.add_argument("--threads", type=int, help="CPU threads for the engine")
    p.add_argument("--dtype", choices=DTYPES,
                   help="activation dtype of the triton and reference engines (default: "
                   "float16 on CUDA, float32 on the CPU)")
    p.add_argument("--no-prefix-cache", dest="prefix_cache", action="store_const", const=False,
                   help="keep no prefix cache: every request reads its whole prompt")
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


def _share(value: str) -> float:
    try:
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0.0 < share < 1.0:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1), got {value!r}")
    return share


def _seconds(value: str) -> float:
    try:
        t = float(value)
    except ValueError:
        t = -1.0
    if not 0 < t < 86400:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{value!r}: give seconds in (0, 86400)")
    return t


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
