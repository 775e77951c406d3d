"""The HTTP transport of the System One API (POST /v1/systemone, GET /v1/models); the API
itself (schema, mapping) is decider/systemone/.

    app       the FastAPI application        errors    refusals -> status and body
    auth      bearer API keys                body      bounded, decoded request bodies
    observer  request ids, logs, metrics     serve     uvicorn in the daemon's loop
"""
