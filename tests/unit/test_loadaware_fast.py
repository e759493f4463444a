"""The vectorized verbs (services.loadaware.fast) answer exactly what core's per-node functions answer, on random
clusters: every args shape, stale and missing NodeMetrics, unknown nodes, annotation overrides, prod pods, and the
caps node QoS eviction strategies (cluster and per node pool) put on pods they could evict."""

from __future__ import annotations

import json
import random

import msgspec
import pytest

from services.common import watermarks
from services.loadaware import core, fast, state
from services.loadaware.args import AggregatedArgs, LoadAwareArgs, apply_watermarks, with_defaults
from services.loadaware.state import AssignedPod, LoadState
from tests.support.loadaware import GI, node, pod, report

NOW = 1_900_000_000.0
ARGS = [
    LoadAwareArgs(),
    LoadAwareArgs(prod_usage_thresholds={"cpu": 40, "memory": 60}, score_according_prod_usage=True),
    LoadAwareArgs(
        aggregated=AggregatedArgs(
            usage_thresholds={"cpu": 50},
            usage_aggregation_type="p95",
            score_aggregation_type="avg",
            score_aggregated_duration="5m",
        ),
        dominant_resource_weight=2,
        resource_weights={"cpu": 2},
    ),
    LoadAwareArgs(enable_schedule_when_node_metrics_expired=True, prod_usage_include_sys=True),
    LoadAwareArgs(filter_expired_node_metrics=False, usage_thresholds={"memory": 70}),
    LoadAwareArgs(dominant_resource_weight=1),
]


def random_cluster(
    rng: random.Random, args: LoadAwareArgs, size: int, config: watermarks.WatermarkConfig | None = None
) -> LoadState:
    load = LoadState(args, config)
    for i in range(size):
        name = f"n{i}"
        annotations = {}
        if rng.random() < 0.15:
            annotations[state.ANNOTATION_USAGE_THRESHOLDS] = json.dumps(
                {"usageThresholds": {"cpu": rng.randint(10, 90)}}
            )
        if rng.random() < 0.9:
            labels = {"pool": rng.choice(["a", "b", "c"])}
            load.apply_node(name, node(name, cpu=str(rng.choice([8, 16, 32])), annotations=annotations, labels=labels))
        pods = {f"default/p{i}-{j}": (rng.randint(0, 3000), rng.randint(0, 4) * GI) for j in range(rng.randint(0, 6))}
        prod = frozenset(k for k in pods if rng.random() < 0.4)
        if rng.random() < 0.85:
            age = rng.choice([5, 30, 179, 180, 400])
            load.apply_metric(
                report(
                    name,
                    at=NOW - age,
                    cpu=rng.randint(0, 30000),
                    memory=rng.randint(0, 120) * GI,
                    pods=pods,
                    prod_pods=prod,
                    system=(rng.randint(0, 500), GI),
                    aggregated={300: {"p95": (rng.randint(0, 30000), GI), "avg": (rng.randint(0, 20000), GI)}}
                    if rng.random() < 0.7
                    else None,
                )
            )
        for j, key in enumerate([*pods, f"default/new{i}"]):
            if rng.random() < 0.8:
                estimated = {"cpu": rng.randint(0, 4000), "memory": rng.randint(0, 3) * GI}
                when = NOW - rng.choice([1, 50, 100, 3600])
                load.assume(
                    f"u{i}-{j}",
                    AssignedPod(key=key, estimated=estimated, timestamp=when, deadline=None, prod=key in prod),
                    node=name,
                )
    return load


@pytest.mark.parametrize("seed", range(12))
def test_vectorized_verbs_match_the_per_node_functions(seed: int) -> None:
    rng = random.Random(seed)
    args = with_defaults(ARGS[seed % len(ARGS)])
    load = random_cluster(rng, args, size=60)
    matrix = fast.Matrix(load)
    names = [f"n{i}" for i in range(60)] + ["ghost"]
    rng.shuffle(names)
    labels = {"koordinator.sh/priority-class": "koord-prod"} if seed % 2 else None
    owner = "DaemonSet" if seed == 7 else None
    for _ in range(3):
        incoming = core.incoming(
            pod("x", cpu=str(rng.randint(1, 8)), memory=f"{rng.randint(1, 16)}Gi", labels=labels, owner_kind=owner),
            args,
        )
        passed, failed = matrix.filter(incoming, names, now=NOW)
        verdicts = {n: core.filter_node(load, incoming, n, now=NOW) for n in names}
        assert passed == [n for n in names if verdicts[n].passed]
        assert failed == {n: v.reason for n, v in verdicts.items() if not v.passed}
        scores = matrix.scores(incoming, names, now=NOW)
        assert scores == [core.score_node(load, incoming, n, now=NOW).score for n in names]
        # a placement changes one node: the matrix follows
        target = rng.choice(names)
        load.assume(
            f"new-{rng.random()}",
            AssignedPod(
                key="default/y", estimated={"cpu": 3000, "memory": GI}, timestamp=NOW, deadline=None, prod=False
            ),
            node=target,
        )


QOS_CONFIGS = [
    {  # BE memory eviction everywhere; pool b evicts earlier and evicts eviction-enabled pods on cpu too
        "resource-threshold-config": json.dumps(
            {
                "clusterStrategy": {"enable": True, "memoryEvictThresholdPercent": 70},
                "nodeStrategies": [
                    {
                        "name": "b",
                        "nodeSelector": {"matchLabels": {"pool": "b"}},
                        "memoryEvictThresholdPercent": 40,
                        "cpuEvictThresholdPercent": 30,
                        "evictEnabledPriorityThreshold": 5999,
                    }
                ],
            }
        )
    },
    {  # only pool c has node QoS on, and the scheduler checks cpu only
        "resource-threshold-config": json.dumps(
            {
                "nodeStrategies": [
                    {
                        "nodeSelector": {"matchLabels": {"pool": "c"}},
                        "enable": True,
                        "memoryEvictThresholdPercent": 50,
                        "cpuEvictThresholdPercent": 60,
                        "evictEnabledPriorityThreshold": 9999,
                    }
                ]
            }
        ),
        "load-watermarks-config": json.dumps({"usageThresholds": {"cpu": 70}}),
    },
]


@pytest.mark.parametrize("seed", range(8))
def test_vectorized_filter_matches_with_eviction_caps(seed: int) -> None:
    rng = random.Random(100 + seed)
    data = dict(QOS_CONFIGS[seed % len(QOS_CONFIGS)])
    if seed >= 4:
        marks = json.loads(data.get("load-watermarks-config", "{}"))
        data["load-watermarks-config"] = json.dumps({**marks, "avoidEvictionLoops": False})
    config = watermarks.read_watermarks(data)
    assert not config.errors
    args = apply_watermarks(with_defaults(ARGS[seed % 3]), config.watermarks)
    load = random_cluster(rng, args, size=60, config=config)
    uncapped = msgspec.structs.replace(
        config, watermarks=msgspec.structs.replace(config.watermarks, avoid_eviction_loops=False)
    )
    load_uncapped = random_cluster(random.Random(100 + seed), args, size=60, config=uncapped)
    matrix = fast.Matrix(load)
    names = [f"n{i}" for i in range(60)] + ["ghost"]
    kinds: list[dict[str, str] | None] = [
        {"koordinator.sh/qosClass": "BE"},
        {"koordinator.sh/eviction-enabled": "true"},
        {"koordinator.sh/qosClass": "LS"},
        None,
    ]
    changed_by_caps = 0
    for labels in kinds:
        asked = pod("x", cpu=str(rng.randint(1, 8)), memory=f"{rng.randint(1, 16)}Gi", labels=labels)
        incoming = core.incoming(asked, args)
        passed, failed = matrix.filter(incoming, names, now=NOW)
        verdicts = {n: core.filter_node(load, incoming, n, now=NOW) for n in names}
        assert passed == [n for n in names if verdicts[n].passed]
        assert failed == {n: v.reason for n, v in verdicts.items() if not v.passed}
        plain = {n: core.filter_node(load_uncapped, incoming, n, now=NOW).passed for n in names}
        changed_by_caps += sum(plain[n] != verdicts[n].passed for n in names)
        if labels is None or labels.get("koordinator.sh/qosClass") == "LS":
            assert all(plain[n] == verdicts[n].passed for n in names)  # pods node QoS never evicts: no cap
    assert (changed_by_caps > 0) == (seed < 4)


def test_the_matrix_drops_a_deleted_node() -> None:
    load = LoadState(with_defaults(LoadAwareArgs()))
    load.apply_node("a", node("a"))
    load.apply_metric(report("a", at=NOW, cpu=31000, memory=0))
    matrix = fast.Matrix(load)
    incoming = core.incoming(pod("x", cpu="2"), load.args)
    assert matrix.filter(incoming, ["a"], now=NOW)[1] == {"a": "node(s) cpu usage exceed threshold"}
    load.apply_node("a", None)
    load.nodes.pop("a")
    load.dirty.add("a")
    assert matrix.filter(incoming, ["a"], now=NOW) == (["a"], {})
    assert matrix.scores(incoming, ["a"], now=NOW) == [0]
