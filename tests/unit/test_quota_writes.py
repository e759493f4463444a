"""The quota mirror's pure decisions: the desired ElasticQuota for a status, the update over what the server holds
(amounts not spellings, other owners' labels kept, our stale keys removed), and record-only bookkeeping."""

from __future__ import annotations

import copy
from typing import Any

from schemas import quota
from schemas.quota_service import QuotaStatusComputed
from services.k8s import quota_writes
from tests.support.crd import crd_errors, crd_validator
from tests.unit.test_quota_validation import eq

STATE = quota.QuotaState(name="a", parent="org", runtime={"cpu": 12_000}, request={"cpu": 12_000}, used={"cpu": 3_500})


def status(**overrides: Any) -> QuotaStatusComputed:
    fields: dict[str, Any] = {
        "quota": "a",
        "tree": "default",
        "computed_at": 1.0,
        "events_seq": 4,
        "object": eq("a", parent="org", min={"cpu": "10"}, max={"cpu": "40"}),
        "state": STATE,
    }
    fields.update(overrides)
    return QuotaStatusComputed(**fields)


def test_the_desired_object_is_crd_valid_with_the_write_back_annotations() -> None:
    desired = quota_writes.desired_quota(status())
    assert desired is not None
    assert crd_errors(crd_validator("scheduling.sigs.k8s.io_elasticquotas.yaml"), desired) == []
    annotations = desired["metadata"]["annotations"]
    assert annotations["quota.scheduling.koordinator.sh/runtime"] == '{"cpu":"12"}'
    assert desired["status"] == {"used": {"cpu": "3500m"}}
    assert "resourceVersion" not in desired["metadata"] and desired["metadata"]["namespace"] == "ns"
    assert quota_writes.desired_quota(status(deleted=True)) is None


def test_nothing_to_write_when_the_server_holds_the_same_amounts() -> None:
    desired = quota_writes.desired_quota(status())
    assert desired is not None
    current = copy.deepcopy(desired)
    current["metadata"].update(resourceVersion="991", uid="u-1")
    current["spec"]["min"] = {"cpu": "10000m"}
    current["status"]["used"] = {"cpu": "3.5", "memory": "0"}
    current["metadata"]["labels"]["team"] = "infra"  # someone else's label
    assert quota_writes.quota_update(current, desired) is None


def test_an_update_keeps_the_servers_version_and_foreign_keys_and_drops_our_stale_ones() -> None:
    desired = quota_writes.desired_quota(status(state=quota.QuotaState(name="a", runtime={"cpu": 20_000})))
    assert desired is not None
    current = copy.deepcopy(quota_writes.desired_quota(status())) or {}
    current["metadata"].update(resourceVersion="991", uid="u-1")
    current["metadata"]["annotations"]["owner"] = "platform"
    current["metadata"]["annotations"]["quota.scheduling.koordinator.sh/namespaces"] = '["old"]'
    update = quota_writes.quota_update(current, desired)
    assert update is not None
    body, changes = update
    assert body["metadata"]["resourceVersion"] == "991" and body["metadata"]["uid"] == "u-1"
    assert body["metadata"]["annotations"]["owner"] == "platform"
    assert "quota.scheduling.koordinator.sh/namespaces" not in body["metadata"]["annotations"]
    assert body["metadata"]["annotations"]["quota.scheduling.koordinator.sh/runtime"] == '{"cpu":"20"}'
    assert "status.used" in changes and any(c.startswith("annotations ") and "runtime" in c for c in changes)


def test_the_recorder_keeps_objects_and_a_log() -> None:
    recorder = quota_writes.QuotaRecorder(keep=10)
    desired = quota_writes.desired_quota(status())
    assert desired is not None
    assert recorder.write(desired, now=1.0) == "created"
    assert recorder.write(desired, now=2.0) == "unchanged"
    changed = quota_writes.desired_quota(status(object=eq("a", parent="org", min={"cpu": "11"}, max={"cpu": "40"})))
    assert changed is not None and recorder.write(changed, now=3.0) == "updated"
    assert recorder.delete("ns", "a", now=4.0) == "deleted" and recorder.delete("ns", "a", now=5.0) == "unchanged"
    exported = recorder.export()
    assert [w["action"] for w in exported["writes"]] == ["created", "updated", "deleted"]
    assert exported["elasticquotas"] == []
