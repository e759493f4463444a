"""The webhook's pure parts: the RFC 6902 diff (services.webhook.jsonpatch), reading an AdmissionReview v1 and the
Pod mutation handler (services.webhook.admission), the view the bridge's events build (services.webhook.state)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.cluster import (
    ColocationProfile,
    ColocationProfileObserved,
    NamespaceObserved,
    PriorityClassObserved,
    ProfileMeta,
)
from services.webhook import admission, colocation, jsonpatch
from services.webhook.state import AdmissionView
from tests.support.webhook import apply_patch


def strictly_equal(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


_scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from(["", "a", "b/c", "~x"])
_keys = st.sampled_from(["a", "b", "c/d", "e~f", "koordinator.sh/qosClass"])
_json = st.recursive(
    _scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4), max_leaves=20
)


@settings(max_examples=300, deadline=None)
@given(_json, _json)
def test_applying_the_diff_to_the_original_gives_the_mutated_document(original: Any, mutated: Any) -> None:
    patch = jsonpatch.diff(original, mutated)
    assert strictly_equal(apply_patch(original, patch), mutated)
    assert (patch == []) == strictly_equal(original, mutated)


def test_keys_are_escaped_and_a_boolean_is_not_a_number() -> None:
    patch = jsonpatch.diff({"labels": {"a/b": "1", "t~": 1}}, {"labels": {"a/b": "2", "t~": True}})
    assert patch == [
        {"op": "replace", "path": "/labels/a~1b", "value": "2"},
        {"op": "replace", "path": "/labels/t~0", "value": True},
    ]
    assert jsonpatch.diff([1, 2, 3], [1]) == [{"op": "remove", "path": "/2"}, {"op": "remove", "path": "/1"}]


# --- AdmissionReview v1


def review(request: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request, **top}


def pod_request(pod: dict[str, Any], *, operation: str = "CREATE", **fields: Any) -> admission.AdmissionRequest:
    return admission.review_request(
        review(
            {
                "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
                "namespace": "jobs",
                "operation": operation,
                "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"},
                "object": pod,
                "oldObject": None,
                "dryRun": False,
                "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
                **fields,
            }
        )
    )


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "expected a JSON object, got an array"),
        ({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}, "apiVersion: expected"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "Pod"}, "kind: expected 'AdmissionReview'"),
        (review(None), "request: missing"),  # type: ignore[arg-type]
        (review({"uid": 7, "kind": {}, "resource": {}, "operation": "CREATE"}), "request.uid: expected str, got int"),
        (review({"uid": "u", "resource": {}, "operation": "CREATE"}), "request: object missing required field"),
        (review({"uid": "", "kind": {}, "resource": {}, "operation": "CREATE"}), "request.uid: missing or empty"),
        (review({"uid": "u", "kind": {}, "resource": {}, "operation": "PATCH"}), "request.operation: expected one"),
    ],
)
def test_what_is_not_an_admission_review_v1_is_refused_naming_the_field(document: Any, message: str) -> None:
    with pytest.raises(admission.BadReview, match=message):
        admission.review_request(document)


def profile_event(name: str, **spec: Any) -> ColocationProfileObserved:
    profile = ColocationProfile(metadata=ProfileMeta(name=name), spec=spec)
    return ColocationProfileObserved(name=name, observed_at=1.0, profile=profile)


def view(*profiles: ColocationProfileObserved) -> AdmissionView:
    built = AdmissionView()
    for event in (
        *profiles,
        NamespaceObserved(name="jobs", observed_at=1.0, labels={"team": "data"}),
        PriorityClassObserved(
            name="koord-batch", observed_at=1.0, value=5999, preemption_policy="PreemptLowerPriority"
        ),
    ):
        built.apply(event)
    return built


BATCH = profile_event(
    "batch",
    namespaceSelector={"matchLabels": {"team": "data"}},
    selector={"matchLabels": {"app": "spark"}},
    qosClass="BE",
    priorityClassName="koord-batch",
    schedulerName="koord-scheduler",
    labels={"koordinator.sh/mutated": "true"},
)


def spark_pod(**metadata: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "spark-", "labels": {"app": "spark"}, **metadata},
        "spec": {
            "containers": [
                {"name": "c", "image": "spark:3", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
                {"name": "side", "image": "s:1", "resources": {"limits": {"cpu": "1", "memory": "64Mi"}}},
            ],
            "restartPolicy": "Never",
        },
    }


def answer(request: admission.AdmissionRequest, the_view: AdmissionView) -> admission.AdmissionResponse:
    return admission.mutate_pod(request, the_view, skip_mutating_resources=False, draw=lambda: 0)


def decoded_patch(response: admission.AdmissionResponse) -> list[dict[str, Any]]:
    assert response.allowed and response.patch_type == "JSONPatch" and response.patch is not None
    patch: list[dict[str, Any]] = json.loads(base64.b64decode(response.patch))
    return patch


def test_a_matching_pod_is_answered_with_the_patch_that_makes_it_a_batch_pod() -> None:
    pod = spark_pod()  # no namespace in the object: the request's is matched (and not written)
    response = answer(pod_request(pod), view(BATCH))
    assert response.uid == "705ab4f5-6393-11e8-b7cc-42010a800002"
    mutated = apply_patch(pod, decoded_patch(response))
    assert "namespace" not in mutated["metadata"]
    assert mutated["metadata"]["labels"] == {
        "app": "spark",
        "koordinator.sh/mutated": "true",
        "koordinator.sh/qosClass": "BE",
    }
    spec = mutated["spec"]
    assert (spec["schedulerName"], spec["priorityClassName"], spec["priority"]) == (
        "koord-scheduler",
        "koord-batch",
        5999,
    )
    assert spec["preemptionPolicy"] == "PreemptLowerPriority"
    assert spec["containers"][0]["resources"] == {
        "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "1Gi"}
    }
    assert spec["containers"][1]["resources"] == {  # a limit without a request gets one
        "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "64Mi"},
        "requests": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "64Mi"},
    }
    assert spec["restartPolicy"] == "Never" and spec["containers"][0]["image"] == "spark:3"
    expected, _ = colocation.mutate_pod(
        pod,
        [msgspec_profile(BATCH)],
        namespace_labels={"team": "data"},
        priority_classes={
            "koord-batch": colocation.PriorityClass(value=5999, preemption_policy="PreemptLowerPriority")
        },
        skip_mutating_resources=False,
        draw=lambda: 0,
    )
    assert strictly_equal(mutated, expected)
    encoded = json.loads(admission.encode_review(response))
    assert encoded["apiVersion"] == "admission.k8s.io/v1" and encoded["kind"] == "AdmissionReview"
    assert set(encoded["response"]) == {"uid", "allowed", "patchType", "patch"}


def msgspec_profile(event: ColocationProfileObserved) -> dict[str, Any]:
    import msgspec

    built: dict[str, Any] = msgspec.to_builtins(event.profile)
    return built


def test_no_match_another_operation_or_a_subresource_pass_unchanged() -> None:
    for request, the_view in (
        (pod_request(spark_pod(labels={"app": "web"})), view(BATCH)),
        (pod_request(spark_pod(), namespace="web"), view(BATCH)),  # known namespace without the label
        (pod_request(spark_pod(), operation="UPDATE", oldObject=spark_pod()), view(BATCH)),
        (pod_request(spark_pod(), subResource="ephemeralcontainers"), view(BATCH)),
        (pod_request(spark_pod()), view()),
    ):
        if request.namespace == "web":
            the_view.apply(NamespaceObserved(name="web", observed_at=1.0, labels={"team": "web"}))
        response = answer(request, the_view)
        assert response.allowed and response.patch is None and response.status is None


def test_an_unknown_namespace_counts_as_a_match_as_in_koordinator() -> None:
    response = answer(pod_request(spark_pod(namespace="new-team"), namespace="new-team"), view(BATCH))
    assert decoded_patch(response)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"priorityClassName": "koord-missing"}, 'priorityclasses.scheduling.k8s.io "koord-missing" not found'),
        ({"probability": "30"}, "not a percentage"),
        ({"patch": {"spec": {"containers": "x"}}}, "the patch does not leave a valid Pod"),
    ],
)
def test_what_koordinator_refuses_is_allowed_false_with_the_reason(spec: dict[str, Any], message: str) -> None:
    response = answer(pod_request(spark_pod()), view(profile_event("bad", **spec)))
    assert not response.allowed and response.patch is None and response.status is not None
    assert response.status.code == 400 and message in response.status.message


def test_a_pod_that_does_not_decode_is_refused_with_the_reason() -> None:
    pod = spark_pod()
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    response = answer(pod_request(pod), view(BATCH))
    assert not response.allowed and response.status is not None and "lots" in response.status.message
    response = answer(pod_request([]), view(BATCH))  # type: ignore[arg-type]
    assert not response.allowed and response.status is not None
    assert response.status.message == "request.object: expected a Pod, got an array"


def test_the_view_follows_changes_and_tombstones() -> None:
    the_view = view(profile_event("b"), profile_event("a"))
    assert [p["metadata"]["name"] for p in the_view.profiles] == ["a", "b"]
    the_view.apply(ColocationProfileObserved(name="a", observed_at=2.0, deleted=True))
    the_view.apply(NamespaceObserved(name="jobs", observed_at=2.0, deleted=True))
    the_view.apply(PriorityClassObserved(name="koord-batch", observed_at=2.0, value=6000))
    assert [p["metadata"]["name"] for p in the_view.profiles] == ["b"]
    assert the_view.namespace_labels("jobs") is None
    assert the_view.priority_classes["koord-batch"] == colocation.PriorityClass(value=6000)
    assert the_view.counts() == {
        "clustercolocationprofile": 1,
        "clustercolocationprofile-koordbus": 0,
        "clustercolocationprofile-shadowed": 0,
        "namespace": 0,
        "priorityclass": 1,
    }


_any_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.sampled_from(["", "1", "x", "BE"]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                ["metadata", "spec", "labels", "containers", "resources", "requests", "cpu", "name", "app"]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=25,
)
_profile_fields = st.fixed_dictionaries(
    {},
    optional={
        "labels": _any_json,
        "annotations": _any_json,
        "labelKeysMapping": _any_json,
        "labelSuffixes": _any_json,
        "schedulerName": _any_json,
        "qosClass": _any_json,
        "priorityClassName": _any_json,
        "koordinatorPriority": _any_json,
        "probability": _any_json,
        "patch": _any_json,
        "selector": _any_json,
        "namespaceSelector": _any_json,
    },
)


@settings(max_examples=400, deadline=None)
@given(_any_json, _profile_fields)
def test_whatever_the_pod_or_the_profile_holds_the_answer_is_an_answer(pod: Any, spec: dict[str, Any]) -> None:
    for obj in (pod, {**spark_pod(), "spec": pod} if isinstance(pod, dict) else pod):
        response = answer(pod_request(obj), view(profile_event("fuzz", **spec)))
        assert response.allowed or (response.status is not None and response.status.code == 400)
