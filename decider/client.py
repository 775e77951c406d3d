"""A small typed client for a running decider daemon, sync and async.

    from decider.client import DeciderClient
    with DeciderClient("unix:///run/decider/decider.sock") as c:
        decision = c.decide("I was charged twice", [YesNo("Refund requested?")])

One daemon or several: the address is any gRPC target (a proxy's host:port, or
"dns:///decider.internal:50051", whose name resolves to every replica) or a list of
host:port addresses. gRPC itself balances the calls over several (round_robin over the
replicas that its health checks find SERVING: a draining one drops out before it stops
answering) and retries a call refused as UNAVAILABLE (channel_options; docs/deploy.md).

Errors raise RemoteError: the gRPC code, the ErrorInfo reason and metadata, and the
BadRequest field violations, as the server sent them.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from .answers import Decision
from .errors import DeciderError, FieldViolation
from .questions import Question, Request
from .service.convert import CODES, decision_from_proto, request_to_proto
from .v1 import decider_pb2 as pb
from .v1 import decider_pb2_grpc as pb_grpc

_KINDS = {code: kind for kind, code in CODES.items()}
SERVICE = pb.DESCRIPTOR.services_by_name["Decider"].full_name
RETRY = {"maxAttempts": 5, "initialBackoff": "0.05s", "maxBackoff": "1s",
         "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}


def channel_options(address: str | Sequence[str]) -> list[tuple[str, object]]:
    """The service config gRPC itself reads: a call answered UNAVAILABLE (a replica
    draining, stopped or unreachable: nothing computed for it) tried again, within the
    call's deadline (Decide reads and changes nothing, so a retry is always safe); and,
    where the client balances (several addresses, or a dns: name that resolves to every
    replica), round_robin over the replicas whose grpc.health.v1 status is SERVING. Not
    through a proxy (one host:port): its health is the proxy's to judge, and one
    replica's NOT_SERVING seen through it would stop every call."""
    config: dict = {"methodConfig": [{"name": [{"service": SERVICE}], "retryPolicy": RETRY}]}
    if not isinstance(address, str) or address.startswith("dns:"):
        config |= {"loadBalancingConfig": [{"round_robin": {}}],
                   "healthCheckConfig": {"serviceName": SERVICE}}
    return [("grpc.service_config", json.dumps(config)), ("grpc.enable_retries", 1)]


def target(address: str | Sequence[str]) -> str:
    """The gRPC target for one address (as given) or several host:port addresses of IP
    literals (one ipv4: or ipv6: list, which gRPC balances over)."""
    if isinstance(address, str):
        return address
    if not address:
        raise ValueError("no address given")
    hosts = [a.rpartition(":")[0].strip("[]") for a in address]
    try:
        versions = {ipaddress.ip_address(h).version for h in hosts}
    except ValueError:
        raise ValueError(f"several addresses must be IP:port, got {list(address)}; for host "
                         "names give one dns:/// target that resolves to them all") from None
    if len(versions) != 1:
        raise ValueError(f"several addresses must be all IPv4 or all IPv6, got {list(address)}")
    return f"ipv{versions.pop()}:{','.join(address)}"


class RemoteError(DeciderError):
    """An error the daemon returned. `kind` follows the gRPC code, as for local errors."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str,
                 metadata: dict[str, str], violations: Sequence[FieldViolation] = ()) -> None:
        super().__init__(message, **metadata)
        self.code = code
        self.reason = reason or code.name
        self.kind = _KINDS.get(code, "internal")
        self.violations = tuple(violations)


def _remote_error(e: grpc.RpcError) -> RemoteError:
    reason, metadata, violations = "", {}, []
    status = rpc_status.from_call(e)
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason, metadata = info.reason, dict(info.metadata)
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            violations = [FieldViolation(v.field, v.description) for v in bad.field_violations]
    return RemoteError(e.code(), reason, e.details() or "", metadata, violations)


def _open_channel(address: str | Sequence[str], credentials: grpc.ChannelCredentials | None,
                  module):
    options = channel_options(address)
    if credentials is not None:
        return module.secure_channel(target(address), credentials, options)
    return module.insecure_channel(target(address), options)


class DeciderClient:
    def __init__(self, address: str | Sequence[str], *, timeout: float | None = 30.0,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        self._channel = _open_channel(address, credentials, grpc)
        self._stub = pb_grpc.DeciderStub(self._channel)
        self.timeout = timeout

    def decide(self, text: str, questions: Sequence[Question], *, instructions: str = "",
               model: str = "") -> Decision:
        return self.decide_request(Request(text, tuple(questions), instructions), model)

    def decide_request(self, request: Request, model: str = "") -> Decision:
        return decision_from_proto(self.decide_raw(request, model))

    def decide_raw(self, request: Request, model: str = "") -> pb.DecideResponse:
        """The full response: answers, usage, timings and provenance."""
        try:
            return self._stub.Decide(request_to_proto(request, model), timeout=self.timeout)
        except grpc.RpcError as e:
            raise _remote_error(e) from None

    def list_models(self) -> pb.ListModelsResponse:
        try:
            return self._stub.ListModels(pb.ListModelsRequest(), timeout=self.timeout)
        except grpc.RpcError as e:
            raise _remote_error(e) from None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> DeciderClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncDeciderClient:
    def __init__(self, address: str | Sequence[str], *, timeout: float | None = 30.0,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        self._channel = _open_channel(address, credentials, grpc.aio)
        self._stub = pb_grpc.DeciderStub(self._channel)
        self.timeout = timeout

    async def decide(self, text: str, questions: Sequence[Question], *,
                     instructions: str = "", model: str = "") -> Decision:
        return await self.decide_request(Request(text, tuple(questions), instructions), model)

    async def decide_request(self, request: Request, model: str = "") -> Decision:
        return decision_from_proto(await self.decide_raw(request, model))

    async def decide_raw(self, request: Request, model: str = "") -> pb.DecideResponse:
        """The full response: answers, usage, timings and provenance."""
        try:
            return await self._stub.Decide(request_to_proto(request, model),
                                           timeout=self.timeout)
        except grpc.RpcError as e:
            raise _remote_error(e) from None

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncDeciderClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
