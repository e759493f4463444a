"""agent.pods.parse_pod_list: the kubelet's PodList as NodePods with each running container's runtime and ID;
items that are not pods are skipped and counted; an answer that is not a PodList is an error."""

from __future__ import annotations

import json

import pytest

from agent.pods import PodListError, parse_pod_list

UID = "0b4e3c1a-9d2f-4c5b-8a7e-1f2d3c4b5a69"


def test_pods_and_their_running_containers() -> None:
    body = {
        "kind": "PodList",
        "items": [
            {
                "metadata": {"name": "web", "namespace": "shop", "uid": UID},
                "spec": {"containers": [{"name": "app"}, {"name": "sidecar"}]},
                "status": {
                    "phase": "Running",
                    "containerStatuses": [
                        {"name": "app", "containerID": "containerd://" + "a" * 64},
                        {"name": "sidecar", "containerID": ""},  # waiting: no container yet
                    ],
                    "initContainerStatuses": [{"name": "init", "containerID": "cri-o://" + "b" * 64}],
                },
            },
            {"metadata": {"name": "broken", "labels": "not a map"}},
        ],
    }
    listed = parse_pod_list(json.dumps(body).encode())
    assert listed.unreadable == 1
    (pod,) = listed.pods
    assert pod.key == "shop/web"
    assert pod.containers == {"app": ("containerd", "a" * 64), "init": ("cri-o", "b" * 64)}


@pytest.mark.parametrize("body", [b"<html>", b'{"kind": "Status"}', b"[]"])
def test_what_is_not_a_pod_list_is_an_error(body: bytes) -> None:
    with pytest.raises(PodListError):
        parse_pod_list(body)


def _item(name: str, uid: str, qos: str = "BestEffort", container_id: str = "a" * 64) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "batch", "uid": uid},
        "spec": {"containers": [{"name": "main"}]},
        "status": {
            "phase": "Running",
            "qosClass": qos,
            "containerStatuses": [{"name": "main", "containerID": f"containerd://{container_id}"}],
        },
    }


def test_pods_whose_uid_or_qos_class_cannot_name_a_cgroup_are_refused_with_a_reason() -> None:
    other = "1c5f4d2b-0e3a-4d6c-9b8f-2a3e4d5c6b7a"
    body = {
        "items": [
            _item("good", UID),
            _item("newline", UID[:-1] + "9\n"),  # passed the old re.match(...$) check
            _item("weird-qos", other, qos="Platinum"),
            _item("bad-container", other, container_id="../../../etc"),
        ]
    }
    listed = parse_pod_list(json.dumps(body).encode())
    assert [p.pod.metadata.name for p in listed.pods] == ["good", "bad-container"]
    assert listed.pods[1].containers == {}  # not a container ID: as if not running, never a path
    assert len(listed.refused) == 2
    assert "is not a pod UID" in listed.refused[0]
    assert "'Platinum' is none of Guaranteed, Burstable, BestEffort" in listed.refused[1]
