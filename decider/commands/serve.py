"""`decider serve`, the daemon under its config file and flags, and `decider health`,
the standard gRPC health check against one."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from . import EXIT_OK, EXIT_REFUSED, flag_config

if TYPE_CHECKING:
    from ..config import Config

def cmd_serve(args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    # the daemon's processes sum their metrics through files here (decider/metrics.py);
    # prometheus_client reads this when it is first imported, which must come after
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir = tempfile.mkdtemp(
        prefix="decider-metrics-")
    try:
        return _serve(args)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from ..config import FLAGS, check_socket_dirs, load_config, with_flags
    from ..logs import configure
    from ..service.listeners import check_listeners

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
        from ..http.serve import check_http

        check_http(cfg)
    from ..service.daemon import serve

    return asyncio.run(serve(cfg, read))


def cmd_health(args: argparse.Namespace) -> int:
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
