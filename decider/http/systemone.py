"""The System One routes: POST /v1/systemone (and with a trailing slash, which clients
send: served, not redirected) and GET /v1/models."""

from __future__ import annotations

import structlog
from fastapi import FastAPI, Request
from starlette.responses import Response

from ..errors import InvalidRequest, Unavailable
from ..service.frontend import Frontend
from ..systemone.mapping import (
    ignored_fields,
    legacy_names,
    model_asked,
    parse_body,
    to_decider,
)
from ..systemone.schema import ModelCard, ModelList, SystemOneResponse, ValidationFailed
from .calls import admit, answer, authorize
from .errors import json_response
from .observer import HttpObserver
from .openapi import SECURED, refusals

log = structlog.get_logger("decider.http")


def add_systemone(app: FastAPI, frontend: Frontend, settings, observer: HttpObserver) -> None:
    async def systemone(request: Request) -> Response:
        """Answer typed questions about one state."""
        caller, deadline, raw = await admit(request, settings)
        body = parse_body(raw)
        if ignored := ignored_fields(body):
            log.debug("unknown fields ignored", fields=ignored)
            observer.ignored(len(ignored))
        asked = to_decider(body)
        request.state.questions = len(asked.request.questions)
        if settings.log_text:
            request.state.text = asked.request.text
        try:
            outcome = await answer(frontend, asked.request,
                                   model_asked(body.model, settings.vendor_names),
                                   deadline, caller, request)
        except InvalidRequest as e:
            raise asked.bad_body(e) from None
        request.state.outcome = "OK"
        request.state.prompt_tokens = outcome.decision.usage.prompt_tokens
        out = asked.response(outcome)
        if settings.legacy_names:
            return json_response(200, legacy_names(out.model_dump(mode="json")))
        return Response(out.model_dump_json(), media_type="application/json")

    app.post("/v1/systemone", response_model=SystemOneResponse,
             responses={422: {"model": ValidationFailed}} | refusals(
                 400, 401, 404, 405, 408, 413, 415, 429, 500, 503, 504),
             openapi_extra={**SECURED, "requestBody": {"required": True, "content": {
                 "application/json": {"schema": {
                     "$ref": "#/components/schemas/SystemOneRequest"}}}}})(systemone)
    app.post("/v1/systemone/", include_in_schema=False)(systemone)

    @app.get("/v1/models", response_model=ModelList, openapi_extra=SECURED,
             responses=refusals(401, 503))
    async def models(request: Request) -> Response:
        """The model served here, under its name and each alias."""
        authorize(settings.keys, request)
        m = frontend.facts()
        if m is None:
            raise Unavailable("no model is loaded yet")
        card = ModelCard(name=m.name, description=m.description, release_date=m.release_date,
                         x_n_ctx=m.info.n_ctx, x_engine=m.engine, x_sha256=m.sha256)
        cards = [card, *(card.model_copy(update={
            "name": a, "description": f"{m.name} under another name: {m.description}"})
            for a in frontend.aliases)]
        doc = ModelList(models=cards).model_dump(mode="json")
        if settings.legacy_names:
            doc["models"] = [{**c, "n_ctx": c["x_n_ctx"], "engine": c["x_engine"],
                              "sha256": c["x_sha256"]} for c in doc["models"]]
        return json_response(200, doc)
