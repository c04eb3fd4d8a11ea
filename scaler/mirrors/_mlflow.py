"""``MLflow``: steps as metrics of the user's MLflow run, or of one the mirror starts."""

from __future__ import annotations

from typing import Any

from ._base import Mirror, MirroredStep, RunLinks, require

BATCH = 1000  # the most metrics one log_batch call takes


class MLflow(Mirror):
    """Logs each step's values as MLflow metrics, at the optimizer step, in batches.

    It writes to the run active in the training thread when the scaler's run opens (its
    first step), on the tracking URI the user configured; with none active, it starts one
    there (in the configured experiment) and ends it when the scaler closes. Needs
    ``pip install scalewatch[mlflow]``.
    """

    name = "mlflow"

    def __init__(self) -> None:
        super().__init__()
        self._mlflow: Any = require("mlflow", "mlflow", "scalewatch.mirrors.MLflow")
        self._run_id: str | None = None
        self._tracking_uri: str | None = None
        self._client: Any = None
        self._started = False

    @property
    def run_id(self) -> str | None:
        """The MLflow run written to (None until the mirror has written)."""
        return self._run_id

    def attach(self) -> None:
        mlflow = self._mlflow
        active = mlflow.active_run()  # the training thread's own: MLflow keeps one a thread
        self._run_id = None if active is None else active.info.run_id
        self._tracking_uri = mlflow.get_tracking_uri()
        self._client = None
        self._started = False

    def _client_and_run(self) -> tuple[Any, str]:
        if self._client is None:
            self._client = self._mlflow.MlflowClient(tracking_uri=self._tracking_uri)
        if self._run_id is None:
            self._run_id = self._mlflow.start_run().info.run_id  # active in this thread only
            self._started = True
        return self._client, self._run_id

    def describe(self, links: RunLinks) -> None:
        from mlflow.entities import RunTag

        client, run_id = self._client_and_run()
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in links.as_tags().items()])

    def write(self, steps: list[MirroredStep]) -> None:
        from mlflow.entities import Metric

        client, run_id = self._client_and_run()
        metrics = [
            Metric(key, value, int(step.wall_time * 1000), step.step)
            for step in steps
            for key, value in step.values.items()
        ]
        for start in range(0, len(metrics), BATCH):
            client.log_batch(run_id, metrics=metrics[start : start + BATCH])

    def close(self) -> None:
        if self._started:
            self._mlflow.end_run()  # the run this thread started
            self._started = False
