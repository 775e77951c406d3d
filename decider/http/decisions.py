"""OpenAI's Decisions API route: POST /v1/decisions, on the same front end and engine as
System One's; refusals in OpenAI's error envelope (the app's handlers choose it by path)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import Response

from ..errors import DeciderError
from ..service.frontend import Frontend
from ..systemone.decisions import parse, refused, to_decider
from ..systemone.decisions_schema import DecisionResponse, OpenAIErrorBody
from ..systemone.mapping import model_asked
from .calls import admit, answer
from .openapi import SECURED, WHY

PATH = "/v1/decisions"


def add_decisions(app: FastAPI, frontend: Frontend, settings) -> None:
    @app.post(PATH, response_model=DecisionResponse, responses={
        s: {"model": OpenAIErrorBody, "description": WHY.get(s, "A bad field, named in param")}
        for s in (400, 401, 404, 405, 408, 413, 415, 429, 500, 503, 504)},
        openapi_extra={**SECURED, "requestBody": {"required": True, "content": {
            "application/json": {"schema": {
                "$ref": "#/components/schemas/DecisionRequest"}}}}})
    async def decisions(request: Request) -> Response:
        """Answer predicate, choice and score questions about one input."""
        caller, deadline, raw = await admit(request, settings)
        body = parse(raw)
        decided = to_decider(body)
        request.state.questions = len(decided.request.questions)
        try:
            outcome = await answer(frontend, decided.request,
                                   model_asked(body.model, settings.vendor_names), deadline,
                                   caller, request)
        except DeciderError as e:
            raise refused(e) from None
        request.state.outcome = "OK"
        request.state.prompt_tokens = outcome.decision.usage.prompt_tokens
        return Response(decided.response(outcome).model_dump_json(),
                        media_type="application/json")
