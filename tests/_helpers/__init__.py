"""What the tests share, one home each, imported one way (``from tests._helpers.net import
free_port``):

- ``net``: ``free_port``, a port from this xdist worker's own block;
- ``waiting``: ``wait_for``, polling a condition until it holds or a timeout;
- ``records``: ``step_record``, a ``StepRecord`` with the fields a test does not care about;
- ``service``: the service's test client, its token and the runs a test adds to a store;
- ``processes``: ``end_process``; ``ranks``: real gloo ranks on 127.0.0.1;
- ``postgres``: a throwaway PostgreSQL server (one per xdist worker);
- ``twin``, ``nets``: torch's scaler beside ours, small models to train;
- the background trainers and services: ``ceiling`` (a thread), ``trainer`` (a process
  with its ranks), ``harness`` (a served live run), ``faults``, ``load``, ``receiver``,
  ``histories``, ``integrations``; ``workers``: process targets of the store's tests.
"""
