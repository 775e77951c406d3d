"""TypeSafe's System One API as decider speaks it (docs/systemone.md), whatever carries
it (the HTTP API, the Python API, `decider run --systemone`):

    schema   the wire shape (pydantic)
    mapping  System One requests to decider's, and decider's answers back
    render   a state or a criterion (text or JSON) as prompt text
"""
