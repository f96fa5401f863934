"""The web console (issue 21): a read-only HTTPS view of the cell, its superpods' block
maps, OCS use, core reservations and the aggregation tree, updated live.

    app.py       Starlette routes: pages, JSON snapshots, server-sent events, sign-in
    backends.py  the gRPC reads (the services' public API only; never Redis)
    views.py     protobuf -> the JSON each view draws (pure)
    hub.py       watch streams and periodic reads -> "this changed" signals for SSE
    sessions.py  signed-in viewers: their bearer token, kept server-side
    static/      the page, its script and style (no build step, no CDN)
"""
