"""What the tests share, one home each, imported one way (``from tests._helpers.net import
free_port``):

- ``net``: ``free_port``, a port from this xdist worker's own block;
- ``waiting``: ``wait_for``, polling a condition until it holds or a timeout;
- ``records``: ``step_record``, a ``StepRecord`` with the fields a test does not care about;
- ``service``: the service's token, the runs a test adds to its store, ``auth``;
  ``serving``: the service on a thread of the test's process, its live streams' events;
- ``stored``: the store tests' control, rollup oracle and rows; ``golden``: runs whose
  every answer is known (the export's rows and CSV, a diagnosed run);
- ``processes``: ``end_process``; ``ranks``: real gloo ranks on 127.0.0.1;
- ``postgres``: a throwaway PostgreSQL server (one per xdist worker);
- ``twin``, ``nets``, ``diagnosis``: torch's scaler beside ours, small models to train;
- the background trainers and services: ``ceiling`` (a thread), ``trainer`` (a process
  with its ranks), ``harness`` (a served live run) and ``pages`` (its run page), ``faults``,
  ``load``, ``receiver``, ``histories``, ``integrations``; ``workers``: process targets;
- ``projects``: a user's project folder with ``app``, ``web``, ``migrations`` and ``scaler``
  packages of its own.
"""
