"""Live streams, in the service's event loop: one poller per watched run
(:mod:`~app.live.hubs`, reading the store in worker threads) and the server-sent events
it encodes once for every stream of the run (:mod:`~app.live.sse`). The route that opens
a stream is :mod:`app.routes.stream`.
"""
