"""`wavepp route`: a program of its own, one OpenAI endpoint in front of prefill replicas and
decode servers (router.py, `RequestRouter`). Torch-free: it imports FastAPI, httpx and the HTTP
pieces it shares with `wavepp serve` (wavepp/openai_http.py), never the engine.

    config.py         RouteConfig: the router's options, checked where they are born
    router.py         RequestRouter: the app, its replica tables, upstream client and health task
    upstream.py       what the router does with an upstream's messages (headers, errors, bodies)
    metrics.py        the router's /metrics, read from its tables
    replica_table.py  ReplicaTable: the routing policies (cache, the default; approx;
                      least-load; round-robin), pure, shared with the simulator's replicas
    prefix_record.py  what a prefix is taken of, its chunk hashes, the approx policy's record

This file imports nothing, so that the simulator, which imports replica_table.py, loads no
HTTP stack: import the names from their modules.
"""
