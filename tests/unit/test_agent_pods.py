"""agent.pods.parse_pod_list: the kubelet's PodList as NodePods with each running container's runtime and ID;
items that are not pods are skipped and counted; an answer that is not a PodList is an error."""

from __future__ import annotations

import json

import pytest

from agent.pods import PodListError, parse_pod_list


def test_pods_and_their_running_containers() -> None:
    body = {
        "kind": "PodList",
        "items": [
            {
                "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
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
