"""A field added to the step schema reaches the export, the stream, the chart series and the
trackers' mirrors and the service's ingest route with no other edit than the migration of
its columns: shown on a copy of the package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from scalewatch.store.revisions import head_revision

ROOT = Path(__file__).resolve().parents[2]
# The repository's folders as the package they install as (pyproject.toml's package-dir).
PARTS = {"scaler": "scalewatch", "app": "scalewatch/app", "web": "scalewatch/web"}
PARTS["migrations"] = "scalewatch/migrations"

AFTER = "\n\nSTEP_FIELDS: tuple[StepField, ...] = tuple("  # the end of StepRecord
FIELD = """\
    update_norm: float | None = field(
        default=None,
        metadata=column(
            Kind.FLOAT,
            nullable=True,
            rollup=_range("update_norm", last=True),
            export="weight_update_norm",
            sse="norm",
        ),
    )
"""
MIGRATION = '''\
"""The weight update's norm of each step"""

import sqlalchemy as sa
from alembic import op

revision = "f00dfeed0001"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("update_norm", sa.Float(), nullable=True))
    with op.batch_alter_table("step_rollups") as batch:
        batch.add_column(sa.Column("update_norm_min", sa.Float(), nullable=True))
        batch.add_column(sa.Column("update_norm_max", sa.Float(), nullable=True))


def downgrade() -> None:
    raise NotImplementedError
'''
# Run in the copy: a run of 3000 steps with the new field, read back every way.
PROBE = """\
import json, sys
import scalewatch
from fastapi.testclient import TestClient
from pydantic import SecretStr
from scalewatch.app.main import create_app
from scalewatch.app.settings import Settings
from scalewatch.store import StepRecord, open_store
from scalewatch.store.identities import Role, create_identity
from scalewatch.store.runs import create_run, end_run, step_values, write_steps
from scalewatch.telemetry._batches import items
from scalewatch.mirrors._base import mirrored

url = "sqlite:///" + sys.argv[1]
store = open_store(url)
run = create_run(store, name="norms", world_size=1, config={}, control={})
write_steps(store, run.id, [
    StepRecord(step=s, wall_time=float(s), scale=1024.0, overflow=False, skipped=False,
               inf_ranks=(), scale_after=1024.0, growth_tracker=s % 100, growth_interval=100,
               growth_factor=2.0, backoff_factor=0.5, control_version=0,
               update_norm=None if s % 7 == 0 else float(s % 50) + 0.25,
               lr_groups=((0.1, 0.2),) if s == 2999 else None)
    for s in range(1, 3001)
])
end_run(store, run.id)
settings = Settings(db=url, token=SecretStr("t" * 40), token_file=sys.argv[1] + ".token")
with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
    csv = client.get(f"/api/runs/{run.id}/export?format=csv&end=3").text
    jsonl = client.get(f"/api/runs/{run.id}/export?format=jsonl&end=3").text
    # A page with learning rates by group goes through the JSON encoder; one without, not.
    stream = client.get(f"/api/runs/{run.id}/stream?after=2995").text
    fast = client.get(f"/api/runs/{run.id}/stream?after=2999").text
    series = client.get(f"/api/runs/{run.id}/steps?max_points=20").json()
    # A job that records through the service sends the field, and the service takes it.
    job = {"Authorization": "Bearer " + create_identity(store, "job", Role.WRITER, by="p").token}
    opening = {"uid": "ab" * 16, "name": "sent", "world_size": 1, "config": {}, "control": {},
               "started_at": 1.0, "host": "h", "pid": 1, "torch_version": "t"}
    sent = client.post("/api/ingest/runs", json=opening, headers=job).json()["id"]
    record = StepRecord(step=1, wall_time=1.0, scale=8.0, overflow=False, skipped=False,
                        inf_ranks=(), scale_after=8.0, growth_tracker=1, growth_interval=100,
                        growth_factor=2.0, backoff_factor=0.5, control_version=0, update_norm=6.5)
    batch = {"sequence": 1, "items": items([step_values(record)], reason="")}
    client.post(f"/api/ingest/runs/{sent}/batches", json=batch, headers=job).raise_for_status()
    ingested = client.get(f"/api/runs/{sent}/export?format=jsonl").text
record = StepRecord(step=1, wall_time=1.0, scale=8.0, overflow=False, skipped=False,
                    inf_ranks=(), scale_after=8.0, growth_tracker=1, growth_interval=100,
                    growth_factor=2.0, backoff_factor=0.5, control_version=0, grad_norm=0.5)
print(json.dumps({"package": scalewatch.__file__, "csv": csv, "jsonl": jsonl,
                  "stream": stream, "fast": fast, "series": series, "ingested": ingested,
                  "mirrored": mirrored(record).values}))
"""


def _copy(into: Path) -> Path:
    package = into / "site"
    for folder, target in PARTS.items():
        shutil.copytree(
            ROOT / folder,
            package / target,
            ignore=shutil.ignore_patterns("__pycache__", "node_modules", "tests"),
            dirs_exist_ok=True,
        )
    return package


def test_a_field_declared_once_is_exported_streamed_and_charted(tmp_path: Path) -> None:
    site = _copy(tmp_path)
    schema = site / "scalewatch/store/step_schema.py"
    source = schema.read_text()
    assert source.count(AFTER) == 1
    schema.write_text(source.replace(AFTER, FIELD + AFTER))
    migration = site / "scalewatch/migrations/versions/f00dfeed0001_steps_update_norm.py"
    migration.write_text(MIGRATION.format(head=head_revision()))

    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "store.db")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["package"].startswith(str(site))

    assert out["mirrored"]["scalewatch/grad_norm"] == 0.5  # a tracker's mirror logs it too

    header, *rows = out["csv"].splitlines()
    assert header.split(",")[-1] == "weight_update_norm"  # its export name
    assert [row.split(",")[-1] for row in rows] == ["1.25", "2.25", "3.25"]
    assert [json.loads(line)["weight_update_norm"] for line in out["jsonl"].splitlines()] == [
        1.25,
        2.25,
        3.25,
    ]

    events = [e for e in out["stream"].split("\n\n") if "event: step" in e]
    data = [json.loads(e.split("data: ", 1)[1]) for e in events]
    assert [(d["step"], d["norm"]) for d in data] == [  # its key in the stream
        (2996, None),
        (2997, 47.25),
        (2998, 48.25),
        (2999, 49.25),
        (3000, 0.25),
    ]

    assert data[3]["lr_groups"] == [[0.1, 0.2]]
    assert (
        '"grad_norm":null,"loss_spike":false,"grad_norm_spike":false,"spike_skipped":false,"norm":0.25}'
        in out["fast"]
    )

    series = out["series"]["series"]
    norms = {s: None if s % 7 == 0 else float(s % 50) + 0.25 for s in range(1, 3001)}
    for i, (first, last) in enumerate(zip(series["first_step"], series["last_step"], strict=True)):
        present = [v for s in range(first, last + 1) if (v := norms[s]) is not None]
        assert series["update_norm_min"][i] == min(present)
        assert series["update_norm_max"][i] == max(present)
        assert series["update_norm_last"][i] == norms[last]
    assert out["series"]["bucket_width"] > 8  # read from the rollups, not step by step
    assert json.loads(out["ingested"])["weight_update_norm"] == 6.5  # sent by a job, over HTTP
