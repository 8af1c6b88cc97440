import math

import numpy as np
import pytest

from gt_serve.core.resource_tensor import COLUMNS, ResourceTensor, build_tensor
from gt_serve.errors import InvalidArgument, NotFound


def test_add_rows_with_defaults_and_values() -> None:
    t = ResourceTensor(capacity=1)
    assert t.add_row("a", queue_depth=3, service_s=0.01) == 0
    assert t.add_row("b") == 1  # grows past the initial capacity
    snap = t.snapshot()
    assert snap.ids == ("a", "b") and snap.n == 2
    assert snap.queue_depth.tolist() == [3.0, 0.0]
    assert snap.alive.all() and snap.healthy.all() and not snap.parked.any()
    assert math.isinf(snap.free_mem_bytes[1]) and math.isinf(snap.queue_limit[1])
    assert set(COLUMNS) <= {f for f in snap.__dataclass_fields__}


def test_duplicate_and_unknown() -> None:
    t = build_tensor([("a", {})])
    with pytest.raises(InvalidArgument):
        t.add_row("a")
    with pytest.raises(InvalidArgument, match="nope"):
        t.update("a", nope=1.0)
    with pytest.raises(InvalidArgument):
        t.update("a", base_s=1.0)  # derived columns are not writable
    with pytest.raises(NotFound):
        t.update("zz", queue_depth=1)
    with pytest.raises(InvalidArgument):
        t.update_row(5, queue_depth=1)


def test_update_is_visible_through_snapshot_and_bumps_version() -> None:
    t = build_tensor([("a", {}), ("b", {})])
    snap = t.snapshot()
    v = t.version
    t.update("b", queue_depth=7)
    assert t.version > v
    assert t.snapshot().queue_depth[1] == 7
    assert t.get("b", "queue_depth") == 7
    copy = t.snapshot(copy=True)
    t.update("b", queue_depth=9)
    assert copy.queue_depth[1] == 7 and snap.queue_depth[1] == 9


def test_snapshot_views_are_read_only() -> None:
    t = build_tensor([("a", {})])
    with pytest.raises(ValueError):
        t.snapshot().queue_depth[0] = 1.0
    with pytest.raises(ValueError):
        t.column("queue_depth")[0] = 1.0


def test_remove_moves_last_row_into_the_hole() -> None:
    t = build_tensor([(c, {"queue_depth": i}) for i, c in enumerate("abcd")])
    t.remove_row("b")
    snap = t.snapshot()
    assert snap.ids == ("a", "d", "c")
    assert snap.queue_depth.tolist() == [0.0, 3.0, 2.0]
    assert t.row("d") == 1 and "b" not in t and len(t) == 3
    t.remove_row("c")  # the last row
    assert t.snapshot().ids == ("a", "d")


def test_mark_dead_keeps_row_but_blocks_it() -> None:
    t = build_tensor([("a", {"service_s": 0.01})])
    assert t.snapshot().base_s[0] == pytest.approx(0.01)
    t.mark_dead("a")
    snap = t.snapshot()
    assert not snap.alive[0] and not snap.healthy[0] and math.isinf(snap.base_s[0])


def test_derived_columns_follow_every_write() -> None:
    t = build_tensor([("a", {"service_s": 0.01, "link_s": 0.002, "wake_s": 0.05, "marginal_j": 1.0,
                             "link_j": 0.5, "wake_j": 30.0, "queue_limit": 4})])
    snap = t.snapshot()
    assert snap.base_s[0] == pytest.approx(0.012) and snap.energy_j[0] == pytest.approx(1.5)
    t.update("a", parked=True)
    assert snap.base_s[0] == pytest.approx(0.062) and snap.energy_j[0] == pytest.approx(31.5)
    t.update("a", queue_depth=4)  # full queue: not viable
    assert math.isinf(snap.base_s[0])
    t.update("a", queue_depth=3, healthy=False)
    assert math.isinf(snap.base_s[0])
    t.update("a", healthy=True, parked=False)
    assert snap.base_s[0] == pytest.approx(0.012)


def test_many_rows_grow_and_stay_consistent() -> None:
    t = ResourceTensor(capacity=2)
    for i in range(1000):
        t.add_row(f"r{i}", queue_depth=i)
    for i in range(0, 1000, 2):
        t.remove_row(f"r{i}")
    snap = t.snapshot()
    assert snap.n == 500
    for cid, depth in zip(snap.ids, snap.queue_depth):
        assert f"r{int(depth)}" == cid
    assert np.all(snap.queue_depth % 2 == 1)
