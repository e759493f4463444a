"""bench/quota.py at toy size: one JSON line with the documented keys and figures that hang together, and the
synthetic tree valid (every parent's min is the sum of its children's, the requested number of quotas)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import quota as bench
from schemas import quota as q

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "quota.py"
KEYS = {
    "bench", "quotas", "leaves", "depth", "pods", "rebuild_from_events_s", "rebuild_parts",
    "event_leaf_change_p50_ms", "event_leaf_change_p99_ms", "event_leaf_change_max_ms", "tree_build_s",
    "leaf_change_p50_ms", "leaf_change_p99_ms", "leaf_change_max_ms", "checks_per_s", "target_held",
    "target_misses", "command",
}  # fmt: skip


def test_prints_one_json_line_with_sane_figures() -> None:
    command = [sys.executable, str(SCRIPT), "--quotas", "120", "--depth", "3", "--pods", "600"]
    run = subprocess.run(
        [*command, "--changes", "50", "--check-seconds", "0.3"], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert set(result) == KEYS
    assert (result["quotas"], result["depth"], result["pods"]) == (120, 3, 600)
    assert 0 < result["leaves"] < 120
    assert 0 < result["leaf_change_p50_ms"] <= result["leaf_change_p99_ms"] <= result["leaf_change_max_ms"]
    assert result["checks_per_s"] > 0 and result["tree_build_s"] > 0
    assert 0 < result["event_leaf_change_p50_ms"] <= result["event_leaf_change_p99_ms"]
    parts = result["rebuild_parts"]
    assert result["rebuild_from_events_s"] == parts["total_s"] > 0
    assert parts["total_s"] >= parts["events_s"] and parts["total_s"] >= parts["pods_s"]
    assert result["target_held"] == (not result["target_misses"])


def test_bad_flags_exit_2() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--quotas", "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "must be positive" in run.stderr


@pytest.mark.parametrize(("quotas", "depth"), [(10, 1), (120, 3), (1000, 5)])
def test_the_synthetic_tree_is_valid(quotas: int, depth: int) -> None:
    shape = bench.build_shape(quotas, depth, seed=3)
    assert len(shape.specs) == quotas
    by_parent: dict[str, list[q.QuotaSpec]] = {}
    for spec in shape.specs:
        by_parent.setdefault(spec.parent, []).append(spec)
    for spec in shape.specs:
        children = by_parent.get(spec.name, [])
        assert spec.is_parent == bool(children)
        if children:
            assert spec.min == {k: sum(c.min[k] for c in children) for k in ("cpu", "memory")}
        assert all(spec.min[k] <= spec.max[k] for k in spec.min)
    assert {s.name for s in shape.specs if not by_parent.get(s.name)} == set(shape.leaves)
