"""`koordbus slo preview` against a cluster in the fake Kubernetes API server (kubernetes-asyncio end to end).

The cluster runs koordbus' own NodeSLO path — the bridge (KOORD_CLUSTER), the slo service (KOORD_SLO on a real
nats-server) and the NodeSLO mirror writing NodeSLO objects — so the preview of a ConfigMap change is checked
against what happens when that change is applied: the specs it predicts are the NodeSLOs then written, and a second
preview finds nothing left to change. Also: a key in error (exit 1, every problem by key and JSON path, the nodes
keep their current value for it), unknown nodes, no cluster, and hostile files (clear errors, no traceback).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from kubernetes_asyncio.client import ApiClient

from bus.jetstream import JetStreamBus
from koordbus import cli
from services.common.metrics import new_registry
from services.k8s.nodeslo_mirror import KubeNodeSloSink, NodeSloMirror
from services.k8s.observer import ClusterObserver
from services.k8s.settings import K8sSettings
from services.slo.service import SloService
from tests.fakes.kube_api import FakeKubeApi
from tests.support.waiting import eventually

SETTINGS = replace(
    K8sSettings(watch_timeout_seconds=30, backoff_initial_seconds=0.05, backoff_max_seconds=0.5),
    quota_write_interval_seconds=0.05,
)
META = {"name": "slo-controller-config", "namespace": "koordinator-system"}
BANDWIDTH = "node.koordinator.sh/network-bandwidth"
CURRENT = {
    "resource-threshold-config": json.dumps({"clusterStrategy": {"enable": True}}),
    "cpu-burst-config": json.dumps({"clusterStrategy": {"policy": "auto"}}),
    "system-config": json.dumps({"clusterStrategy": {"totalNetworkBandwidth": "10G"}}),
}
PROPOSED = {
    "resource-threshold-config": json.dumps(
        {
            "clusterStrategy": {"enable": True, "cpuSuppressThresholdPercent": 60},
            "nodeStrategies": [
                {"name": "batch", "nodeSelector": {"matchLabels": {"pool": "batch"}}, "cpuSuppressThresholdPercent": 40}
            ],
        }
    ),
    "cpu-burst-config": json.dumps({"clusterStrategy": {"policy": "auto"}}),
    "system-config": json.dumps({"clusterStrategy": {"totalNetworkBandwidth": "10G"}}),
    "resource-qos-config": json.dumps({"clusterStrategy": {"beClass": {"cpuQOS": {"enable": True}}}}),
}


def _write(path: Path, data: dict[str, str], *, meta: dict[str, str] = META) -> Path:
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}))
    return path


async def _preview(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(cli.main, ["slo", "preview", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest_asyncio.fixture
async def cluster(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient
) -> AsyncIterator[FakeKubeApi]:
    """Three nodes and the CURRENT ConfigMap, with koordbus writing their NodeSLOs."""
    kube_api.put("nodes", {"metadata": {"name": "online-1"}})
    kube_api.put("nodes", {"metadata": {"name": "online-2"}})
    kube_api.put(
        "nodes", {"metadata": {"name": "batch-1", "labels": {"pool": "batch"}, "annotations": {BANDWIDTH: "25G"}}}
    )
    kube_api.put("configmaps", {"metadata": META, "data": CURRENT})
    observer = ClusterObserver(koordbus_bus, kube_client, SETTINGS, registry=new_registry())
    slo = SloService(koordbus_bus, registry=new_registry())
    mirror = NodeSloMirror(koordbus_bus, KubeNodeSloSink(kube_client), settings=SETTINGS, registry=new_registry())
    await observer.start()
    await slo.start()
    await mirror.start()
    try:

        async def written() -> bool:
            return all(
                (kube_api.get("NodeSLO", name) or {}).get("spec", {}).get("cpuBurstStrategy", {}).get("policy")
                == "auto"
                for name in ("online-1", "online-2", "batch-1")
            )

        await eventually(written, timeout=20)
        yield kube_api
    finally:
        await mirror.stop()
        await slo.stop()
        await observer.stop()


async def test_the_preview_of_a_change_is_what_the_cluster_then_writes(
    cluster: FakeKubeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = str(cluster.kubeconfig(tmp_path / "kubeconfig"))
    proposed = _write(tmp_path / "proposed.yaml", PROPOSED)
    code, out, err = await _preview(
        capsys, "-f", str(proposed), "--nodes-from-cluster", "--kubeconfig", kubeconfig, "-o", "json"
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["errors"] == [] and result["warnings"] == []
    outcomes = {tuple(o["nodes"]): o for o in result["outcomes"]}
    assert sorted(outcomes) == [("batch-1",), ("online-1", "online-2")]
    online, batch = outcomes["online-1", "online-2"], outcomes["batch-1",]
    assert online["entries"]["resource-threshold-config"] == "clusterStrategy"
    assert batch["entries"]["resource-threshold-config"] == "nodeStrategies[0] (batch)"
    assert online["changes"] == [
        {
            "path": "resourceUsedThresholdWithBE.cpuSuppressThresholdPercent",
            "change": "changed",
            "before": 65,
            "after": 60,
        },
        {"path": "resourceQOSStrategy.beClass", "change": "added", "after": {"cpuQOS": {"enable": True}}},
    ]
    assert batch["changes"][0] == {
        "path": "resourceUsedThresholdWithBE.cpuSuppressThresholdPercent",
        "change": "changed",
        "before": 65,
        "after": 40,
    }
    assert batch["spec"]["systemStrategy"] == {"totalNetworkBandwidth": 25_000_000_000}  # the node's annotation

    # The table says the same for a person.
    code, table, _ = await _preview(capsys, "-f", str(proposed), "--nodes-from-cluster", "--kubeconfig", kubeconfig)
    assert code == 0
    assert "3 node(s), 2 distinct outcome(s)" in table
    assert "nodes online-1, online-2: 2 change(s)" in table
    assert "  ~ resourceUsedThresholdWithBE.cpuSuppressThresholdPercent: 65 -> 60" in table
    assert "nodes batch-1 (take resource-threshold-config nodeStrategies[0] (batch)): 2 change(s)" in table

    # Apply the change: the NodeSLOs koordbus writes are the specs the preview showed.
    cluster.put("configmaps", {"metadata": META, "data": PROPOSED})
    expected = {name: o["spec"] for o in result["outcomes"] for name in o["nodes"]}

    async def applied() -> bool:
        return all((cluster.get("NodeSLO", name) or {}).get("spec") == spec for name, spec in expected.items())

    await eventually(applied, timeout=20)
    code, out, _ = await _preview(
        capsys, "-f", str(proposed), "--nodes-from-cluster", "--kubeconfig", kubeconfig, "-o", "json"
    )
    assert code == 0 and all(o["changes"] == [] for o in json.loads(out)["outcomes"])


async def test_a_key_in_error_fails_the_gate_and_keeps_the_value_in_effect(
    cluster: FakeKubeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = str(cluster.kubeconfig(tmp_path / "kubeconfig"))
    broken = {
        **CURRENT,
        "cpu-burst-config": json.dumps(
            {"clusterStrategy": {"policy": "none", "cpuBurstPercent": 20000, "cfsQuotaBurstPercent": 1.5}}
        ),
        "resource-qos-config": "{not json",
        "resource-threshold-config": json.dumps({"clusterStrategy": {"enable": False}}),
    }
    path = _write(tmp_path / "broken.yaml", broken)
    code, out, err = await _preview(
        capsys, "-f", str(path), "--node", "online-1", "--kubeconfig", kubeconfig, "-o", "yaml"
    )
    assert code == 1, err
    result = yaml.safe_load(out)
    assert result["errors"] == [
        {
            "key": "resource-qos-config",
            "path": "$",
            "reason": "not JSON: Expecting property name enclosed in double quotes at line 1 column 2",
        },
        {
            "key": "cpu-burst-config",
            "path": "$.clusterStrategy.cpuBurstPercent",
            "reason": "20000 is out of range [0, 10000]",
        },
        {
            "key": "cpu-burst-config",
            "path": "$.clusterStrategy.cfsQuotaBurstPercent",
            "reason": "expected an integer, got the number 1.5",
        },
    ]
    [outcome] = result["outcomes"]
    assert outcome["nodes"] == ["online-1"]
    # The keys in error keep what the live ConfigMap gives (burst policy auto); the good key changes.
    assert outcome["changes"] == [
        {"path": "resourceUsedThresholdWithBE.enable", "change": "changed", "before": True, "after": False}
    ]
    code, table, _ = await _preview(capsys, "-f", str(path), "--node", "online-1", "--kubeconfig", kubeconfig)
    assert code == 1
    assert (
        "2 key(s) in error (cpu-burst-config, resource-qos-config); the nodes would keep their current value" in table
    )
    assert "  ERROR cpu-burst-config $.clusterStrategy.cpuBurstPercent: 20000 is out of range [0, 10000]" in table


async def test_unknown_nodes_and_an_unreachable_cluster_are_usage_errors(
    cluster: FakeKubeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = str(cluster.kubeconfig(tmp_path / "kubeconfig"))
    path = _write(tmp_path / "cm.yaml", PROPOSED)
    code, _, err = await _preview(
        capsys, "-f", str(path), "--node", "online-1", "--node", "gone", "--kubeconfig", kubeconfig
    )
    assert code == 2 and err == "koordbus slo preview: there is no Node 'gone' in the cluster\n"
    code, _, err = await _preview(
        capsys, "-f", str(path), "--nodes-from-cluster", "--kubeconfig", str(tmp_path / "nope")
    )
    assert code == 2 and "does not exist" in err and "Traceback" not in err


async def test_a_node_without_a_nodeslo_and_a_koordinator_written_one(
    cluster: FakeKubeApi, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = str(cluster.kubeconfig(tmp_path / "kubeconfig"))
    path = _write(tmp_path / "cm.yaml", CURRENT)
    # Koordinator writes the bandwidth as a quantity string: the same value is no change.
    nodeslo = cluster.get("NodeSLO", "online-1")
    assert nodeslo is not None
    nodeslo["spec"]["systemStrategy"]["totalNetworkBandwidth"] = "10G"
    cluster.put("NodeSLO", nodeslo)
    code, out, _ = await _preview(
        capsys, "-f", str(path), "--node", "online-1", "--kubeconfig", kubeconfig, "-o", "json"
    )
    assert code == 0 and json.loads(out)["outcomes"][0]["changes"] == []
    cluster.remove("NodeSLO", "online-2")  # the mirror writes again only when the node's spec changes
    code, table, _ = await _preview(capsys, "-f", str(path), "--node", "online-2", "--kubeconfig", kubeconfig)
    assert code == 0 and "nodes online-2: no NodeSLO yet; one would be created" in table


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"a: &x [1]\nb: *x\n", "aliases (*name) are not accepted"),
        (b"data: {k: [" * 100 + b"]}" * 100, "nested more than 64 levels deep"),
        (b"\xff\xfe", "not valid UTF-8"),
        (b"kind: Secret\n", "expected kind ConfigMap, got 'Secret'"),
        (b"- 1\n- 2\n", "expected a ConfigMap object, got list"),
        (
            b"data:\n  resource-threshold-config: {clusterStrategy: {}}\n",
            "data.resource-threshold-config: expected a string",
        ),
        (b"data: [1]\n", "data: expected an object of strings"),
        (b"a: 1\n---\nb: 2\n", "not valid JSON or YAML"),
        (b"data: {k: !!python/object:os.system x}\n", "not valid JSON or YAML"),
    ],
)
def test_a_hostile_file_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, message: str
) -> None:
    path = tmp_path / "cm.yaml"
    path.write_bytes(content)
    code = cli.main(["slo", "preview", "-f", str(path)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith(f"koordbus slo preview: {path}: ") and message in err, err
    assert err.count("\n") == 1


def test_a_huge_file_is_refused_before_it_is_parsed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as file:
        file.write(b"data:\n  k: '")
        file.write(b"x" * (5 * 1024 * 1024))
        file.write(b"'\n")
    assert cli.main(["slo", "preview", "-f", str(path)]) == 2
    assert "is larger than 4194304 bytes" in capsys.readouterr().err


def test_without_a_cluster_each_key_is_shown_per_node_selector_group(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data: dict[str, Any] = {
        **PROPOSED,
        "host-application-config": json.dumps(
            {"applications": [{"name": "nginx"}], "nodeConfigs": [{"name": "edge", "applications": []}]}
        ),
    }
    path = _write(tmp_path / "cm.yaml", data)
    assert cli.main(["slo", "preview", "-f", str(path), "-o", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    groups = {(g["key"], g["entry"]): g for g in result["groups"]}
    batch = groups["resource-threshold-config", "nodeStrategies[0] (batch)"]
    assert batch["nodeSelector"] == {"matchLabels": {"pool": "batch"}}
    assert batch["strategy"]["cpuSuppressThresholdPercent"] == 40 and batch["strategy"]["enable"] is True
    assert groups["host-application-config", "nodeConfigs[0] (edge)"]["skipped"].startswith("no nodeSelector")
    assert result["warnings"] == [
        "host-application-config nodeConfigs[0] (edge): no nodeSelector, so it matches no node "
        "(Koordinator's webhook refuses such an entry)"
    ]
    assert cli.main(["slo", "preview", "-f", str(path)]) == 0
    table = capsys.readouterr().out
    assert (
        '  resource-threshold-config nodeStrategies[0] (batch) nodeSelector {"matchLabels": {"pool": "batch"}}' in table
    )
    assert "  WARNING host-application-config nodeConfigs[0] (edge): no nodeSelector" in table
    assert "NOTE" not in table
    elsewhere = _write(tmp_path / "other.yaml", data, meta={"name": "slo-controller-config", "namespace": "system"})
    assert cli.main(["slo", "preview", "-f", str(elsewhere)]) == 0
    assert "  NOTE the slo service reads koordinator-system/slo-controller-config" in capsys.readouterr().out
