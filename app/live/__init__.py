"""Live streams, in the service's event loop: one poller per watched run
(:mod:`~scalewatch.app.live.hubs`, reading the store in worker threads) and the server-sent events
it encodes once for every stream of the run (:mod:`~scalewatch.app.live.sse`). The route that opens
a stream is :mod:`scalewatch.app.routes.stream`.
"""
