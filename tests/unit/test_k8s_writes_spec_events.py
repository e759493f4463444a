"""services.k8s.writes: the NodeMetric spec owned by decisions, and the Events told about the colocation ConfigMap."""

from __future__ import annotations

from schemas import koordinator
from schemas.node import MetricCollectPolicy
from schemas.noderesource import ColocationConfigStatus
from services.k8s import writes
from tests.support.crd import assert_valid_nodemetric
from tests.unit.test_noderesource_state import T0, metric_event

CUSTOM = MetricCollectPolicy(aggregate_duration_seconds=120, report_interval_seconds=30, durations_seconds=(120,))
NS, CM = "koordinator-system", "slo-controller-config"


def spec_json(spec: MetricCollectPolicy) -> dict[str, object]:
    return {"metricCollectPolicy": koordinator.collect_policy_to_json(spec)}


def status(error: str | None, *, previous: str | None = None, rv: str = "5", at: float = T0) -> ColocationConfigStatus:
    return ColocationConfigStatus(error=error, previous_error=previous, resource_version=rv, at=at)


# --- NodeMetric spec


def test_a_nodemetric_created_for_a_status_write_takes_the_decided_spec_over_the_events() -> None:
    event = metric_event("n1")
    assert event.spec != CUSTOM
    assert writes.nodemetric_to_create(event, CUSTOM)["spec"] == spec_json(CUSTOM)
    assert writes.nodemetric_to_create(event)["spec"] == spec_json(event.spec)
    created = writes.nodemetric_with_spec("n1", CUSTOM)
    assert created["metadata"] == {"name": "n1"} and "status" not in created
    assert_valid_nodemetric(created)


def test_a_spec_update_keeps_status_and_resource_version() -> None:
    event = metric_event("n1")
    stored = writes.nodemetric_status_update(writes.nodemetric_to_create(event), event)
    assert stored is not None
    stored["metadata"]["resourceVersion"] = "9"
    update = writes.nodemetric_spec_update(stored, CUSTOM)
    assert update is not None
    assert update["spec"] == spec_json(CUSTOM)
    assert update["status"] == stored["status"] and update["metadata"]["resourceVersion"] == "9"
    assert stored["spec"] == spec_json(event.spec)  # the input is not modified
    assert writes.nodemetric_spec_update(update, CUSTOM) is None


def test_the_recorder_keeps_the_decided_spec_through_status_writes() -> None:
    recorder = writes.WriteRecorder(keep=10)
    assert recorder.nodemetric_spec("n1", CUSTOM, reason="strategy", now=T0).action == "created"
    assert recorder.nodemetric_spec("n1", CUSTOM, reason="strategy", now=T0 + 1).action == "unchanged"
    status_write = recorder.nodemetric(metric_event("n1"), spec=None, now=T0 + 2)
    assert status_write.action == "updated" and not any("spec" in change for change in status_write.changes)
    assert recorder.nodemetrics["n1"]["spec"] == spec_json(CUSTOM)  # the event's default spec did not win
    changed = recorder.nodemetric_spec("n1", MetricCollectPolicy(), reason="strategy", now=T0 + 3)
    assert (changed.action, changed.changes) == ("updated", ("spec updated",))
    assert recorder.nodemetrics["n1"]["status"]["updateTime"]  # the status survived the spec update
    # A status write for a node without an object creates it with the spec it is given.
    recorder.nodemetric(metric_event("n2"), spec=CUSTOM, now=T0 + 4)
    assert recorder.nodemetrics["n2"]["spec"] == spec_json(CUSTOM)
    assert [w["object"] for w in recorder.export()["writes"]] == [
        "nodemetric/n1",
        "nodemetric/n1",
        "nodemetric/n1",
        "nodemetric/n2",
    ]


# --- Events


def test_an_error_is_a_valid_warning_event_on_the_configmap() -> None:
    event = writes.config_event(status("invalid colocation-config: $.x bad"), namespace=NS, name=CM)
    assert event is not None
    assert (event["type"], event["reason"], event["message"]) == (
        "Warning",
        writes.EVENT_REASON_INVALID,
        "invalid colocation-config: $.x bad",
    )
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "namespace": NS,
        "name": CM,
        "resourceVersion": "5",
    }
    assert event["metadata"]["namespace"] == NS and event["metadata"]["name"].startswith(f"{CM}.")
    assert event["firstTimestamp"] == koordinator.format_rfc3339(T0) == event["lastTimestamp"]


def test_the_event_name_depends_on_the_error_and_version_not_on_the_time() -> None:
    def name(s: ColocationConfigStatus) -> str:
        event = writes.config_event(s, namespace=NS, name=CM)
        assert event is not None
        return str(event["metadata"]["name"])

    assert name(status("bad")) == name(status("bad", at=T0 + 99, previous="older"))
    assert len({name(status("bad")), name(status("worse")), name(status("bad", rv="6"))}) == 3


def test_a_recovery_is_a_normal_event_and_no_error_without_a_previous_one_is_nothing() -> None:
    assert writes.config_event(status(None), namespace=NS, name=CM) is None
    recovered = writes.config_event(status(None, previous="bad"), namespace=NS, name=CM)
    assert recovered is not None
    assert (recovered["type"], recovered["reason"]) == ("Normal", writes.EVENT_REASON_RECOVERED)
    assert "bad" in recovered["message"]


def test_a_long_error_is_cut_to_the_message_limit() -> None:
    event = writes.config_event(status("x" * 5000), namespace=NS, name=CM)
    assert event is not None
    assert len(event["message"]) == writes.EVENT_MESSAGE_LIMIT and event["message"].endswith("…")


def test_the_recorder_records_each_event_once() -> None:
    recorder = writes.WriteRecorder(keep=10)
    event = writes.config_event(status("bad"), namespace=NS, name=CM)
    assert event is not None
    first = recorder.event(event, now=T0)
    assert first.action == "created" and first.changes == (f"Warning {writes.EVENT_REASON_INVALID}",)
    assert recorder.event(event, now=T0 + 1).action == "unchanged"
    exported = recorder.export()
    assert exported["events"] == [event]
    assert [w["reason"] for w in exported["writes"]] == [writes.EVENT_REASON_INVALID]


def test_the_recorder_deletes_a_gone_nodes_nodemetric() -> None:
    recorder = writes.WriteRecorder(keep=10)
    recorder.nodemetric_spec("n1", CUSTOM, reason="strategy", now=T0)
    deleted = recorder.delete_nodemetric("n1", now=T0 + 1)
    assert (deleted.object, deleted.action, deleted.changes) == ("nodemetric/n1", "deleted", ("node gone",))
    assert recorder.delete_nodemetric("n1", now=T0 + 2).action == "unchanged"
    assert recorder.export()["nodemetrics"] == []
    assert [w["action"] for w in recorder.export()["writes"]] == ["created", "deleted"]
