"""The store's tables. Alembic revisions in ``migrations/`` create and change them."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)
from sqlalchemy.types import TypeEngine

from .step_schema import SERIES, STEP_FIELDS, Fold, Kind, SeriesSpec, StepField

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

# Bucket widths, in steps, of the pre-aggregated levels charts read from, by level. Each
# level is 8 times the one below, so a chart of at most N buckets reads at most about 4 N
# rollup rows (with levels 64 times apart, windows of a few million steps read up to 64k
# rows); only a chart of one step per bucket reads ``steps`` (at most N rows). Level 6, the
# finest (8 steps), came last: before it a chart of 20k steps at 2000 points read every
# step. Changing the levels needs a revision that builds or rebuilds their rows.
ROLLUP_LEVELS: dict[int, int] = {6: 8, 1: 64, 2: 512, 3: 4096, 4: 32768, 5: 262144}

runs = Table(
    "runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("uid", String(32), nullable=False, unique=True),
    Column("name", String(200), nullable=False),
    Column("status", String(16), nullable=False),  # running | finished | crashed
    Column("world_size", Integer, nullable=False),
    Column("config", JSON, nullable=False),  # the scaler's constructor configuration
    Column("control", JSON, nullable=False),  # values in effect, see scalewatch.store.control
    Column("control_version", Integer, nullable=False, default=0),
    Column("torch_version", String(64), nullable=False),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("ended_at", Float, nullable=True),
    Column("heartbeat_at", Float, nullable=False),
    Column("last_step", Integer, nullable=False, default=0),
    Column("dropped", Integer, nullable=False, default=0),  # telemetry records lost
    # The identity whose token created it through the service (app/routes/ingest); a
    # writer records into its own runs alone. Null: written into the store directly.
    Column("owner", String(200), nullable=True),
    # The last batch of it the service stored: a batch sent again stores nothing twice.
    Column("batch_sequence", Integer, nullable=False, server_default="0"),
    # Writes that replaced stored steps: buckets read before it changed may be stale.
    Column("step_rewrites", Integer, nullable=False, server_default="0"),
)

_TYPES: dict[Kind, type[TypeEngine[Any]]] = {
    Kind.INT: Integer,
    Kind.FLOAT: Float,
    Kind.BOOL: Boolean,
    Kind.RANKS: String,  # "1,3"; "" when none
    Kind.FLOAT_GROUPS: String,  # JSON text
}


def _step_column(f: StepField) -> Column[Any]:
    return Column(
        f.name,
        _TYPES[f.kind],
        primary_key=f.key,
        nullable=f.nullable,
        server_default=f.server_default,
    )


# One row a step: run_id, then the fields of the step schema (scalewatch.store.step_schema).
steps = Table(
    "steps",
    metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    *(_step_column(f) for f in STEP_FIELDS),
    # Rows clustered on (run_id, step) on SQLite: a range of steps is one b-tree range, no
    # lookups. PostgreSQL has no such tables; its heap is in insert order, which is step order.
    sqlite_with_rowid=False,
)

# Overflow steps, for keyset paging and chart markers without scanning steps.
Index(
    "ix_steps_overflow",
    steps.c.run_id,
    steps.c.step,
    sqlite_where=steps.c.overflow,
    postgresql_where=steps.c.overflow,
)


def _rollup_columns(spec: SeriesSpec) -> list[Column[Any]]:
    """A series' columns of step_rollups: a range's min and max (of the values present:
    null when its bucket has none), a count, the value at the bucket's last step."""
    if spec.fold is Fold.COUNT:
        return [Column(spec.name, Integer, nullable=False)]
    kind = spec.fields[-1].kind
    columns = [Column(name, _TYPES[kind], nullable=spec.nullable) for name in spec.kept]
    last = spec.last
    if spec.kept_last and last is not None:
        columns.append(Column(f"{spec.name}_last", _TYPES[last.kind], nullable=last.nullable))
    return columns


step_rollups = Table(
    "step_rollups",
    metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("level", Integer, primary_key=True),  # key of ROLLUP_LEVELS
    Column("bucket", Integer, primary_key=True),  # step // width
    Column("first_step", Integer, nullable=False),
    Column("last_step", Integer, nullable=False),
    Column("n", Integer, nullable=False),
    *(column for spec in SERIES for column in _rollup_columns(spec)),
    sqlite_with_rowid=False,
)

# The parameters whose local gradients held inf or NaN at an overflow step, per rank.
PARAM_NAME_LENGTH = 500
overflow_params = Table(
    "overflow_params",
    metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("step", Integer, primary_key=True),
    Column("rank", Integer, primary_key=True),
    Column("name", String(PARAM_NAME_LENGTH), primary_key=True),
    Column("kind", String(8), nullable=False),  # inf | nan | both
    Column("count", Integer, nullable=False),  # non-finite elements of the local gradient
    sqlite_with_rowid=False,
)

# The ten largest per-parameter gradient norms of the reporting rank at a step that
# overflowed or spiked (a run that measures the gradient norm), largest first.
param_norms = Table(
    "param_norms",
    metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("step", Integer, primary_key=True),
    Column("position", Integer, primary_key=True),  # 0: the largest
    Column("name", String(PARAM_NAME_LENGTH), nullable=False),
    Column("norm", Float, nullable=True),  # NULL: not finite
    sqlite_with_rowid=False,
)

# The steps whose loss or gradient norm spiked: far above the run's recent history (a
# robust z of the value against the median and MAD of the window before it).
spikes = Table(
    "spikes",
    metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("step", Integer, primary_key=True),
    Column("what", String(16), primary_key=True),  # loss | grad_norm
    Column("value", Float, nullable=False),
    Column("z", Float, nullable=False),
    sqlite_with_rowid=False,
)

control_requests = Table(
    "control_requests",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("values", JSON, nullable=False),  # the fields requested, e.g. {"growth_interval": 500}
    Column("source", String(16), nullable=False),  # api | cli | code | autopilot
    Column("requested_by", String(200), nullable=False),
    Column("requested_at", Float, nullable=False),
    Column("status", String(16), nullable=False),  # pending | applied | rejected
    Column("applied_step", Integer, nullable=True),
    Column("applied_at", Float, nullable=True),
    Column("reason", Text, nullable=True),  # why it was rejected
    Column("note", Text, nullable=True),  # why it was asked for: the autopilot's reason
    Index("ix_control_requests_run_status", "run_id", "status"),
    Index("ix_control_requests_run_id", "run_id", "id"),  # a page of the audit trail
)

telemetry_gaps = Table(
    "telemetry_gaps",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("first_step", Integer, nullable=False),
    Column("last_step", Integer, nullable=False),
    Column("dropped", Integer, nullable=False),
    Column("recorded_at", Float, nullable=False),
    Column("reason", Text, nullable=False),
)

# A scaler's state loaded into a run that has steps (scalewatch.store.scale_loads): the step
# the run continues from, the one it was at, the scale before and after, and whether the
# scale jumped (the loaded scale differs from the run's last recorded one).
scale_loads = Table(
    "scale_loads",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("step", Integer, nullable=False),  # the loaded step count: the next is step + 1
    Column("from_step", Integer, nullable=False),  # the run's last step at the load
    Column("scale_before", Float, nullable=False),
    Column("scale_after", Float, nullable=False),
    Column("jump", Boolean, nullable=False),
    Column("at", Float, nullable=False),
    Index("ix_scale_loads_run_id_step", "run_id", "step"),
)

# One row per run whose autopilot was ever set (app/autopilot): its settings, its state,
# and what it remembers between evaluations.
autopilots = Table(
    "autopilots",
    metadata,
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("enabled", Boolean, nullable=False),
    Column("state", String(16), nullable=False),  # off | watching | gave_up (ended: read)
    Column("target_skip_rate", Float, nullable=False),
    Column("min_growth_interval", Integer, nullable=False),
    Column("max_growth_interval", Integer, nullable=False),
    Column("min_scale", Float, nullable=True),
    Column("cooldown_steps", Integer, nullable=False),
    Column("max_changes_per_hour", Integer, nullable=False),
    Column("misses", Integer, nullable=False),  # raises in a row that did not help
    Column("helped_below", Float, nullable=True),  # skip rate its last raise must get under
    Column("decision", JSON, nullable=True),  # the last one: action, reason, values, step
    Column("reason", Text, nullable=True),  # why it gave up
    Column("updated_at", Float, nullable=False),
)

# Alerts the service's evaluator raised: fired once when a rule's condition starts on a
# run, resolved once when it ends. One firing alert per run and rule at most, also when
# two services evaluate the same store.
alerts = Table(
    "alerts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("rule", String(100), nullable=False),  # the rule's name
    Column("kind", String(32), nullable=False),  # scale_below, skip_rate, ...
    Column("state", String(16), nullable=False),  # firing | resolved
    Column("threshold", Float, nullable=False),
    Column("value", Float, nullable=False),  # when it fired
    Column("detail", String(200), nullable=False),  # "rank 3"; "" for most kinds
    Column("fired_step", Integer, nullable=False),
    Column("fired_at", Float, nullable=False),
    Column("resolved_step", Integer, nullable=True),
    Column("resolved_at", Float, nullable=True),
    Column("resolved_value", Float, nullable=True),
    Index("ix_alerts_run_id_state", "run_id", "state"),
)

Index(
    "uq_alerts_firing",
    alerts.c.run_id,
    alerts.c.rule,
    unique=True,
    sqlite_where=alerts.c.state == "firing",
    postgresql_where=alerts.c.state == "firing",
)

# Who may use the service (app/access): a name, a role, and for a bearer token the salted
# hash of its secret part, never the token (scalewatch.store.identities). An identity named by
# a trusted proxy has no token.
identities = Table(
    "identities",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("role", String(16), nullable=False),  # viewer | operator | admin | writer
    Column("key", String(32), nullable=True, unique=True),  # the token's public part
    Column("salt", String(32), nullable=True),
    Column("token_hash", String(64), nullable=True),  # sha256(salt + secret), hex
    Column("created_at", Float, nullable=False),
    Column("created_by", String(200), nullable=False),
    Column("expires_at", Float, nullable=True),
    Column("revoked_at", Float, nullable=True),
    Column("last_used_at", Float, nullable=True),
)

# The audit trail of the identities: created, revoked, by whom.
identity_events = Table(
    "identity_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False),
    Column("action", String(16), nullable=False),  # created | revoked
    Column("role", String(16), nullable=False),
    Column("by", String(200), nullable=False),
    Column("at", Float, nullable=False),
)
