"""The System One HTTP API (POST /v1/systemone, GET /v1/models): decider as a local drop-in
for the typed-decision clients people already use. docs/systemone.md has the mapping.

    schema    the wire shape (pydantic)          mapping   System One <-> decider
    render    state and criteria as prompt text  errors    refusals -> status and body
    auth      bearer API keys                    body      bounded, decoded request bodies
    front     request ids, logs, metrics         app       the FastAPI application
    serve     uvicorn in the daemon's loop, over the daemon's front end (decider.frontend)
    load      the HTTP load generator behind `decider bench --server http://...`

Only `app`, `serve`, `body`, `front` and `errors` import FastAPI, Starlette or uvicorn:
the CLI and the Python API use `mapping` without them.
"""
