"""schemas.kube: decoding Kubernetes objects, the effective pod request, and the QoS / priority derivations (§0)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from schemas import kube, vocab


def _pod(spec: dict[str, Any] | None = None, **top: Any) -> kube.Pod:
    return msgspec.convert({"spec": spec or {}, **top}, kube.Pod)


def _container(requests: dict[str, Any] | None = None, limits: dict[str, Any] | None = None, **extra: Any) -> Any:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": "c", "resources": resources, **extra}


# --- decoding


def test_decodes_camel_case_and_ignores_unknown_fields() -> None:
    pod = msgspec.json.decode(
        b"""{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "web", "namespace": "prod", "uid": "u1", "resourceVersion": "7",
                          "labels": {"app": "web"}, "creationTimestamp": "2026-01-01T00:00:00Z",
                          "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1",
                                               "uid": "rs", "controller": true}]},
             "spec": {"nodeName": "n1", "schedulerName": "koord-scheduler", "priority": 9500,
                      "priorityClassName": "koord-prod", "dnsPolicy": "ClusterFirst",
                      "containers": [{"name": "main", "image": "x", "resources": {"requests": {"cpu": "500m"}}}]},
             "status": {"phase": "Running", "qosClass": "Burstable", "podIP": "10.0.0.1"}}""",
        type=kube.Pod,
    )
    assert pod.metadata.resource_version == "7"
    assert pod.metadata.owner_references[0].controller is True
    assert pod.metadata.creation_timestamp is not None and pod.metadata.creation_timestamp.year == 2026
    assert (pod.spec.node_name, pod.spec.scheduler_name, pod.spec.priority) == ("n1", "koord-scheduler", 9500)
    assert (pod.status.phase, pod.status.qos_class) == ("Running", "Burstable")
    assert kube.pod_key(pod) == "prod/web"


@pytest.mark.parametrize(
    ("document", "where"),
    [
        (b'{"spec": {"containers": [{"resources": {"requests": {"cpu": "lots"}}}]}}', "requests.cpu"),
        (b'{"spec": {"overhead": {"memory": "1Qi"}}}', "overhead.memory"),
    ],
)
def test_a_bad_quantity_fails_decoding_with_its_path(document: bytes, where: str) -> None:
    with pytest.raises(msgspec.ValidationError) as caught:
        msgspec.json.decode(document, type=kube.Pod)
    assert f".{where}: cannot parse quantity" in str(caught.value)
    assert "$.spec" in str(caught.value)


def test_node_amounts_and_absent_maps() -> None:
    node = msgspec.convert({"status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": 110}}}, kube.Node)
    assert kube.node_capacity(node) == {"cpu": 4000, "memory": 8 * 1024**3, "pods": 110}
    assert node.status.allocatable is None
    assert kube.node_allocatable(node) == {}


# --- pod_request


def test_containers_add_up() -> None:
    pod = _pod({"containers": [_container({"cpu": "1", "memory": "1Gi"}), _container({"cpu": "250m", "gpu": "1"})]})
    assert kube.pod_request(pod) == {"cpu": 1250, "memory": 1024**3, "gpu": 1}


def test_an_init_container_larger_than_the_containers_sets_the_request() -> None:
    pod = _pod(
        {
            "initContainers": [_container({"cpu": "3", "memory": "100Mi"}), _container({"cpu": "1", "memory": "2Gi"})],
            "containers": [_container({"cpu": "2", "memory": "1Gi"})],
        }
    )
    assert kube.pod_request(pod) == {"cpu": 3000, "memory": 2 * 1024**3}


def test_sidecars_add_to_the_containers_and_to_later_init_steps() -> None:
    pod = _pod(
        {
            "initContainers": [
                _container({"cpu": "1"}, restartPolicy="Always"),  # sidecar: runs beside everything after it
                _container({"cpu": "3"}),  # its step: 3 + 1 = 4
            ],
            "containers": [_container({"cpu": "2"})],
        }
    )
    # running total 2 + 1 = 3 < the init step 4
    assert kube.pod_request(pod) == {"cpu": 4000}
    only_sidecar = _pod({"initContainers": [_container({"cpu": "1"}, restartPolicy="Always")], "containers": []})
    assert kube.pod_request(only_sidecar) == {"cpu": 1000}


def test_overhead_and_pod_level_requests() -> None:
    pod = _pod(
        {
            "containers": [_container({"cpu": "1", "memory": "1Gi", "gpu": "1"})],
            "resources": {"requests": {"cpu": "4", "gpu": "8"}},
            "overhead": {"cpu": "100m", "memory": "64Mi"},
        }
    )
    # pod-level cpu replaces the containers' cpu; gpu is not a pod-level resource; overhead comes on top
    assert kube.pod_request(pod) == {"cpu": 4100, "memory": 1024**3 + 64 * 1024**2, "gpu": 1}


def test_a_pod_without_requests_asks_for_nothing() -> None:
    assert kube.pod_request(_pod({"containers": [_container()]})) == {}


# --- QoS and priority


@pytest.mark.parametrize(
    ("containers", "expected"),
    [
        ([_container()], "BestEffort"),
        ([_container({"cpu": "0"}, {"memory": "0"})], "BestEffort"),
        ([_container({"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"})], "Guaranteed"),
        ([_container({"cpu": "1", "memory": "1Gi"}, {"cpu": "2", "memory": "1Gi"})], "Burstable"),
        ([_container({"cpu": "1"}, {"cpu": "1"})], "Burstable"),  # no memory limit
        ([_container(None, {"cpu": "1", "memory": "1Gi"})], "Burstable"),  # not defaulted from limits here
        ([_container({"cpu": "1"}), _container({"cpu": "1", "memory": "1"}, {"cpu": "1", "memory": "1"})], "Burstable"),
    ],
)
def test_computed_kube_qos(containers: list[Any], expected: str) -> None:
    assert kube.pod_kube_qos(_pod({"containers": containers})) == expected


def test_status_qos_wins_over_the_computed_one() -> None:
    pod = _pod({"containers": [_container()]}, status={"qosClass": "Guaranteed"})
    assert kube.pod_kube_qos(pod) == "Guaranteed"
    assert kube.pod_qos_class(pod) == vocab.QOS_LSR


def test_koordinator_qos_label_then_kube_qos() -> None:
    labelled = _pod(metadata={"labels": {vocab.QOS_CLASS_LABEL: "LSE"}}, status={"qosClass": "Burstable"})
    assert kube.pod_qos_class(labelled) == "LSE"
    assert kube.pod_qos_class(_pod({"containers": [_container()]})) == "BE"  # computed BestEffort


def test_priority_class_from_label_value_and_qos() -> None:
    assert kube.pod_priority_class(_pod(metadata={"labels": {vocab.PRIORITY_CLASS_LABEL: "koord-mid"}})) == "koord-mid"
    assert kube.pod_priority_class(_pod({"priority": 5100})) == "koord-batch"
    assert kube.pod_priority_class(_pod({"containers": [_container()]})) == "koord-batch"  # BestEffort → BE
    burstable = _pod({"containers": [_container({"cpu": "1"})]})
    assert kube.pod_priority_class(burstable) == "koord-prod"  # LS → prod
    unknown_label = _pod({"priority": 9500}, metadata={"labels": {vocab.PRIORITY_CLASS_LABEL: "gold"}})
    assert kube.pod_priority_class(unknown_label) == "koord-batch"  # not from spec.priority: from QoS (BestEffort)


def test_priority_value_defaults_to_the_class_default() -> None:
    assert kube.pod_priority_value(_pod({"priority": 7100})) == 7100
    assert kube.pod_priority_value(_pod(metadata={"labels": {vocab.PRIORITY_CLASS_LABEL: "koord-free"}})) == 3500
    assert kube.pod_priority_value(_pod(status={"qosClass": "BestEffort"})) == 5500


def test_running_or_pending() -> None:
    assert kube.is_running_or_pending(_pod(status={"phase": "Pending"}))
    assert not kube.is_running_or_pending(_pod(status={"phase": "Succeeded"}))
    assert not kube.is_running_or_pending(_pod())


def test_null_container_lists_are_empty() -> None:
    pod = msgspec.json.decode(b'{"metadata": {"creationTimestamp": null}, "spec": {"containers": null}}', type=kube.Pod)
    assert kube.pod_request(pod) == {}
    assert kube.pod_kube_qos(pod) == "BestEffort"
