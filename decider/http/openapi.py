"""The OpenAPI document as served at /openapi.json: FastAPI's, with the request schemas
(the routes parse their bodies by hand, so FastAPI does not see them), the bearer scheme,
every refusal a route can answer with TypeSafe's error shape, and a server entry."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from ..systemone.schema import Refusal

SECURED = {"security": [{"HTTPBearer": []}]}
WHY = {
    400: "Over the loaded window or the work bound (max_tokens_exceeded), or an "
         "undecodable body",
    401: "No API key, or not a valid one",
    404: "The model is not served here, or no such route",
    405: "The route takes another method",
    408: "The body did not arrive in time",
    413: "The body is over the limit (limit)",
    415: "An unsupported Content-Encoding, or images (multipart/form-data)",
    429: "The queue is full, or the key's rate limit is spent (Retry-After)",
    500: "The engine failed, or returned no logits",
    503: "Not ready, draining, or out of memory (Retry-After)",
    504: "The request's time ran out",
}


def refusals(*statuses: int) -> dict:
    """The responses entry for refusals with these statuses, each with TypeSafe's shape."""
    return {s: {"model": Refusal, "description": WHY[s]} for s in statuses}


def build(app: FastAPI, request_schemas: dict[str, type[BaseModel]]) -> dict:
    if app.openapi_schema is None:
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                          description="docs/systemone.md: the mapping to decider",
                          license_info=app.license_info,
                          servers=[{"url": "/", "description": "this daemon"}])
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for name, model in request_schemas.items():
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}), **{name: schema})
        doc["components"]["securitySchemes"] = {"HTTPBearer": {
            "type": "http", "scheme": "bearer", "description": "An API key of [http] api_keys "
            "or key_file; not asked for when none is configured (loopback)."}}
        app.openapi_schema = doc
    return app.openapi_schema
