"""Issue #19, names from the CLI and from the Kubernetes API server: `koordbus creds issue-node` refuses a node name
Kubernetes would refuse (it becomes the agent's subjects and permissions), and the bridge's observer skips and counts
an object whose name or namespace is not a Kubernetes name instead of publishing it (a 5,000-character name was a
subject longer than nats-server's control line: the server dropped the bridge's connection)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient

from bus.jetstream import JetStreamBus
from services.k8s.observer import KIND_NODE, KIND_POD, ClusterObserver
from tests.fakes.kube_api import FakeKubeApi
from tests.integration.test_k8s_observer import node, node_event, pod, pod_event, start_observer
from tests.support.waiting import eventually

__all__ = ["start_observer"]  # the fixture, shared with the observer's own tests


@pytest.mark.parametrize("name", ["a/b", "x" * 5000, "Node_1", "node-1\n"])
def test_creds_for_a_node_that_is_not_a_node_name_are_refused(tmp_path: Path, name: str) -> None:
    out = tmp_path / "agent.creds.json"
    done = subprocess.run(
        [sys.executable, "-m", "koordbus.cli", "creds", "issue-node", name, "--out", str(out)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "invalid node" in done.stderr and len(done.stderr) < 600
    assert not out.exists()


async def test_objects_with_names_kubernetes_refuses_are_skipped_counted_and_never_published(
    kube_api: FakeKubeApi, kube_client: ApiClient, koordbus_bus: JetStreamBus, start_observer: Callable[[], Any]
) -> None:
    long = "x" * 5000
    kube_api.put("nodes", node("good-1"))
    kube_api.put("nodes", node(long))  # the fake server stores what it is given, as a foreign writer could
    kube_api.put("pods", pod("team-1", "y" * 300, node_name="good-1"))
    kube_api.put("pods", pod("Bad_Namespace", "web-0", node_name="good-1"))
    observer: ClusterObserver = await start_observer()
    assert await node_event(koordbus_bus, "good-1") is not None
    assert observer.stats.decode_failures[KIND_NODE] == 1
    assert observer.stats.decode_failures[KIND_POD] == 2
    assert await pod_event(koordbus_bus, "Bad_Namespace", "web-0") is None
    # the bridge's connection is alive: later changes keep flowing
    kube_api.put("nodes", node("good-2"))
    kube_api.put("pods", pod("team-1", "web-1", node_name="good-2"))

    async def flowed() -> bool:
        return await pod_event(koordbus_bus, "team-1", "web-1") is not None

    await eventually(flowed)
