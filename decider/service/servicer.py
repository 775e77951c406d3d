"""The gRPC servicer: each method from proto, to the front end, back to proto. Errors,
request ids, metrics and logs are the interceptor's (observer.py)."""

from __future__ import annotations

import asyncio
import time

from ..catalog import Catalog
from ..errors import DeciderError
from ..v1 import decider_pb2 as pb
from ..v1 import decider_pb2_grpc as pb_grpc
from .convert import item_error, request_from_proto, response_to_proto
from .frontend import Frontend
from .interceptor import Observer, request_id


def deadline_of(context) -> float | None:
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def caller_of(context) -> str:
    """The TCP connection a call came on (ipv4:host:port), "" over a unix socket."""
    peer = context.peer() or ""
    return "" if peer.startswith("unix:") else peer


class DeciderService(pb_grpc.DeciderServicer):
    def __init__(self, frontend: Frontend, catalog: Catalog, observer: Observer) -> None:
        self.frontend = frontend
        self.catalog = catalog
        self.observer = observer

    async def Decide(self, request, context):
        outcome = await self.frontend.submit(request_from_proto(request), deadline_of(context),
                                             request.model, caller=caller_of(context))
        return response_to_proto(outcome)

    async def DecideBatch(self, request, context):
        """Admitted whole or refused whole (frontend.admit_batch says on what terms); each
        item then answered, refused, logged and counted on its own."""
        caller = caller_of(context)
        self.frontend.admit_batch(len(request.requests), caller)
        rid, deadline = request_id(context), deadline_of(context)

        async def item(k: int, req: pb.DecideRequest) -> pb.DecideBatchItem:
            started, item_id = time.monotonic(), f"{rid}.{k}"
            try:
                outcome = await self.frontend.submit(request_from_proto(req), deadline,
                                                     req.model, admitted=True, caller=caller)
            except DeciderError as e:
                self.observer.record("DecideItem", item_id, started, e.reason)
                return pb.DecideBatchItem(error=item_error(e))
            response = response_to_proto(outcome)
            self.observer.record("DecideItem", item_id, started, "OK",
                                 prompt_tokens=response.usage.prompt_tokens)
            return pb.DecideBatchItem(response=response)

        items = await asyncio.gather(*(item(k, r) for k, r in enumerate(request.requests)))
        return pb.DecideBatchResponse(items=items)

    async def ListModels(self, request, context):
        served = self.frontend.current
        entries = dict(self.catalog.entries)
        if served is not None:  # a model served from a path is not in the catalog
            entries.setdefault(served.facts.name, self.catalog.get(served.facts.name))
        out = []
        for name, entry in sorted(entries.items()):
            loaded = served is not None and name == served.facts.name
            status = pb.ModelStatus(name=name, engine=entry.engine, loaded=loaded,
                                    is_default=loaded)
            if loaded:
                info = served.facts.info
                status.MergeFrom(pb.ModelStatus(
                    engine=served.facts.engine, n_ctx=info.n_ctx, n_ctx_train=info.n_ctx_train,
                    weights=info.weights, model_sha256=served.facts.sha256))
            out.append(status)
        return pb.ListModelsResponse(models=out)
