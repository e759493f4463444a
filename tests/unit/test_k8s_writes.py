"""services.k8s.writes: the NodeMetric and Node writes built from decisions, and "nothing changed" detection."""

from __future__ import annotations

from typing import Any

import pytest

from schemas import koordinator, vocab
from schemas.node import MetricCollectPolicy
from schemas.noderesource import NodeResourceComputed
from services.k8s import writes
from tests.unit.test_noderesource_state import T0, metric_event

GI = 1024**3
ORIGIN = koordinator.ANNOTATION_ORIGIN_EXTENDED_ALLOCATABLE


def decision(resources: dict[str, int | None], *, due: bool = True, annotations: dict[str, str] | None = None) -> Any:
    return NodeResourceComputed(
        node="n1",
        computed_at=T0,
        trigger=("nodemetric",),
        outcome="computed",
        resources=resources,
        annotations=annotations or {},
        write_due=due,
        write_reason="first write" if due else "up to date",
    )


def node(capacity: dict[str, str] | None = None, *, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    lists = {"cpu": "100", "memory": "400Gi", **(capacity or {})}
    return {
        "metadata": {"name": "n1", "resourceVersion": "7", "annotations": annotations or {}},
        "status": {"capacity": dict(lists), "allocatable": dict(lists)},
    }


def test_a_nodemetric_is_created_with_the_event_spec_and_no_status() -> None:
    event = metric_event("n1")
    created = writes.nodemetric_to_create(event)
    assert created["apiVersion"] == "slo.koordinator.sh/v1alpha1"
    assert created["kind"] == "NodeMetric"
    assert created["metadata"] == {"name": "n1"}
    assert created["spec"] == {"metricCollectPolicy": koordinator.collect_policy_to_json(event.spec)}
    assert "status" not in created


def test_the_status_update_keeps_the_resource_version_and_is_none_once_written() -> None:
    event = metric_event("n1")
    stored = {**writes.nodemetric_to_create(event), "metadata": {"name": "n1", "resourceVersion": "3"}}
    update = writes.nodemetric_status_update(stored, event)
    assert update is not None
    assert update["metadata"]["resourceVersion"] == "3"
    assert update["status"] == koordinator.nodemetric_status_to_json(event.status, quantities=True)
    assert writes.nodemetric_status_update(update, event) is None
    assert writes.nodemetric_spec_update(update, event.spec) is None


def test_an_older_status_does_not_overwrite_a_newer_one() -> None:
    newer, older = metric_event("n1", at=T0 + 60), metric_event("n1", at=T0)
    stored = writes.nodemetric_status_update(writes.nodemetric_to_create(newer), newer)
    assert stored is not None
    assert writes.nodemetric_status_update(stored, older) is None


def test_a_different_spec_is_updated() -> None:
    event = metric_event("n1")
    stored = writes.nodemetric_to_create(event)
    stored["spec"]["metricCollectPolicy"]["reportIntervalSeconds"] = 30
    update = writes.nodemetric_spec_update(stored, event.spec)
    assert update is not None
    assert update["spec"] == {"metricCollectPolicy": koordinator.collect_policy_to_json(MetricCollectPolicy())}


def test_node_resources_are_set_in_capacity_and_allocatable_as_koordinator_quantities() -> None:
    write = writes.node_status_patch(
        node(), decision({vocab.BATCH_CPU: 25000, vocab.BATCH_MEMORY: 146 * GI, vocab.MID_CPU: 1500})
    )
    assert write is not None
    # Go's Quantity.String() of NewQuantity(25000, DecimalSI), as Koordinator writes a 25-core batch-cpu
    expected = {vocab.BATCH_CPU: "25k", vocab.BATCH_MEMORY: "146Gi", vocab.MID_CPU: "1500"}
    assert write.patch == {
        "metadata": {"resourceVersion": "7"},
        "status": {"capacity": expected, "allocatable": expected},
    }
    assert f"capacity {vocab.BATCH_CPU} absent → 25k" in write.changes


def test_nothing_is_written_when_the_node_holds_the_amounts_even_spelled_differently() -> None:
    current = node({vocab.BATCH_CPU: "25000", vocab.BATCH_MEMORY: "25k", vocab.MID_CPU: "1.5k"})
    wanted = decision({vocab.BATCH_CPU: 25000, vocab.BATCH_MEMORY: 25000, vocab.MID_CPU: 1500, vocab.MID_MEMORY: None})
    assert writes.node_status_patch(current, wanted) is None


def test_removed_resources_are_deleted_with_null_and_absent_ones_left_alone() -> None:
    current = node({vocab.BATCH_CPU: "25000"})
    write = writes.node_status_patch(current, decision({vocab.BATCH_CPU: None, vocab.BATCH_MEMORY: None}))
    assert write is not None
    assert write.patch["status"] == {"capacity": {vocab.BATCH_CPU: None}, "allocatable": {vocab.BATCH_CPU: None}}
    after = writes.apply_node_status_patch(current, write)
    assert vocab.BATCH_CPU not in after["status"]["capacity"]
    assert after["status"]["capacity"]["cpu"] == "100"
    assert writes.node_status_patch(after, decision({vocab.BATCH_CPU: None})) is None


def test_only_the_list_that_differs_is_patched_and_unreadable_quantities_are_rewritten() -> None:
    current = node({vocab.BATCH_CPU: "25000"})
    current["status"]["allocatable"][vocab.BATCH_CPU] = "not-a-quantity"
    write = writes.node_status_patch(current, decision({vocab.BATCH_CPU: 25000}))
    assert write is not None
    assert write.patch["status"] == {"allocatable": {vocab.BATCH_CPU: "25k"}}


def test_a_decision_that_is_not_due_writes_nothing() -> None:
    undue = decision({vocab.BATCH_CPU: 1000}, due=False, annotations={ORIGIN: "{}"})
    assert writes.node_status_patch(node(), undue) is None
    assert writes.node_annotation_patch(node(), undue) is None


def test_annotations_are_merged_only_when_they_differ() -> None:
    value = '{"resources":{"kubernetes.io/batch-cpu":"25000"}}'
    wanted = decision({vocab.BATCH_CPU: 25000}, annotations={ORIGIN: value})
    write = writes.node_annotation_patch(node(annotations={"other": "kept"}), wanted)
    assert write is not None
    assert write.patch == {"metadata": {"annotations": {ORIGIN: value}}}
    after = writes.apply_annotation_patch(node(annotations={"other": "kept"}), write)
    assert after["metadata"]["annotations"] == {"other": "kept", ORIGIN: value}
    assert writes.node_annotation_patch(after, wanted) is None


def test_status_writes_are_rate_limited_per_node() -> None:
    limit = writes.StatusRateLimit(10.0)
    assert limit.earliest("n1", 100.0) == 100.0
    limit.wrote("n1", 100.0)
    assert limit.earliest("n1", 104.0) == 110.0
    assert limit.earliest("n1", 111.0) == 111.0
    assert limit.earliest("n2", 104.0) == 104.0


@pytest.mark.parametrize("failures", [1, 2])
def test_health_turns_false_after_consecutive_failures_and_back_after_a_success(failures: int) -> None:
    health = writes.WriteHealth(3)
    for _ in range(failures):
        health.failed("boom")
    assert health.healthy
    health.failed("boom")
    health.failed("boom")
    assert not health.healthy
    assert health.last_error == "boom"
    health.succeeded()
    assert health.healthy


def test_the_recorder_keeps_objects_and_a_bounded_log_of_real_changes_only() -> None:
    recorder = writes.WriteRecorder(keep=2)
    first = recorder.nodemetric(metric_event("n1", at=T0), now=T0)
    assert (first.object, first.action) == ("nodemetric/n1", "created")
    assert recorder.nodemetric(metric_event("n1", at=T0), now=T0 + 1).action == "unchanged"
    assert recorder.node_resources(decision({vocab.BATCH_CPU: 1000}, due=False), now=T0).action == "skipped"
    updated = recorder.node_resources(decision({vocab.BATCH_CPU: 1000}), now=T0 + 2)
    assert (updated.object, updated.action) == ("node/n1", "updated")
    assert recorder.node_resources(decision({vocab.BATCH_CPU: 2000}), now=T0 + 3).action == "updated"
    exported = recorder.export()
    assert exported["nodes"][0]["status"]["allocatable"] == {vocab.BATCH_CPU: "2k"}
    assert [(w["object"], w["at"], w["reason"]) for w in exported["writes"]] == [
        ("node/n1", T0 + 2, "first write"),
        ("node/n1", T0 + 3, "first write"),
    ]
