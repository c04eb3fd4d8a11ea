"""Runs whose every answer the tests know by heart: the export's rows and their CSV, and
ten steps of a diagnosed run (overflows with their parameters and the ranks of their loss).

    >>> [r.step for r in ROWS], GOLDEN_CSV.splitlines()[1][:14]
    ([1, 2, 3], '1,1700000000.5')
"""

from __future__ import annotations

import dataclasses
import math

from scalewatch.store.records import ParamFinding, StepRecord
from tests._helpers.service import simulate

ROWS = [
    StepRecord(
        step=1,
        wall_time=1700000000.5,
        scale=65536.0,
        overflow=False,
        skipped=False,
        inf_ranks=(),
        scale_after=65536.0,
        growth_tracker=1,
        growth_interval=2,
        growth_factor=2.0,
        backoff_factor=0.5,
        control_version=0,
        loss=3.5,
    ),
    StepRecord(
        step=2,
        wall_time=1700000001.25,
        scale=65536.0,
        overflow=True,
        skipped=True,
        inf_ranks=(0, 3),
        scale_after=32768.0,
        growth_tracker=0,
        growth_interval=2,
        growth_factor=2.0,
        backoff_factor=0.5,
        control_version=0,
    ),
    StepRecord(
        step=3,
        wall_time=1700000002.0,
        scale=32768.0,
        overflow=False,
        skipped=False,
        inf_ranks=(),
        scale_after=32768.0,
        growth_tracker=1,
        growth_interval=2,
        growth_factor=2.0,
        backoff_factor=0.5,
        control_version=1,
        loss=2.25,
    ),
]

# Step 2's findings: the overflows export's params column; its learning rates by group.
ROWS[1] = dataclasses.replace(
    ROWS[1],
    params=(ParamFinding(0, "fc.bias", "nan", 1), ParamFinding(3, "fc.weight", "inf", 8)),
    lr=0.001,
    lr_groups=((0.001, 0.0005),),
)
ROWS[0] = dataclasses.replace(ROWS[0], lr=0.001)  # step 3's learning rate was not read
# A scheduler stepped after the skipped step 2: step 3's record counts it.
ROWS[1] = dataclasses.replace(ROWS[1], schedule_drift=0)
ROWS[2] = dataclasses.replace(ROWS[2], schedule_drift=1)
# The gradient norm: measured at steps 1 and 3; step 2's was not finite (stored as null).
ROWS[0] = dataclasses.replace(ROWS[0], grad_norm=0.75)
ROWS[2] = dataclasses.replace(ROWS[2], grad_norm=1.5)

GOLDEN_CSV = (
    "step,wall_time,scale,overflow,skipped,inf_ranks,scale_after,growth_tracker,"
    "growth_interval,growth_factor,backoff_factor,control_version,loss,loss_nonfinite_ranks,"
    "params_omitted,lr,lr_groups,schedule_drift,grad_norm,loss_spike,grad_norm_spike,spike_skipped\n"
    "1,1700000000.5,65536.0,0,0,,65536.0,1,2,2.0,0.5,0,3.5,,0,0.001,,,0.75,0,0,0\n"
    '2,1700000001.25,65536.0,1,1,"0,3",32768.0,0,2,2.0,0.5,0,,,0,0.001,"[[0.001,0.0005]]",0,,0,0,0\n'
    "3,1700000002.0,32768.0,0,0,,32768.0,1,2,2.0,0.5,1,2.25,,0,,,1,1.5,0,0,0\n"
)


FC1 = "encoder.layers.3.fc1.weight"
HEAD = "head.bias"


def diagnosed() -> list[StepRecord]:
    """Ten steps with a loss each; overflows at 3 (inf in FC1 on rank 1, NaN in HEAD on rank
    0), 6 (the loss on rank 1 was inf; both kinds in FC1 there) and 9 (HEAD on rank 1, with
    parameters left out)."""
    findings = {
        3: (ParamFinding(0, HEAD, "nan", 3), ParamFinding(1, FC1, "inf", 12)),
        6: (ParamFinding(1, FC1, "both", 40),),
        9: (ParamFinding(1, HEAD, "inf", 1),),
    }
    records = []
    for record in simulate(10, set(findings)):
        step = record.step
        records.append(
            dataclasses.replace(
                record,
                inf_ranks=tuple(sorted({p.rank for p in findings.get(step, ())})),
                loss=math.inf if step == 6 else 4.0 - step / 4,
                loss_nonfinite_ranks=(1,) if step == 6 else (),
                params=findings.get(step, ()),
                params_omitted=7 if step == 9 else 0,
            )
        )
    return records
