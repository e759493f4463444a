"""Resource-list algebra with the exact semantics of the spec's conventions."""

from schemas import resources as rl


def test_add_sub_union_keys() -> None:
    assert rl.add({"cpu": 1}, {"memory": 2}) == {"cpu": 1, "memory": 2}
    assert rl.sub({"cpu": 1}, {"memory": 2}) == {"cpu": 1, "memory": -2}
    assert rl.sub_nonneg({"cpu": 1}, {"cpu": 3, "memory": 2}) == {"cpu": 0, "memory": 0}


def test_max_keeps_one_sided_and_min_intersects() -> None:
    assert rl.max_rl({"cpu": 1, "memory": 5}, {"cpu": 3, "x": 1}) == {"cpu": 3, "memory": 5, "x": 1}
    assert rl.min_rl({"cpu": 1, "memory": 5}, {"cpu": 3, "x": 1}) == {"cpu": 1}


def test_leq_checks_only_the_limits_keys() -> None:
    assert rl.leq({"cpu": 5, "gpu": 100}, {"cpu": 5})
    assert not rl.leq({"cpu": 6}, {"cpu": 5})
    assert rl.leq({}, {"cpu": 0})


def test_milli_resources() -> None:
    assert rl.is_milli_resource("cpu") and rl.is_milli_resource("kubernetes.io/batch-cpu")
    assert not rl.is_milli_resource("memory")
