"""The daemon (`decider serve`): an engine process and the front ends that feed it.

    daemon          the daemon's life: one state machine, the supervisor of the processes
    engine_process  the engine process: its main, and the supervisor's handle on it
    engine_loop     the engine process's one thread of work: queue, batches, deadlines
    engine_client   a front end's side of the engine socket
    messages        every message between the processes, typed
    frontend        what every front end does with a request: plan, send, read
    workers         the extra front-end processes (--frontends N)
    servers         one process's gRPC server (and HTTP API) over its front end
    servicer        the gRPC methods; convert: protobuf <-> decider; interceptor: errors,
                    ids, metrics and logs of every call
    listeners       where the daemon listens, on what terms, one daemon per address
    metrics         Prometheus metrics summed over the processes; systemd: sd_notify
"""
