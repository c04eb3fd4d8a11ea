"""What every request meets before its route runs, in the service's event loop.

The ASGI middleware :func:`app.main.create_app` stacks, outermost first:
:mod:`~app.middleware.headers` (security headers on every answer),
:mod:`~app.middleware.health` (a storage failure as 503, remembered for ``/healthz``),
:mod:`~app.middleware.security` (the Host check of a loopback service, and the bootstrap
token), :mod:`~app.middleware.head` (HEAD answered as GET), :mod:`~app.middleware.access`
(who may do what: 401, 403, 429) and :mod:`~app.middleware.limits` (413 for a body too
large). Access asks :mod:`~app.middleware.roles` for the role a route needs,
:mod:`~app.middleware.identity` who the request comes from, and
:mod:`~app.middleware.penalty` whether the client has guessed tokens too often.
"""
