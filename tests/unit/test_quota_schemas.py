"""ElasticQuota / ElasticQuotaProfile decoding, the QuotaSpec view, its errors, and rendering back (CRD-valid)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from schemas import quota as q
from tests.support.crd import crd_errors, crd_validator

QUOTA_CRD = "scheduling.sigs.k8s.io_elasticquotas.yaml"
PROFILE_CRD = "quota.koordinator.sh_elasticquotaprofiles.yaml"
GI = 1024**3


def kubectl_quota(**overrides: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "scheduling.sigs.k8s.io/v1alpha1",
        "kind": "ElasticQuota",
        "metadata": {
            "name": "team-a",
            "namespace": "ns-a",
            "uid": "u-1",
            "resourceVersion": "42",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": [{"manager": "kubectl"}],
            "labels": {q.LABEL_PARENT: "org", q.LABEL_IS_PARENT: "false", q.LABEL_TREE_ID: "t1"},
            "annotations": {
                q.ANNOTATION_SHARED_WEIGHT: '{"cpu": 8, "memory": "16Gi"}',
                q.ANNOTATION_NAMESPACES: '["ns-a", "ns-b"]',
                q.ANNOTATION_RUNTIME: '{"cpu":"3"}',
            },
        },
        "spec": {"min": {"cpu": "500m", "memory": "1Gi"}, "max": {"cpu": 4, "memory": "8Gi"}},
        "status": {"used": {"cpu": "1"}},
    }
    obj.update(overrides)
    return obj


def test_kubectl_output_decodes_to_integer_spec() -> None:
    spec = q.decode_elastic_quota(json.dumps(kubectl_quota()))
    assert (spec.name, spec.namespace, spec.parent, spec.tree_id) == ("team-a", "ns-a", "org", "t1")
    assert not spec.is_parent and spec.allow_lent_resource
    assert spec.min == {"cpu": 500, "memory": GI}
    assert spec.max == {"cpu": 4000, "memory": 8 * GI}
    assert spec.shared_weight == {"cpu": 8000, "memory": 16 * GI}
    assert spec.namespaces == ("ns-a", "ns-b")
    assert spec.used == {"cpu": 1000}
    assert (spec.uid, spec.resource_version) == ("u-1", "42")


def test_label_defaults() -> None:
    bare = q.quota_spec(msgspec.convert({"metadata": {"name": "x"}, "spec": {"max": {"cpu": "2"}}}, q.ElasticQuota))
    assert bare.parent == q.ROOT_QUOTA and bare.allow_lent_resource and not bare.is_parent
    assert bare.shared_weight == {"cpu": 2000}  # missing shared-weight → max
    assert bare.namespaces is None
    root = q.quota_spec(msgspec.convert({"metadata": {"name": q.ROOT_QUOTA}}, q.ElasticQuota))
    assert root.parent == ""
    meta = {
        "name": "y",
        "labels": {q.LABEL_ALLOW_LENT_RESOURCE: "false", q.LABEL_IS_PARENT: "true", q.LABEL_IS_ROOT: "true"},
        "annotations": {q.ANNOTATION_SHARED_WEIGHT: '{"cpu": "0"}'},
    }
    labelled = q.quota_spec(msgspec.convert({"metadata": meta, "spec": {"max": {"cpu": 1}}}, q.ElasticQuota))
    assert not labelled.allow_lent_resource and labelled.is_parent and labelled.is_root
    assert labelled.shared_weight == {"cpu": 1000}  # an all-zero weight also falls back to max


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        ({"spec": {"min": {"cpu": "two"}}}, "spec.min.cpu", "cannot parse quantity 'two'"),
        ({"status": {"used": {"memory": "1Zi"}}}, "status.used.memory", "cannot parse quantity"),
        (
            {"metadata": {"name": "team-a", "namespace": "ns-a", "annotations": {q.ANNOTATION_SHARED_WEIGHT: "{cpu:"}}},
            f"metadata.annotations[{q.ANNOTATION_SHARED_WEIGHT}]",
            "not valid JSON",
        ),
        (
            {"metadata": {"name": "team-a", "namespace": "ns-a", "annotations": {q.ANNOTATION_SHARED_WEIGHT: "[1]"}}},
            f"metadata.annotations[{q.ANNOTATION_SHARED_WEIGHT}]",
            "expected a JSON object of quantities",
        ),
        (
            {"metadata": {"name": "team-a", "namespace": "ns-a", "annotations": {q.ANNOTATION_NAMESPACES: '"ns"'}}},
            f"metadata.annotations[{q.ANNOTATION_NAMESPACES}]",
            "expected a JSON list of strings",
        ),
    ],
)
def test_bad_input_names_quota_field_and_problem(change: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(q.QuotaFormatError) as caught:
        q.decode_elastic_quota(kubectl_quota(**change))
    err = caught.value
    assert err.quota == "ns-a/team-a" and err.field == field and problem in err.problem
    assert str(err).startswith(f"quota ns-a/team-a: {field}: ")


def test_wrong_json_types_and_text_are_format_errors() -> None:
    with pytest.raises(q.QuotaFormatError, match=r"quota team-a: metadata.labels"):
        q.decode_elastic_quota(kubectl_quota(metadata={"name": "team-a", "labels": {"a": 1}}))
    with pytest.raises(q.QuotaFormatError, match="not a JSON object"):
        q.decode_elastic_quota(b"{nope")
    with pytest.raises(q.QuotaFormatError, match=r"metadata.name: is required"):
        q.decode_elastic_quota({"spec": {}})


def test_render_is_crd_valid_and_writes_what_koordinator_writes() -> None:
    spec = q.decode_elastic_quota(kubectl_quota())
    state = q.QuotaState(
        name="team-a",
        runtime={"cpu": 3500, "memory": 2 * GI},
        request={"cpu": 4000},
        child_request={"cpu": 4000},
        used={"cpu": 1000, "memory": 512 * 1024**2},
        non_preemptible_used={"cpu": 250},
    )
    obj = q.render_elastic_quota(spec, state)
    assert crd_errors(crd_validator(QUOTA_CRD), obj) == []
    annotations = obj["metadata"]["annotations"]
    assert annotations[q.ANNOTATION_RUNTIME] == '{"cpu":"3500m","memory":"2Gi"}'
    assert annotations[q.ANNOTATION_NON_PREEMPTIBLE_USED] == '{"cpu":"250m"}'
    assert annotations[q.ANNOTATION_GUARANTEED] == "{}"
    assert annotations[q.ANNOTATION_NAMESPACES] == '["ns-a", "ns-b"]'  # kept as written
    assert obj["status"] == {"used": {"cpu": "1", "memory": "512Mi"}}
    assert obj["metadata"]["labels"][q.LABEL_TREE_ID] == "t1"
    assert obj["metadata"]["resourceVersion"] == "42"
    again = q.decode_elastic_quota(obj)
    assert (again.min, again.max, again.shared_weight, again.parent) == (
        spec.min,
        spec.max,
        spec.shared_weight,
        spec.parent,
    )


def test_render_without_state_adds_parent_label_and_default_shared_weight() -> None:
    spec = q.QuotaSpec(name="plain", namespace="ns", max={"cpu": 2000, "pods": 1024}, shared_weight={"cpu": 2000})
    obj = q.render_elastic_quota(spec)
    assert crd_errors(crd_validator(QUOTA_CRD), obj) == []
    assert obj["metadata"]["labels"] == {q.LABEL_PARENT: q.ROOT_QUOTA}
    assert obj["metadata"]["annotations"] == {q.ANNOTATION_SHARED_WEIGHT: '{"cpu":"2"}'}
    assert obj["spec"]["max"] == {"cpu": "2", "pods": "1024"}  # non-memory resources are DecimalSI
    assert "status" not in obj


def test_profile_round_trip_is_crd_valid() -> None:
    document = {
        "apiVersion": q.PROFILE_API_VERSION,
        "kind": q.PROFILE_KIND,
        "metadata": {"name": "gpu-pool", "namespace": "kube-system", "labels": {q.LABEL_TREE_ID: "123"}},
        "spec": {
            "quotaName": "gpu-root",
            "resourceRatio": "0.9",
            "quotaLabels": {"team": "ml"},
            "nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]},
            "extra": "ignored",
        },
    }
    profile = msgspec.convert(document, q.ElasticQuotaProfile)
    assert profile.spec.quota_name == "gpu-root" and profile.spec.resource_ratio == "0.9"
    rendered = q.profile_to_json(profile)
    assert crd_errors(crd_validator(PROFILE_CRD), rendered) == []
    assert rendered["spec"]["nodeSelector"]["matchExpressions"][0]["values"] == ["gpu"]
    assert "extra" not in rendered["spec"]
    with pytest.raises(msgspec.ValidationError, match="nodeSelector"):
        msgspec.convert({"spec": {"quotaName": "x"}}, q.ElasticQuotaProfile)
