"""What every request meets before its route runs, in the service's event loop.

The ASGI middleware :func:`scalewatch.app.main.create_app` stacks, outermost first:
:mod:`~scalewatch.app.middleware.headers` (security headers on every answer),
:mod:`~scalewatch.app.middleware.health` (a storage failure as 503, remembered for ``/healthz``),
:mod:`~scalewatch.app.middleware.hosts` (the Host check of a loopback service, and the bootstrap
token), :mod:`~scalewatch.app.middleware.head` (HEAD answered as GET),
:mod:`~scalewatch.app.middleware.access` (who may do what: 401, 403, 429),
:mod:`~scalewatch.app.middleware.clients` (429 for a client with too many requests in
flight) and :mod:`~scalewatch.app.middleware.limits` (413 for a body too large, 408 for
one too slow). Access asks
:mod:`~scalewatch.app.middleware.roles` for the role a route needs,
:mod:`~scalewatch.app.middleware.identity` who the request comes from, and
:mod:`~scalewatch.app.middleware.penalty` whether the client has guessed tokens too often.
"""
