"""Measuring decider (`decider bench`), never imported by what serves:

    engines     engines side by side on the same score() work, one process each
    daemon      a running daemon at N concurrent gRPC clients, beside the engine alone
    http_load   the same over the System One HTTP API
    random_gguf, random_gemma4   models of real shapes and random weights, as GGUF files
"""
