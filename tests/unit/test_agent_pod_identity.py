"""agent.batch.attribute_pods: the join of what the agent measured in cgroups (by pod UID) with the kubelet's pod
list, and what the nodemetric window makes of the joined pods (podsMetric names and Koordinator classes, spec §0)."""

from __future__ import annotations

import json

import pytest

from agent.batch import BatchBuilder, PodIdentities, attribute_pods
from agent.core import PodSample, Tick
from agent.pods import parse_pod_list
from agent.settings import AgentSettingsError, QosSettings
from schemas import vocab
from schemas.node import PodRef
from services.nodemetric.window import _pod_info

PROD_UID = "11111111-2222-3333-4444-555555555555"
BATCH_UID = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
NEW_UID = "0123456789abcdef0123456789abcdef"
GONE_UID = "99999999-8888-7777-6666-555555555555"


def kubelet_list(*items: dict[str, object]) -> bytes:
    return json.dumps({"kind": "PodList", "apiVersion": "v1", "items": list(items)}).encode()


def item(
    uid: str,
    namespace: str,
    name: str,
    *,
    qos: str,
    priority: int | None = None,
    priority_class_name: str = "",
    labels: dict[str, str] | None = None,
) -> dict[str, object]:
    spec: dict[str, object] = {"nodeName": "node-a", "containers": [{"name": "c"}]}
    if priority is not None:
        spec["priority"] = priority
    if priority_class_name:
        spec["priorityClassName"] = priority_class_name
    return {
        "metadata": {"uid": uid, "namespace": namespace, "name": name, "labels": labels or {}},
        "spec": spec,
        "status": {"phase": "Running", "qosClass": qos},
    }


LISTED = parse_pod_list(
    kubelet_list(
        item(
            PROD_UID,
            "shop",
            "web-0",
            qos="Burstable",
            priority=9100,
            priority_class_name="koord-prod",
            labels={"app": "web", "pod-template-hash": "abc"},
        ),
        item(
            BATCH_UID,
            "jobs",
            "spark-exec-1",
            qos="Burstable",  # batch pods request batch-cpu: kube QoS Burstable/BestEffort, class from the label
            labels={vocab.PRIORITY_CLASS_LABEL: "koord-batch", vocab.QOS_CLASS_LABEL: "BE", "team": "data"},
        ),
        item(GONE_UID, "shop", "listed-no-cgroup", qos="Guaranteed", priority=9500),
    )
).pods


def measured(uid: str, kube_qos: str, cores: float = 0.5) -> PodSample:
    return PodSample(pod=PodRef(uid=uid, kube_qos=kube_qos), sample=(100.0, cores, 64 << 20), memory_with_page_cache=0)


def test_measured_pods_get_the_kubelets_identity_and_koordinator_labels_only() -> None:
    joined = attribute_pods([measured(PROD_UID, "Burstable"), measured(BATCH_UID, "Burstable")], LISTED)
    refs = {s.pod.uid: s.pod for s in joined}
    assert refs[PROD_UID] == PodRef(
        uid=PROD_UID,
        kube_qos="Burstable",
        namespace="shop",
        name="web-0",
        priority=9100,
        priority_class_name="koord-prod",
    )
    assert refs[BATCH_UID] == PodRef(
        uid=BATCH_UID,
        kube_qos="Burstable",
        namespace="jobs",
        name="spark-exec-1",
        labels={vocab.PRIORITY_CLASS_LABEL: "koord-batch", vocab.QOS_CLASS_LABEL: "BE"},
    )
    assert [s.sample for s in joined] == [(100.0, 0.5, 64 << 20)] * 2  # the measurement is untouched


def test_a_cgroup_the_kubelet_does_not_list_yet_stays_known_by_uid_and_a_listed_pod_without_one_is_not_invented() -> (
    None
):
    joined = attribute_pods([measured(NEW_UID, "BestEffort"), measured(PROD_UID, "Burstable")], LISTED)
    assert [s.pod.uid for s in joined] == [NEW_UID, PROD_UID]  # GONE_UID is listed but has no cgroup: not reported
    assert joined[0].pod == PodRef(uid=NEW_UID, kube_qos="BestEffort")
    assert attribute_pods([measured(NEW_UID, "BestEffort")], None)[0].pod == PodRef(uid=NEW_UID, kube_qos="BestEffort")


def test_a_pod_is_named_in_the_first_batch_closed_after_the_list_names_it() -> None:
    builder = BatchBuilder("node-a", interval=10.0)
    sample = measured(NEW_UID, "BestEffort")
    builder.add(Tick(at=101.0, node=None, node_memory_with_page_cache=0, system=None, pods=(sample,)))
    listed = parse_pod_list(kubelet_list(item(NEW_UID, "jobs", "late", qos="BestEffort"))).pods
    named = attribute_pods([sample], listed)
    builder.add(Tick(at=105.0, node=None, node_memory_with_page_cache=0, system=None, pods=named))
    batch = builder.close(sent_at=110.0)
    assert batch is not None
    assert [(p.namespace, p.name) for p in batch.pods] == [("jobs", "late")]


def test_classes_follow_koordinator_from_labels_and_priority_not_the_kube_qos() -> None:
    """spec §0: the priority-class label wins, else spec.priority's range, else the QoS (label, else kube QoS)."""
    joined = {
        s.pod.uid: s.pod
        for s in attribute_pods([measured(PROD_UID, "Burstable"), measured(BATCH_UID, "Burstable")], LISTED)
    }
    prod = _pod_info(joined[PROD_UID], PROD_UID)
    batch = _pod_info(joined[BATCH_UID], BATCH_UID)
    assert (prod.namespace, prod.name, prod.priority, prod.qos) == ("shop", "web-0", "koord-prod", "LS")
    # by its kube QoS alone (Burstable → LS → koord-prod) it would count as high priority
    assert (batch.namespace, batch.name, batch.priority, batch.qos) == ("jobs", "spark-exec-1", "koord-batch", "BE")
    free = attribute_pods(
        [measured(PROD_UID, "Guaranteed")],
        parse_pod_list(kubelet_list(item(PROD_UID, "ns", "cheap", qos="Guaranteed", priority=3200))).pods,
    )[0].pod
    assert (_pod_info(free, PROD_UID).priority, _pod_info(free, PROD_UID).qos) == ("koord-free", "LSR")
    unlisted = _pod_info(PodRef(uid=NEW_UID, kube_qos="BestEffort"), NEW_UID)
    assert (unlisted.namespace, unlisted.name, unlisted.priority) == ("", NEW_UID, "koord-batch")


def test_a_list_joined_every_second_makes_each_pods_entry_once_and_the_same_as_a_fresh_join() -> None:
    identities = PodIdentities(LISTED)
    second = [measured(PROD_UID, "Burstable"), measured(BATCH_UID, "Burstable"), measured(NEW_UID, "BestEffort")]
    first_join, next_join = attribute_pods(second, identities), attribute_pods(second, identities)
    assert [s.pod for s in first_join] == [s.pod for s in attribute_pods(second, LISTED)]
    assert all(a.pod is b.pod for a, b in zip(first_join, next_join, strict=True))  # made once, reused
    # the cgroup's QoS is part of the entry when the list has none for the pod
    assert identities.ref(NEW_UID, "Burstable") == PodRef(uid=NEW_UID, kube_qos="Burstable")
    # a newer list keeps the entries of the very same pod objects and makes new ones for pods listed anew
    renamed = parse_pod_list(kubelet_list(item(BATCH_UID, "jobs", "spark-exec-2", qos="Burstable"))).pods
    relisted = identities.relisted([LISTED[0], *renamed])
    assert relisted.ref(PROD_UID, "Burstable") is first_join[0].pod
    assert relisted.ref(BATCH_UID, "Burstable").name == "spark-exec-2"


def test_the_kubelets_ca_and_insecure_exclude_each_other() -> None:
    with pytest.raises(AgentSettingsError, match="kubelet_ca_file and kubelet_insecure exclude each other"):
        QosSettings(kubelet_pods_url="https://10.0.0.1:10250/pods", kubelet_ca_file="/ca.crt", kubelet_insecure=True)
    assert QosSettings(kubelet_pods_url="https://10.0.0.1:10250/pods", kubelet_ca_file="/ca.crt").kubelet_ca_file
