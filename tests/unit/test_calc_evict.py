"""`koordbus calc memory-evict` and `koordbus calc cpu-evict` in process (CALC-CONTRACT, spec §5.5.2–5.5.3): gates,
the literal NodeSLO and its config checks, the usage / allocatable / BE-satisfaction formulas, the eviction-policy
annotation, the candidate orders, the two ledgers of the victim walk, and exit 2 for malformed input."""

from __future__ import annotations

import json
from typing import Any

import pytest

from koordbus import calc

G = 10**9


def _ok(kind: str, doc: Any) -> dict[str, Any]:
    outcome = calc.calculate(kind, doc if isinstance(doc, str) else json.dumps(doc))
    assert outcome.exit_code == 0, outcome.stderr
    out: dict[str, Any] = json.loads(outcome.stdout)
    return out


def _bad(kind: str, doc: Any) -> str:
    outcome = calc.calculate(kind, doc if isinstance(doc, str) else json.dumps(doc))
    assert outcome.exit_code == 2 and outcome.stdout == "", outcome.stdout
    assert outcome.stderr.startswith(f"koordbus calc {kind}: ") and outcome.stderr.count("\n") == 1
    return outcome.stderr


def pod(
    name: str,
    *,
    qos: str | None = None,
    priority: int | None = None,
    phase: str | None = "Running",
    enabled: bool = False,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
    init: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    all_labels = dict(labels or {})
    if qos is not None:
        all_labels["koordinator.sh/qosClass"] = qos
    if enabled:
        all_labels["koordinator.sh/eviction-enabled"] = "true"
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"requests": requests or {}}}]}
    if priority is not None:
        spec["priority"] = priority
    if init is not None:
        spec["initContainers"] = init
    out: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": name, "labels": all_labels, "annotations": annotations or {}},
        "spec": spec,
        "status": {"phase": phase} if phase else {},
    }
    return out


def node(capacity: dict[str, str], allocatable: dict[str, str] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"capacity": capacity}
    if allocatable is not None:
        status["allocatable"] = allocatable
    return {"metadata": {"name": "n"}, "status": status}


def round_doc(gates: list[str], strategy: dict[str, Any] | None, pods: list[Any], **extra: Any) -> dict[str, Any]:
    """An input of either kind: the gates on, the strategy, a 100-core 100G node, the pods and any other fields."""
    doc: dict[str, Any] = {
        "featureGates": {g: True for g in gates},
        "nodeSLO": None if strategy is None else {"resourceUsedThresholdWithBE": strategy},
        "node": node({"cpu": "100", "memory": str(100 * G)}, {"cpu": "100", "memory": str(100 * G)}),
        "pods": pods,
    }
    doc.update(extra)
    return doc


def keys(names: list[str]) -> list[str]:
    return [f"ns/{n}" for n in names]


@pytest.mark.parametrize("kind", ["memory-evict", "cpu-evict"])
def test_help_examples_run_and_evict(kind: str) -> None:
    out = _ok(kind, calc.CALCULATORS[kind].example)
    assert out["evict"] is True and out["victims"] == [["ns/be"], ["ns/batch"]][kind == "cpu-evict"]


# --- gates, enable, the literal NodeSLO


BE_80 = {"enable": True, "memoryEvictThresholdPercent": 80}


def test_gates_default_off_but_the_figures_are_computed() -> None:
    doc = round_doc([], BE_80, [{"pod": pod("be", qos="BE"), "memoryUsage": 10 * G}], nodeMemoryUsage=95 * G)
    out = _ok("memory-evict", doc)
    assert out["tasks"] == {} and out["victims"] == [] and out["evict"] is False
    assert out["release"] == 100 * G * (95 - 78) // 100


def test_the_strategy_is_read_literally_without_defaults() -> None:
    # An absent memoryEvictThresholdPercent is not Koordinator's default 70: no release, and the check refuses it.
    doc = round_doc(["BEMemoryEvict"], {"enable": True}, [{"pod": pod("be", qos="BE")}], nodeMemoryUsage=95 * G)
    out = _ok("memory-evict", doc)
    assert "release" not in out and "MemoryEvictThresholdPercent" in out["tasks"]["BEMemoryEvict"]["error"]


@pytest.mark.parametrize(
    ("slo", "report"),
    [
        (None, "error"),
        ({}, "error"),
        ({"resourceUsedThresholdWithBE": {"memoryEvictThresholdPercent": 80}}, "error"),
        ({"resourceUsedThresholdWithBE": {**BE_80, "enable": None, "cpuEvictPolicy": None}}, "error"),  # null = unset
        ({"resourceUsedThresholdWithBE": {**BE_80, "enable": False}}, "absent"),
        ({"resourceUsedThresholdWithBE": BE_80}, "task"),
    ],
)
def test_enable_unset_is_an_error_and_false_turns_the_feature_off(slo: Any, report: str) -> None:
    doc = round_doc(["BEMemoryEvict"], None, [{"pod": pod("be", qos="BE"), "memoryUsage": G}], nodeMemoryUsage=95 * G)
    doc["nodeSLO"] = slo
    tasks = _ok("memory-evict", doc)["tasks"]
    if report == "absent":
        assert tasks == {}
    elif report == "error":
        assert set(tasks["BEMemoryEvict"]) == {"error"} and tasks["BEMemoryEvict"]["error"]
    else:
        assert tasks["BEMemoryEvict"]["release"] == {"memory": 17 * G}


def test_no_node_or_no_capacity_means_no_tasks_but_the_figures_that_can_be() -> None:
    doc = round_doc(["BEMemoryEvict"], BE_80, [{"pod": pod("be", qos="BE"), "memoryUsage": G}], nodeMemoryUsage=9)
    doc["node"] = None
    out = _ok("memory-evict", doc)
    assert out["tasks"] == {} and out["victims"] == [] and "release" not in out
    doc["node"] = node({"cpu": "8", "memory": "0"})
    assert _ok("memory-evict", doc)["tasks"] == {}
    cpu = round_doc(
        ["CPUEvict"], {"enable": True, "cpuEvictThresholdPercent": 50, "evictEnabledPriorityThreshold": 1}, []
    )
    cpu["node"] = node({"cpu": "0", "memory": "1Gi"})
    cpu["nodeCPUUsage"] = 100
    assert _ok("cpu-evict", cpu)["tasks"] == {}


# --- config checks

ALLOC_MEM = {
    "enable": True,
    "memoryAllocatableEvictThresholdPercent": 80,
    "memoryAllocatableEvictLowerPercent": 70,
    "allocatableEvictPriorityThreshold": 5999,
}
ALLOC_CPU = {
    "enable": True,
    "cpuAllocatableEvictThresholdPercent": 80,
    "cpuAllocatableEvictLowerPercent": 70,
    "allocatableEvictPriorityThreshold": 5999,
}
SATISFACTION = {"enable": True, "cpuEvictBESatisfactionLowerPercent": 30, "cpuEvictBESatisfactionUpperPercent": 40}
CPU_USAGE = {"enable": True, "cpuEvictThresholdPercent": 80, "evictEnabledPriorityThreshold": 5999}


@pytest.mark.parametrize(
    ("kind", "feature", "strategy", "valid"),
    [
        ("memory-evict", "BEMemoryEvict", BE_80, True),
        ("memory-evict", "BEMemoryEvict", {**BE_80, "memoryEvictThresholdPercent": -1}, False),
        ("memory-evict", "BEMemoryEvict", {**BE_80, "memoryEvictLowerPercent": 80}, False),
        ("memory-evict", "BEMemoryEvict", {**BE_80, "memoryEvictThresholdPercent": 0}, True),  # lower −2 < 0
        ("memory-evict", "MemoryEvict", BE_80, False),  # no evictEnabledPriorityThreshold
        ("memory-evict", "MemoryEvict", {**BE_80, "evictEnabledPriorityThreshold": 100}, True),
        ("memory-evict", "MemoryAllocatableEvict", ALLOC_MEM, True),
        ("memory-evict", "MemoryAllocatableEvict", {**ALLOC_MEM, "memoryAllocatableEvictLowerPercent": None}, False),
        ("memory-evict", "MemoryAllocatableEvict", {**ALLOC_MEM, "memoryAllocatableEvictLowerPercent": 80}, False),
        ("memory-evict", "MemoryAllocatableEvict", {**ALLOC_MEM, "memoryAllocatableEvictThresholdPercent": -1}, False),
        ("memory-evict", "MemoryAllocatableEvict", {**ALLOC_MEM, "allocatableEvictPriorityThreshold": 8000}, False),
        ("memory-evict", "MemoryAllocatableEvict", {**ALLOC_MEM, "allocatableEvictPriorityThreshold": 7999}, True),
        ("memory-evict", "MemoryAllocatableEvict", {**ALLOC_MEM, "allocatableEvictPriorityThreshold": None}, False),
        ("cpu-evict", "BECPUEvict", SATISFACTION, True),
        ("cpu-evict", "BECPUEvict", {**SATISFACTION, "cpuEvictBESatisfactionUpperPercent": None}, False),
        ("cpu-evict", "BECPUEvict", {**SATISFACTION, "cpuEvictBESatisfactionLowerPercent": 0}, False),
        ("cpu-evict", "BECPUEvict", {**SATISFACTION, "cpuEvictBESatisfactionLowerPercent": 60}, False),  # upper < lower
        ("cpu-evict", "BECPUEvict", {**SATISFACTION, "cpuEvictBESatisfactionLowerPercent": 61}, False),
        ("cpu-evict", "BECPUEvict", {**SATISFACTION, "cpuEvictBESatisfactionUpperPercent": 100}, False),
        ("cpu-evict", "BECPUEvict", {**SATISFACTION, "cpuEvictBESatisfactionUpperPercent": 30}, True),  # upper = lower
        ("cpu-evict", "CPUEvict", CPU_USAGE, True),
        ("cpu-evict", "CPUEvict", {**CPU_USAGE, "cpuEvictThresholdPercent": None}, False),
        ("cpu-evict", "CPUEvict", {**CPU_USAGE, "cpuEvictLowerPercent": 90}, False),
        ("cpu-evict", "CPUEvict", {**CPU_USAGE, "evictEnabledPriorityThreshold": None}, False),
        ("cpu-evict", "CPUAllocatableEvict", ALLOC_CPU, True),
        ("cpu-evict", "CPUAllocatableEvict", {**ALLOC_CPU, "cpuAllocatableEvictLowerPercent": 80}, False),
        ("cpu-evict", "CPUAllocatableEvict", {**ALLOC_CPU, "allocatableEvictPriorityThreshold": 9000}, False),
    ],
)
def test_config_checks(kind: str, feature: str, strategy: dict[str, Any], valid: bool) -> None:
    literal = {k: v for k, v in strategy.items() if v is not None}
    report = _ok(kind, round_doc([feature], literal, []))["tasks"][feature]
    if valid:
        assert "error" not in report and report["candidates"] == []
    else:
        assert set(report) == {"error"} and report["error"]


def test_a_refused_feature_leaves_the_others_running() -> None:
    pods = [{"pod": pod("be", qos="BE", enabled=True, priority=100), "memoryUsage": 30 * G}]
    doc = round_doc(["BEMemoryEvict", "MemoryEvict"], BE_80, pods, nodeMemoryUsage=95 * G)
    out = _ok("memory-evict", doc)
    assert "error" in out["tasks"]["MemoryEvict"] and out["victims"] == ["ns/be"]


# --- the usage trigger


@pytest.mark.parametrize(
    ("used", "lower", "release"),
    [
        (80 * G - 1, None, 0),  # 79.99…% is 79% in integer percent: below 80
        (80 * G, None, 100 * G * (80 - 78) // 100),
        (95 * G, 74, 100 * G * (95 - 74) // 100),
        (95.9 * G, None, 100 * G * (95 - 78) // 100),
    ],
)
def test_memory_release_uses_integer_percent(used: float, lower: int | None, release: int) -> None:
    strategy = {**BE_80, **({"memoryEvictLowerPercent": lower} if lower is not None else {})}
    assert _ok("memory-evict", round_doc([], strategy, [], nodeMemoryUsage=used))["release"] == release


def test_cpu_usage_release_is_in_millicores_with_its_own_lower() -> None:
    strategy = {"enable": True, "cpuEvictThresholdPercent": 70, "cpuEvictLowerPercent": 60}
    out = _ok("cpu-evict", round_doc([], strategy, [], nodeCPUUsage=75500.9))
    assert out["usageRelease"] == 100_000 * (75 - 60) // 100 and out["release"] == 0
    assert _ok("cpu-evict", round_doc([], strategy, [], nodeCPUUsage=69_999))["usageRelease"] == 0
    assert "usageRelease" not in _ok("cpu-evict", round_doc([], strategy, []))


# --- the allocatable formula


def batch(name: str, resource: str, amount: str, **kw: Any) -> dict[str, Any]:
    return pod(name, labels={"koordinator.sh/priority-class": "koord-batch"}, requests={resource: amount}, **kw)


def test_allocatable_formulas_differ_between_memory_and_cpu() -> None:
    # q = 148326, a = 321270, lower 10%: memory int((q/a − 0.1) × a) = 116198, cpu int(q − 0.1 × a) = 116199.
    mem = round_doc(
        [], {**ALLOC_MEM, "memoryAllocatableEvictThresholdPercent": 40, "memoryAllocatableEvictLowerPercent": 10}, []
    )
    mem["node"] = node({"memory": "1Gi"}, {"kubernetes.io/batch-memory": "321270"})
    mem["pods"] = [{"pod": batch("b", "kubernetes.io/batch-memory", "148326")}]
    out = _ok("memory-evict", mem)
    assert out["allocatableRelease"] == {"kubernetes.io/batch-memory": 116198}
    assert out["allocatablePodRelease"] == {"ns/b": {"kubernetes.io/batch-memory": 148326}}
    cpu = round_doc(
        [], {**ALLOC_CPU, "cpuAllocatableEvictThresholdPercent": 40, "cpuAllocatableEvictLowerPercent": 10}, []
    )
    cpu["node"] = node({"cpu": "1"}, {"kubernetes.io/batch-cpu": "321270"})
    cpu["pods"] = [{"pod": batch("b", "kubernetes.io/batch-cpu", "148326")}]
    assert _ok("cpu-evict", cpu)["allocatableRelease"] == {"kubernetes.io/batch-cpu": 116199}


def test_allocatable_sums_pods_of_any_phase_under_the_priority_threshold() -> None:
    pods = [
        {"pod": batch("run", "kubernetes.io/batch-memory", "50", priority=5500)},
        {"pod": batch("done", "kubernetes.io/batch-memory", "40", priority=5500, phase="Succeeded")},
        {"pod": batch("high", "kubernetes.io/batch-memory", "1000", priority=6000)},
        {"pod": pod("mid", priority=7100, requests={"kubernetes.io/mid-memory": "30"})},
        {"pod": pod("prod", priority=9500, requests={"memory": "77"})},
        {"pod": pod("free", priority=3100, requests={"memory": "5"})},
    ]
    doc = round_doc([], {**ALLOC_MEM, "allocatableEvictPriorityThreshold": 5999}, pods)
    doc["node"] = node({"memory": "1Gi"}, {"kubernetes.io/batch-memory": "100", "memory": "0"})
    out = _ok("memory-evict", doc)
    # batch 90/100 > 80% → (0.9 − 0.7) × 100 = 20 (float: 20.000000000000004 → 20); memory has no allocatable: all of
    # the 5 bytes the free pod asks for.
    assert out["allocatableRelease"] == {"kubernetes.io/batch-memory": 20, "memory": 5}
    steps = out["explain"]["allocatableRelease"]
    assert steps == {
        "kubernetes.io/batch-memory": "(90 / 100 − 70%) × 100 = 20",
        "memory": "no allocatable memory: all of the 5 requested",
    }
    assert out["allocatablePodRelease"] == {
        "ns/run": {"kubernetes.io/batch-memory": 50},
        "ns/done": {"kubernetes.io/batch-memory": 40},
        "ns/high": {"kubernetes.io/batch-memory": 1000},
    }


def test_allocatable_under_threshold_absent_allocatable_and_zero_requests() -> None:
    pods = [{"pod": batch("b", "kubernetes.io/batch-memory", "10")}, {"pod": pod("m", priority=7000)}]
    doc = round_doc([], {**ALLOC_MEM, "allocatableEvictPriorityThreshold": 7999}, pods)
    doc["node"] = node({"memory": "1Gi"}, {"kubernetes.io/batch-memory": "100"})
    out = _ok("memory-evict", doc)
    # batch 10% is under 80%; the mid pod asks for no mid-memory, and the node has none: all of it (0) is due.
    assert out["allocatableRelease"] == {"kubernetes.io/mid-memory": 0}
    assert out["allocatablePodRelease"] == {"ns/m": {"kubernetes.io/mid-memory": 0}}
    doc["nodeSLO"]["resourceUsedThresholdWithBE"].pop("memoryAllocatableEvictLowerPercent")
    assert _ok("memory-evict", doc)["allocatableRelease"] == {}


def test_batch_requests_count_sidecars_but_not_plain_init_containers_and_clamp_negatives() -> None:
    sidecar = {"name": "s", "restartPolicy": "Always", "resources": {"requests": {"kubernetes.io/batch-cpu": "300"}}}
    plain = {"name": "i", "resources": {"requests": {"kubernetes.io/batch-cpu": "5000"}}}
    p = batch("b", "kubernetes.io/batch-cpu", "1000", init=[sidecar, plain])
    p["spec"]["containers"].append({"name": "neg", "resources": {"requests": {"kubernetes.io/batch-cpu": "-400"}}})
    doc = round_doc([], ALLOC_CPU, [{"pod": p}])
    doc["node"] = node({"cpu": "10"}, {"kubernetes.io/batch-cpu": "1000"})
    out = _ok("cpu-evict", doc)
    assert out["allocatablePodRelease"] == {"ns/b": {"kubernetes.io/batch-cpu": 1300}}
    assert out["allocatableRelease"] == {"kubernetes.io/batch-cpu": int(1300 - 0.7 * 1000)}


# --- eviction policy and orders


@pytest.mark.parametrize(
    ("annotation", "allowed"),
    [
        (None, True),
        ('["BEMemoryEvict"]', True),
        ('["MemoryEvict", "BEMemoryEvict"]', True),
        ('["MemoryEvict"]', False),
        ("[]", False),
        ("null", False),
        ("BEMemoryEvict", False),
        ('["BEMemoryEvict", 1]', False),
        ('[null, "BEMemoryEvict"]', True),
        ("", False),
    ],
)
def test_eviction_policy_annotation(annotation: str | None, allowed: bool) -> None:
    annotations = {} if annotation is None else {"koordinator.sh/eviction-policy": annotation}
    pods = [{"pod": pod("be", qos="BE", annotations=annotations), "memoryUsage": G}]
    out = _ok("memory-evict", round_doc(["BEMemoryEvict"], BE_80, pods, nodeMemoryUsage=95 * G))
    assert out["victims"] == (["ns/be"] if allowed else [])


def test_priority_order_keys_filters_and_ties() -> None:
    def p(name: str, used: int, **kw: Any) -> dict[str, Any]:
        kw.setdefault("enabled", True)
        return {"pod": pod(name, **kw), "memoryUsage": used}

    pods = [
        p("tie-1", 5, priority=100),
        p("big", 9, priority=100),
        p("tie-2", 5, priority=100),
        p("label-low", 1, priority=100, labels={"koordinator.sh/priority": "50"}),
        p("label-bad", 1, priority=100, labels={"koordinator.sh/priority": "x"}),  # → its priority value 100
        p("prio-90", 1, priority=90),
        p("evict-prio-1", 100, priority=10, annotations={"koordinator.sh/eviction-priority": "1"}),
        p("evict-prio-bad", 1, priority=95, annotations={"koordinator.sh/eviction-priority": "1.5"}),  # → 0
        p("evict-prio-neg", 1, priority=200, annotations={"koordinator.sh/eviction-priority": "-1"}),
        p("default-batch", 1, priority=None, qos="BE"),  # priority value 5500 > threshold
        p("over", 1, priority=301),
        p("disabled", 1, priority=100, enabled=False),
        p("pending", 1, priority=100, phase="Pending"),
        p("failed", 1, priority=100, phase="Failed"),
        p("no-phase", 1, priority=100, phase=None),
        {"pod": pod("no-metric", priority=100, enabled=True)},
    ]
    strategy = {**BE_80, "evictEnabledPriorityThreshold": 300}
    report = _ok("memory-evict", round_doc(["MemoryEvict"], strategy, pods, nodeMemoryUsage=G))["tasks"]["MemoryEvict"]
    assert report["release"] == {}
    assert [c["pod"] for c in report["candidates"]] == keys(
        [
            "evict-prio-neg",
            "prio-90",
            "evict-prio-bad",
            "label-low",
            "big",
            "tie-1",
            "tie-2",
            "label-bad",
            "pending",
            "evict-prio-1",
        ]
    )


def test_be_memory_order() -> None:
    pods = [
        {"pod": pod("a", qos="BE", priority=200), "memoryUsage": 1},
        {"pod": pod("b", qos="BE", priority=100), "memoryUsage": 50},
        {"pod": pod("z-zero", qos="BE"), "memoryUsage": 0},
        {"pod": pod("y-zero", qos="BE")},
        {"pod": pod("c", qos="BE"), "memoryUsage": 7},
        {"pod": pod("done", qos="BE", phase="Succeeded"), "memoryUsage": 3},  # any phase
        {"pod": pod("ls", qos="LS"), "memoryUsage": 99},
        {"pod": pod("kube-be", qos=None), "memoryUsage": 99},  # BestEffort by kube QoS: not the BE label
    ]
    report = _ok("memory-evict", round_doc(["BEMemoryEvict"], BE_80, pods))["tasks"]["BEMemoryEvict"]
    # Larger use first, the non-zero before the zero, zeros by name descending.
    assert [c["pod"] for c in report["candidates"]] == keys(["b", "c", "done", "a", "z-zero", "y-zero"])
    assert report["candidates"][0] == {"pod": "ns/b", "memoryUsed": 50}
    # Both priorities set and different: the lower first, whatever the use.
    pods = [{"pod": pod("hi", qos="BE", priority=200), "memoryUsage": 50}, {"pod": pod("lo", qos="BE", priority=100)}]
    report = _ok("memory-evict", round_doc(["BEMemoryEvict"], BE_80, pods))["tasks"]["BEMemoryEvict"]
    assert [c["pod"] for c in report["candidates"]] == keys(["lo", "hi"])


def test_be_cpu_order_and_per_pod_request() -> None:
    def be(name: str, cpu: str, used: int, priority: int | None = None) -> dict[str, Any]:
        return {
            "pod": pod(name, qos="BE", priority=priority, requests={"kubernetes.io/batch-cpu": cpu}),
            "cpuUsage": used,
        }

    pods = [be("half", "1000", 500), be("p2", "1000", 950, 2), be("full", "1000", 1000), be("p1", "1000", 900, 1)]
    report = _ok("cpu-evict", round_doc(["BECPUEvict"], SATISFACTION, pods))["tasks"]["BECPUEvict"]
    # A pair with a missing priority compares by usage/request; p1 and p2 by priority, though p2 is busier.
    assert [c["pod"] for c in report["candidates"]] == keys(["full", "p1", "p2", "half"])
    assert {"pod": "ns/half", "cpuUsed": 500, "cpuRequest": 1000, "cpuUsage": 0.5} in report["candidates"]


# --- the victim walk and its ledgers


def test_a_pod_credits_a_ledger_with_its_largest_amount_not_the_sum_over_tasks() -> None:
    pods = [
        {"pod": pod("be", qos="BE", priority=100, enabled=True), "memoryUsage": 6 * G},
        {"pod": pod("ls", qos="LS", priority=100, enabled=True), "memoryUsage": 5 * G},
    ]
    strategy = {**BE_80, "memoryEvictLowerPercent": 70, "evictEnabledPriorityThreshold": 1000}
    doc = round_doc(["BEMemoryEvict", "MemoryEvict"], strategy, pods, nodeMemoryUsage=80 * G)
    out = _ok("memory-evict", doc)
    # 10G to release. "be" counts 6G once on the "used" ledger (both tasks assign it 6G), so MemoryEvict still needs
    # "ls"; summing would have counted 12G and stopped after "be".
    assert out["release"] == 10 * G and out["victims"] == keys(["be", "ls"])


def test_a_task_covered_by_its_ledger_is_skipped() -> None:
    big = {"kubernetes.io/batch-memory": "100"}
    pods = [
        {"pod": pod("be", qos="BE", enabled=True, requests=big), "memoryUsage": 60 * G},
        {"pod": pod("be2", qos="BE", enabled=True, requests=big), "memoryUsage": 5 * G},
    ]
    strategy = {**BE_80, **ALLOC_MEM, "allocatableEvictPriorityThreshold": 5999}
    doc = round_doc(["BEMemoryEvict", "MemoryAllocatableEvict"], strategy, pods, nodeMemoryUsage=90 * G)
    doc["node"] = node({"memory": str(100 * G)}, {"kubernetes.io/batch-memory": "200"})
    out = _ok("memory-evict", doc)
    # BE: 12G to release, "be" covers it, and also credits its 100 bytes of batch-memory request to the "requested"
    # ledger: allocatable's 200/200 > 80% → 60 bytes are covered, so that task takes nobody.
    assert out["allocatableRelease"] == {"kubernetes.io/batch-memory": 60}
    assert out["victims"] == keys(["be"])
    assert out["tasks"]["MemoryAllocatableEvict"]["candidates"][0] == {
        "pod": "ns/be",
        "memoryUsed": 60 * G,
        "memoryRequest": 100,
    }


def test_the_used_and_requested_ledgers_are_separate() -> None:
    pods = [
        {"pod": pod("be", qos="BE"), "memoryUsage": 60 * G},
        {"pod": pod("prod", qos="LS", priority=100, enabled=True, requests={"memory": str(90 * G)}), "memoryUsage": G},
    ]
    strategy = {**BE_80, **ALLOC_MEM}
    doc = round_doc(["BEMemoryEvict", "MemoryAllocatableEvict"], strategy, pods, nodeMemoryUsage=90 * G)
    out = _ok("memory-evict", doc)
    # Allocatable: 90G of 100G memory > 80% → 20G on the "requested" ledger, which "be"'s 60G of use ("used" ledger)
    # does not cover, and which no prod pod credits (only batch/mid pods release allocatable): "prod" is taken.
    # ("be", a batch pod by its BE QoS, asks for no batch-memory, which the node has none of: 0 of it is due.)
    assert out["allocatableRelease"] == {"memory": int((0.9 - 0.7) * 100 * G), "kubernetes.io/batch-memory": 0}
    assert out["allocatablePodRelease"] == {"ns/be": {"kubernetes.io/batch-memory": 0}}
    assert out["victims"] == keys(["be", "prod"])


def test_cpu_tasks_walk_in_order_with_be_satisfaction_on_the_requested_ledger() -> None:
    def be(name: str, cpu: str, used: int) -> dict[str, Any]:
        return {
            "pod": pod(name, qos="BE", enabled=True, priority=5500, requests={"kubernetes.io/batch-cpu": cpu}),
            "cpuUsage": used,
        }

    pods = [be("a", "2000", 2000), be("b", "3000", 2900), be("c", "4000", 1000)]
    strategy = {**SATISFACTION, **CPU_USAGE, "evictEnabledPriorityThreshold": 6000}
    window = {"usage": 9500, "request": 50000, "realLimit": 10000, "count": 10}
    doc = round_doc(["BECPUEvict", "CPUEvict"], strategy, pods, nodeCPUUsage=81_000)
    doc["beCPU"] = {"window": window, "current": {"usage": 9500, "request": 50000, "realLimit": 10000}}
    out = _ok("cpu-evict", doc)
    # BECPUEvict: 50000 × (0.4 − 0.2) = 10000 of batch-cpu; by usage/request a (1.0), b (0.97), c (0.25) request
    # 9000 in all, short of it. CPUEvict's 3000m on the "used" ledger is covered by their 5900m: it takes nobody.
    assert out["release"] == 10000 and out["usageRelease"] == 100_000 * (81 - 78) // 100
    assert out["victims"] == keys(["a", "b", "c"])


# --- BE satisfaction


W = {"usage": 9500, "request": 50000, "realLimit": 10000, "count": 59}


@pytest.mark.parametrize(
    ("strategy", "window", "current", "release"),
    [
        ({}, W, dict(W), 10000),  # request and limit unchanged: the window's release
        ({}, W, {"usage": 13000, "request": 50000, "realLimit": 14000}, 6000),  # min(10000, 6000)
        ({}, W, {"usage": 9500, "request": 50000, "realLimit": 9000}, 10000),  # min(10000, 11000)
        ({}, W, {"usage": 16000, "request": 50000, "realLimit": 16000}, 0),  # current satisfied (0.32 > 0.3)
        ({}, W, {"usage": 1000, "request": 50000, "realLimit": 10000}, 0),  # current not busy
        ({}, W, None, 0),  # no current sample: limit 0 is not busy
        ({}, {**W, "usage": 8900}, dict(W), 0),  # 89% < 90%
        ({"cpuEvictBEUsageThresholdPercent": 80}, {**W, "usage": 8900}, {**W, "usage": 8900}, 10000),
        (
            {},
            {**W, "usage": 0, "realLimit": 999},
            {**W, "usage": 0, "realLimit": 999},
            int(50000 * (0.4 - 999 / 50000)),
        ),
        ({}, {**W, "realLimit": 0}, dict(W), 0),
        ({}, {**W, "request": 0}, dict(W), 0),
        ({}, {**W, "realLimit": 16000, "usage": 16000}, dict(W), 0),  # 0.32 > lower 0.3
        (
            {"cpuEvictBESatisfactionUpperPercent": 30, "cpuEvictBESatisfactionLowerPercent": 30},
            {**W, "realLimit": 15000, "usage": 15000},
            None,
            0,
        ),  # gap 0.3 − 0.3 ≤ 0
        ({"cpuEvictTimeWindowSeconds": 30}, {**W, "count": 9}, dict(W), 0),  # 9 × 1 < 30 // 3
        ({"cpuEvictTimeWindowSeconds": 30}, {**W, "count": 10}, dict(W), 10000),
        ({"cpuEvictTimeWindowSeconds": 30}, {**W, "count": 0}, dict(W), 0),
        ({"cpuEvictBESatisfactionUpperPercent": None}, W, dict(W), 0),
    ],
)
def test_be_satisfaction_release(
    strategy: dict[str, Any], window: dict[str, Any], current: dict[str, Any] | None, release: int
) -> None:
    literal = {k: v for k, v in {**SATISFACTION, **strategy}.items() if v is not None}
    doc = round_doc([], literal, [], beCPU={"window": window, **({"current": current} if current else {})})
    assert _ok("cpu-evict", doc)["release"] == release


def test_be_satisfaction_window_uses_the_collect_interval() -> None:
    doc = round_doc([], {**SATISFACTION, "cpuEvictTimeWindowSeconds": 30}, [], collectIntervalSeconds=5)
    doc["beCPU"] = {"window": {**W, "count": 2}, "current": dict(W)}
    assert _ok("cpu-evict", doc)["release"] == 10000  # 2 × 5 ≥ 30 // 3
    doc["beCPU"] = {"window": {**W, "count": 1}, "current": dict(W)}
    assert _ok("cpu-evict", doc)["release"] == 0


@pytest.mark.parametrize(
    ("batch_cpu", "release"),
    [
        ("10000", 10000),  # limit = allocatable 10000, as the real limit would be
        ("0", int(50000 * (0.4 - 1 / 50000))),  # 0 → 1 millicore: busy (under a core), satisfaction ≈ 0
        ("-5", 0),  # negative → −1: not busy
        (None, 0),  # absent → −1
    ],
)
def test_be_satisfaction_by_allocatable(batch_cpu: str | None, release: int) -> None:
    strategy = {**SATISFACTION, "cpuEvictPolicy": "evictByAllocatable"}
    doc = round_doc([], strategy, [], beCPU={"window": {**W, "realLimit": 1}, "current": {**W, "realLimit": 7}})
    doc["node"] = node({"cpu": "100"}, {} if batch_cpu is None else {"kubernetes.io/batch-cpu": batch_cpu})
    assert _ok("cpu-evict", doc)["release"] == release


# --- malformed input


@pytest.mark.parametrize(
    ("kind", "doc", "field"),
    [
        ("memory-evict", {"pods": [{"memoryUsage": 1}]}, "$.pods[0]"),
        ("memory-evict", {"pods": [{"pod": {}, "memoryUsage": "1Gi"}]}, "$.pods[0].memoryUsage"),
        ("memory-evict", {"nodeMemoryUsage": "lots"}, "$.nodeMemoryUsage"),
        ("memory-evict", {"featureGates": {"BEMemoryEvict": "yes"}}, "$.featureGates.BEMemoryEvict"),
        ("cpu-evict", {"featureGates": {"CPUEvict": 1}}, "$.featureGates.CPUEvict"),
        ("memory-evict", {"node": {"status": {"capacity": {"memory": "12Q"}}}}, "$.node.status.capacity.memory"),
        (
            "memory-evict",
            {"nodeSLO": {"resourceUsedThresholdWithBE": {"evictEnabledPriorityThreshold": 2**31}}},
            "$.nodeSLO.resourceUsedThresholdWithBE.evictEnabledPriorityThreshold",
        ),
        ("memory-evict", {"nodeSLO": {"resourceUsedThresholdWithBE": {"enable": "yes"}}}, "enable"),
        ("cpu-evict", {"beCPU": {"window": {"count": 1.5}}}, "$.beCPU.window.count"),
        (
            "cpu-evict",
            {"pods": [{"pod": {"spec": {"containers": [{"resources": {"requests": {"cpu": "x"}}}]}}}]},
            "cpu",
        ),
        ("cpu-evict", "nodeCPUUsage: .nan\n", "$.nodeCPUUsage"),
        ("cpu-evict", "beCPU: {window: {usage: .inf}}\n", "$.beCPU.window.usage"),
        ("cpu-evict", "pods: [{pod: {}, cpuUsage: .nan}]\n", "$.pods[0].cpuUsage"),
        ("cpu-evict", "[1, 2", "$"),
    ],
)
def test_malformed_input_exits_2_naming_the_field(kind: str, doc: Any, field: str) -> None:
    assert field in _bad(kind, doc)


def test_unknown_gates_and_strategy_fields_are_ignored() -> None:
    doc = round_doc([], {**BE_80, "cpuSuppressPolicy": "cpuset", "whatever": [1]}, [], nodeMemoryUsage=0)
    doc["featureGates"] = {"SomethingElse": True, "CPUEvict": "not read by memory-evict"}
    out = _ok("memory-evict", doc)
    assert out["tasks"] == {} and out["release"] == 0


def test_priority_value_defaults_by_class_and_label_numbers_parse_as_go_does() -> None:
    def p(name: str, **kw: Any) -> dict[str, Any]:
        return {"pod": pod(name, enabled=True, **kw), "memoryUsage": 1}

    pods = [
        p("mid-by-label", priority=0, labels={"koordinator.sh/priority-class": "koord-mid"}),  # 0 → 7500
        p("free", priority=3100),
        p("huge-evict-prio", priority=3000, annotations={"koordinator.sh/eviction-priority": "2147483648"}),  # → 0
        p("plus-label", priority=3000, labels={"koordinator.sh/priority": "+5"}),
        p("space-label", priority=3000, labels={"koordinator.sh/priority": " 1"}),  # unparsable → 3000
        p("batch-default", labels={"koordinator.sh/priority-class": "koord-batch"}),  # 5500
    ]
    strategy = {**BE_80, "evictEnabledPriorityThreshold": 7500}
    report = _ok("memory-evict", round_doc(["MemoryEvict"], strategy, pods))["tasks"]["MemoryEvict"]
    assert [c["pod"] for c in report["candidates"]] == keys(
        ["plus-label", "huge-evict-prio", "space-label", "free", "batch-default", "mid-by-label"]
    )


def test_a_pod_is_picked_once_per_key_and_negative_use_credits_nothing() -> None:
    pods = [
        {"pod": pod("dup", qos="BE", priority=1), "memoryUsage": -5 * G},
        {"pod": pod("dup", qos="BE", priority=2), "memoryUsage": 50 * G},
        {"pod": pod("other", qos="BE", priority=3), "memoryUsage": 6 * G},
        {"pod": pod("last", qos="BE", priority=4), "memoryUsage": 6 * G},
        {"pod": pod("spare", qos="BE", priority=5), "memoryUsage": 6 * G},
    ]
    out = _ok("memory-evict", round_doc(["BEMemoryEvict"], BE_80, pods, nodeMemoryUsage=90 * G))
    # 12G due: the first "dup" credits nothing (it does not take 5G off the ledger), the second "dup" is the same pod
    # and is skipped, "other" and "last" cover the rest, "spare" stays.
    assert out["victims"] == keys(["dup", "other", "last"])


def test_yaml_input_reads_like_json() -> None:
    doc = (
        "featureGates: {BEMemoryEvict: true}\n"
        "nodeSLO: {resourceUsedThresholdWithBE: {enable: true, memoryEvictThresholdPercent: 80}}\n"
        "node: {status: {capacity: {memory: 100G}}}\n"
        "nodeMemoryUsage: 95000000000\n"
        "pods:\n"
        "- pod: {metadata: {namespace: ns, name: be, labels: {koordinator.sh/qosClass: BE}}}\n"
        "  memoryUsage: 20000000000\n"
    )
    out = _ok("memory-evict", doc)
    assert out["release"] == 17 * G and out["victims"] == ["ns/be"]


def test_be_satisfaction_explains_the_deciding_step() -> None:
    current = {"usage": 13000, "request": 50000, "realLimit": 14000}
    out = _ok("cpu-evict", round_doc([], SATISFACTION, [], beCPU={"window": W, "current": current}))
    assert out["release"] == 6000
    assert out["explain"]["release"] == (
        "window: request 50000 × (40% − limit 10000 / request) = 10000; "
        "last: request 50000 × (40% − limit 14000 / request) = 6000; the lesser"
    )


def test_null_lists_and_objects_read_as_empty() -> None:
    doc = {"featureGates": None, "nodeSLO": None, "node": None, "pods": None, "beCPU": {"window": None}}
    out = _ok("cpu-evict", doc)
    assert out["tasks"] == {} and out["victims"] == [] and out["release"] == 0 and "usageRelease" not in out
    out = _ok("memory-evict", {"featureGates": None, "pods": None})
    assert "release" not in out and out["allocatableRelease"] == {} and out["evict"] is False
