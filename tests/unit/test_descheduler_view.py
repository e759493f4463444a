"""The descheduler's view of a LowNodeLoad round (services.migration.descheduler_view): each node's class, whether
it is abnormal and why, with its figures; each pool's counts and why its round ended there; the evictions with
the jobs asked for; and the wire form round-trips."""

from __future__ import annotations

import msgspec

from schemas import descheduler
from services.common.watermarks import Watermarks
from services.migration import descheduler_view
from services.migration import lownodeload_round as lnl
from tests.support.migration import pod
from tests.unit.test_migration_lownodeload_round import HOT, NOW, metric, node, section

ARGS = """
lowNodeLoadArgs:
  highThresholds: {cpu: 50}
  lowThresholds: {cpu: 20}
  anomalyCondition: {consecutiveAbnormalities: 2}
"""


def _round(descheduling: lnl.Descheduling, detectors: lnl.Detectors, *, now: float = NOW) -> lnl.Decision:
    pods = [pod(n, node="hot", priority=5500) for n in HOT] + [pod("c1", node="cold", priority=5500)]
    pods += [pod("m1", node="mid", priority=5500)]
    metrics = {
        "hot": metric("hot", HOT, at=now),
        "cold": metric("cold", {"c1": 500}, at=now),
        "mid": metric("mid", {"m1": 3000}, at=now),
        "stale": metric("stale", {}, at=now - 3600),
    }
    return lnl.run_round(
        lnl.effective_args(descheduling, Watermarks()),
        nodes=[node("hot"), node("cold"), node("mid"), node("stale")],
        metrics=metrics,
        pods=pods,
        limits=descheduling.limits,
        detectors=detectors,
        now=now,
    )


def _by_node(view: descheduler.DeschedulerRound) -> dict[str, descheduler.NodeLoadView]:
    return {n.node: n for n in view.nodes}


def test_a_hot_node_waits_for_the_anomaly_condition_and_the_view_says_so() -> None:
    got = section(ARGS)
    assert got is not None
    view = descheduler_view.round_view(_round(got, lnl.Detectors()))
    nodes = _by_node(view)
    assert [n.node for n in view.nodes] == ["hot", "cold", "mid", "stale"]  # acted-on classes first
    assert nodes["hot"].node_class == "highNodes" and not nodes["hot"].abnormal
    assert nodes["hot"].why.startswith("usage over high: cpu 80.0% > 50.0%; not abnormal yet")
    assert nodes["hot"].usage["cpu"] == 8000 and nodes["hot"].high["cpu"] == 5000
    assert nodes["hot"].allocatable == {"cpu": 10000, "memory": 100 * 2**30, "pods": 110}
    assert nodes["cold"].node_class == "bothLowNodes"  # no prod thresholds: prodLow is 100 %
    assert nodes["cold"].why.startswith("usage under every low threshold and prod usage under every prodLow threshold")
    assert nodes["cold"].why.endswith("cpu 5.0% ≤ 20.0%, memory 1.2% ≤ 100.0%")
    assert nodes["mid"].node_class == "prodLowNodes"  # between low and high, prod usage under prodLow (100 %)
    assert nodes["mid"].why.startswith("usage between low and high: cpu 30.0% ≤ 50.0%")
    assert "; prod usage under every prodLow threshold: cpu 0.0% ≤ 100.0%" in nodes["mid"].why
    assert nodes["stale"].node_class == "unusable" and "3600 s old (expiration 180 s)" in nodes["stale"].why
    (pool,) = view.pools
    assert pool.nodes == 4
    assert pool.counts["highNodes"] == 1 and pool.counts["bothLowNodes"] == 1 and pool.counts["prodLowNodes"] == 1
    assert pool.counts["unusable"] == 1 and pool.counts["abnormal"] == 0
    assert "none abnormal yet (2 consecutive rounds" in pool.outcome
    assert view.evictions == []


def test_the_second_round_evicts_and_names_the_jobs_asked_for() -> None:
    got = section(ARGS)
    assert got is not None
    detectors = lnl.Detectors()
    decisions = [_round(got, detectors, now=NOW + 30 * k) for k in range(4)]
    decision = next(d for d in decisions if d.evictions)
    first = decision.evictions[0].pod
    view = descheduler_view.round_view(decision, jobs={first: "job-1"})
    nodes = _by_node(view)
    assert nodes["hot"].abnormal and nodes["hot"].why.endswith("; abnormal")
    assert view.pools[0].counts["abnormal"] == 1
    assert view.pools[0].outcome == f"{len(decision.evictions)} pod(s) to move off the abnormal node(s)"
    assert view.evictions[0].job == "job-1" and view.evictions[0].node == "hot"
    assert "node cpu usage(80.00%)>threshold(50.00%)" in view.evictions[0].reason
    assert all(e.job == "" for e in view.evictions[1:])


def test_refused_args_and_a_plan_round_trip_on_the_wire() -> None:
    refused = lnl.Decision(at=NOW, dry_run=False, paused=False, problems=("lowThresholds[cpu]: above high",))
    view = descheduler_view.round_view(refused, planned=True)
    assert view.problems == ["lowThresholds[cpu]: above high"] and view.planned and not view.nodes
    got = section(ARGS)
    assert got is not None
    view = descheduler_view.round_view(_round(got, lnl.Detectors()), planned=True)
    wire = descheduler.encode_round(view)
    assert descheduler.ROUND_DECODER.decode(wire) == view
    assert msgspec.json.decode(wire)["type"] == "descheduler.round.v1"
