from __future__ import annotations

from fastapi.testclient import TestClient

from scalewatch.store.engine import Store
from tests._helpers.service import add_run, simulate


def test_overflows_are_keyset_paged_in_step_order(client: TestClient, store: Store) -> None:
    overflows = {3, 17, 18, 400, 999, 1000, 1500}
    records = simulate(2000, overflows)
    run = add_run(store, records)

    seen, after, pages = [], None, 0
    while True:
        params = {"limit": 3} if after is None else {"limit": 3, "after": after}
        page = client.get(f"/api/runs/{run}/overflows", params=params).json()
        seen += page["items"]
        pages += 1
        after = page["next"]
        if after is None:
            break

    assert pages == 3
    assert [item["step"] for item in seen] == sorted(overflows)
    first = seen[0]
    assert first == {
        "step": 3,
        "wall_time": records[2].wall_time,
        "scale": records[2].scale,
        "scale_after": records[2].scale_after,
        "inf_ranks": [1],
        "loss": None,
        "loss_nonfinite_ranks": [],
        "params": [],
        "params_omitted": 0,
    }


def test_overflows_after_a_step_and_an_exact_last_page(client: TestClient, store: Store) -> None:
    run = add_run(store, simulate(100, {10, 20, 30}))

    page = client.get(f"/api/runs/{run}/overflows?after=10&limit=2").json()

    assert [item["step"] for item in page["items"]] == [20, 30]
    assert page["next"] is None
    assert client.get(f"/api/runs/{run}/overflows?limit=0").status_code == 422
