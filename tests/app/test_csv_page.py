from __future__ import annotations

import csv
import io
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scalewatch.app import exports
from scalewatch.app.exports import csv_page
from scalewatch.store.queries import EXPORT_COLUMNS


def _csv_writer(rows: list[tuple[Any, ...]]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


ranks = st.lists(st.integers(0, 1023), max_size=4).map(lambda r: ",".join(map(str, r)))
floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 65536.0])
few_floats = st.sampled_from([2.0**16, 2.0**15, 0.5, 2.0, -0.0, 0.0, float("nan"), 1e300])
step_rows = st.tuples(
    st.integers(0, 2**62),  # step
    floats,  # wall_time
    few_floats,  # scale
    st.integers(0, 1),  # overflow
    st.integers(0, 1),  # skipped
    ranks,  # inf_ranks
    few_floats,  # scale_after
    st.integers(0, 2**31),  # growth_tracker
    st.integers(1, 2**31 - 1),  # growth_interval
    few_floats,  # growth_factor
    few_floats,  # backoff_factor
    st.integers(0, 100),  # control_version
    st.none() | floats,  # loss
    ranks,  # loss_nonfinite_ranks
    st.integers(0, 2**31),  # params_omitted
    st.none() | floats,  # lr
    st.none() | st.sampled_from(["[[0.001,0.0005]]", "[[0.1],[null]]"]),  # lr_groups
    st.none() | st.integers(0, 2**31),  # schedule_drift
    st.none() | floats,  # grad_norm
    st.integers(0, 1),  # loss_spike
    st.integers(0, 1),  # grad_norm_spike
    st.integers(0, 1),  # spike_skipped
)
# Anything SQLite could hand back, to prove the fallback to csv.writer.
odd_values = (
    st.none()
    | st.booleans()
    | st.integers()
    | floats
    | st.sampled_from(["", '"', ",", "\r", "\n", "None", "1,2", 'x"y'])
    | st.text(alphabet=st.sampled_from('a,"\r\n 1N'), max_size=6)
)
odd_rows = st.tuples(*[odd_values] * len(EXPORT_COLUMNS))


@given(st.lists(step_rows, max_size=40))
def test_step_rows_are_written_as_csv_writer_writes_them(rows: list[tuple[Any, ...]]) -> None:
    text = csv_page(rows)

    assert text == _csv_writer(rows)
    parsed = list(csv.reader(io.StringIO(text)))
    assert parsed == list(csv.reader(io.StringIO(_csv_writer(rows))))
    assert [row[5] for row in parsed] == [row[5] for row in rows]


@given(st.lists(step_rows | odd_rows, max_size=20))
def test_any_row_is_written_as_csv_writer_writes_it(rows: list[tuple[Any, ...]]) -> None:
    assert csv_page(rows) == _csv_writer(rows)


ODD = [None, True, "", '"', ",", "\r", "\n", "None", "1,2", 'x"y', " a", 2, 2.5, -0.0, float("nan")]
ROWS = [
    (
        1,
        1700000000.5,
        65536.0,
        0,
        0,
        "",
        65536.0,
        1,
        2,
        2.0,
        0.5,
        0,
        2.5,
        "",
        0,
        0.001,
        None,
        0,
        0.5,
        0,
        0,
        0,
    ),
    (
        2,
        1700000001.25,
        65536.0,
        1,
        1,
        "0,3",
        32768.0,
        0,
        2,
        2.0,
        0.5,
        0,
        None,
        "0,3",
        4,
        None,
        None,
        1,
        None,
        0,
        1,
        0,
    ),
    (
        3,
        1700000002.0,
        32768.0,
        1,
        1,
        "7",
        16384.0,
        0,
        2,
        2.0,
        0.5,
        1,
        None,
        "",
        0,
        2e-05,
        None,
        None,
        1.25,
        1,
        0,
        0,
    ),
]


@pytest.mark.parametrize("column", range(len(EXPORT_COLUMNS)), ids=EXPORT_COLUMNS)
def test_an_odd_value_in_any_column_is_written_as_csv_writer_writes_it(column: int) -> None:
    for value in ODD:
        rows = list(ROWS)
        rows[1] = (*ROWS[1][:column], value, *ROWS[1][column + 1 :])
        assert csv_page(rows) == _csv_writer(rows), value


def test_step_rows_take_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(rows: Any) -> str:
        raise AssertionError("fell back to csv.writer")

    monkeypatch.setattr(exports, "_csv_writer_page", refuse)
    assert csv_page(ROWS) == (
        "1,1700000000.5,65536.0,0,0,,65536.0,1,2,2.0,0.5,0,2.5,,0,0.001,,0,0.5,0,0,0\n"
        '2,1700000001.25,65536.0,1,1,"0,3",32768.0,0,2,2.0,0.5,0,,"0,3",4,,,1,,0,1,0\n'
        "3,1700000002.0,32768.0,1,1,7,16384.0,0,2,2.0,0.5,1,,,0,2e-05,,,1.25,1,0,0\n"
    )
