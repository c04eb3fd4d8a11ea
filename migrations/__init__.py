"""Alembic environment and revisions of the scalewatch store.

Run through :func:`scalewatch.store.engine.upgrade`, which builds the Alembic configuration
in code and hands this environment an open connection; no ``alembic.ini`` is needed.
"""
