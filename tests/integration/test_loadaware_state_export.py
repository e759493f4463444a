"""Export → replay on a real nats-server (issue 28 point 3): the load-aware extender answers kube-scheduler's verbs,
the API exports each node's state (`GET /api/v1/scheduler/nodes/{node}/state`, asked of the extender over NATS),
and replaying that document — in process, through `koordbus calc loadaware` and through `koordbus scheduler explain
--offline` — gives the filter, score and explanation the live extender gave."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from bus.cluster import free_port
from bus.jetstream import JetStreamBus
from koordbus import http_serve
from schemas import kube
from schemas.cluster import ConfigMapObserved, NodeObserved, PodObserved
from schemas.node import ResourceMap
from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common import auth
from services.common.metrics import new_registry
from services.loadaware import component as loadaware_component
from services.loadaware import core, snapshot
from services.loadaware.client import LoadAwareClient
from services.loadaware.http import create_app as create_extender
from services.loadaware.service import LoadAwareService
from services.loadaware.settings import LoadAwareSettings
from tests.support import api_auth
from tests.support.events import publish_events
from tests.support.loadaware import GI, node, pod_json, report

NODES = ["cold", "hot", "capped", "annotated", "stale", "unreported", "bare"]
BE = {"koordinator.sh/qosClass": "BE"}
PROD = {"koordinator.sh/priority-class": "koord-prod"}
OLD_USAGE = {"default/old": (2000, 4 * GI)}
QOS = json.dumps({"clusterStrategy": {"enable": True, "memoryEvictThresholdPercent": 70}})


def _placed(name: str, node_name: str, *, now: float, **kwargs: Any) -> PodObserved:
    pod = msgspec.convert(pod_json(name, node_name=node_name, phase="Running", **kwargs), kube.Pod)
    return PodObserved(
        namespace="default", name=name, uid=f"uid-{name}", observed_at=now - 2, node_name=node_name, pod=pod
    )


def _scheduled(seconds_ago: float, now: float) -> list[dict[str, str]]:
    return [{"type": "PodScheduled", "status": "True", "lastTransitionTime": snapshot.format_time(now - seconds_ago)}]


@pytest.fixture
async def stack(koordbus_bus: JetStreamBus) -> Any:
    now = time.time()
    thresholds = {"scheduling.koordinator.sh/usage-thresholds": json.dumps({"usageThresholds": {"cpu": 20}})}
    unreported = report("unreported", at=now - 5, cpu=0, memory=0)
    unreported = msgspec.structs.replace(
        unreported,
        status=msgspec.structs.replace(
            unreported.status,
            node_metric=msgspec.structs.replace(unreported.status.node_metric, node_usage=ResourceMap()),
        ),
    )
    await publish_events(
        koordbus_bus,
        *(NodeObserved(name=n, observed_at=now, node=node(n)) for n in NODES if n != "annotated"),
        NodeObserved(name="annotated", observed_at=now, node=node("annotated", annotations=thresholds)),
        ConfigMapObserved(
            namespace="koordinator-system",
            name="slo-controller-config",
            observed_at=now,
            data={"resource-threshold-config": QOS},
        ),
        report("cold", at=now - 5, cpu=4000, memory=16 * GI, pods=OLD_USAGE, prod_pods=frozenset({"default/old"})),
        report("hot", at=now - 5, cpu=20000, memory=64 * GI),
        report("capped", at=now - 5, cpu=4000, memory=88 * GI, aggregated={300: {"p95": (9000, 90 * GI)}}),
        report("annotated", at=now - 5, cpu=6000, memory=16 * GI),
        report("stale", at=now - 600, cpu=0, memory=0),
        unreported,
        _placed("old", "cold", now=now, cpu="4", memory="8Gi", labels=PROD, conditions=_scheduled(3600, now)),
        _placed("fresh", "cold", now=now, cpu="2", memory="1Gi"),
        _placed("batch", "unreported", now=now, cpu="3", memory="2Gi", labels=BE),
        _placed(
            "placeholder",
            "cold",
            now=now,
            cpu="8",
            annotations={"scheduling.koordinator.sh/reserve-pod": "true"},
        ),
    )  # fmt: skip
    service = LoadAwareService(koordbus_bus, LoadAwareSettings(startup_timeout_seconds=5), registry=new_registry())
    await service.start()
    extender = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_extender(service, service._registry)), base_url="http://extender"
    )
    context = ApiContext(
        settings=ApiSettings(),
        registry=new_registry(),
        tokens=api_auth.token_store(),
        components=(loadaware_component.queries(LoadAwareClient(koordbus_bus, timeout=5)),),
    )
    app = create_app(context)
    api = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")
    try:
        yield service, extender, api, app
    finally:
        await extender.aclose()
        await api.aclose()
        await service.stop()


def _incoming() -> dict[str, dict[str, Any]]:
    web = pod_json("web", cpu="4", memory="8Gi", limit_cpu="4", limit_memory="8Gi")
    be = pod_json("be", labels=BE)  # estimated on batch resources: 1000 milli-cores, 6 GiB × 70%
    be["spec"]["containers"][0]["resources"]["requests"] = {
        "kubernetes.io/batch-cpu": "1000",
        "kubernetes.io/batch-memory": "6Gi",
    }
    return {"web": web, "be": be}


def _koordbus(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "koordbus.cli", *args], input=stdin, capture_output=True, text=True, timeout=60
    )


async def test_an_exported_state_replays_the_live_answer(stack: Any, tmp_path: Path) -> None:
    _, extender, api, _ = stack
    viewer = api_auth.headers(auth.VIEWER)
    for name, pod in _incoming().items():
        filtered = (await extender.post("/filter", json={"Pod": pod, "NodeNames": NODES})).json()
        ranked = (await extender.post("/prioritize", json={"Pod": pod, "NodeNames": NODES})).json()
        live_scores = {entry["Host"]: entry["Score"] for entry in ranked}
        live_failed = filtered["FailedNodes"] or {}
        # the setup does reach every branch: over a threshold, capped by node QoS, annotated, stale, passing
        if name == "be":
            assert live_failed["capped"] == "node(s) memory usage exceed threshold"  # 69% cap
        else:
            assert "capped" not in live_failed and live_failed["hot"] == "node(s) cpu usage exceed threshold"
        assert live_failed["stale"] == "node(s) nodeMetric expired"
        assert live_failed["annotated"] == "node(s) cpu usage exceed threshold"
        for node_name in NODES:
            response = await api.get(f"/api/v1/scheduler/nodes/{node_name}/state", headers=viewer)
            assert response.status_code == 200, response.text
            state = response.json()
            explained = (await extender.post("/explain", json={"pod": pod, "node": node_name})).json()
            load, replayed_node, now = snapshot.read(snapshot.decode(json.dumps(state)))
            replayed = snapshot.decide(load, replayed_node, msgspec.convert(pod, kube.Pod), now=now)
            assert replayed["filter"]["status"] == ("Unschedulable" if node_name in live_failed else "Success")
            assert replayed["filter"]["reason"] == live_failed.get(node_name, "")
            assert core.extender_score(replayed["score"]) == live_scores[node_name]
            assert replayed["score"] == explained["score"]["score"]
            if node_name != "stale":  # its detail says how old the NodeMetric is, to the second
                assert replayed["explain"] == explained
    unreported = (await api.get("/api/v1/scheduler/nodes/unreported/state", headers=viewer)).json()
    assert unreported["nodeMetric"]["metadata"]["annotations"] == {snapshot.NODE_USAGE_MISSING_ANNOTATION: "true"}
    cold = (await api.get("/api/v1/scheduler/nodes/cold/state", headers=viewer)).json()
    assert sorted(p["pod"]["metadata"]["name"] for p in cold["assignedPods"]) == ["fresh", "old"]  # no reserve pod
    assert cold["nodeQoS"]["resourceThresholdStrategy"]["memoryEvictThresholdPercent"] == 70


async def test_the_cli_saves_a_state_and_replays_it(stack: Any, tmp_path: Path) -> None:
    _, extender, _, app = stack
    pod = _incoming()["be"]
    (tmp_path / "be.json").write_text(json.dumps(pod))
    explain = ("scheduler", "explain", "--offline", "-f", str(tmp_path / "state.json"), str(tmp_path / "be.json"))
    async with contextlib.AsyncExitStack() as served:
        port = free_port()
        await http_serve.serve_http(served, app, host="127.0.0.1", port=port)
        connection = ("--api", f"http://127.0.0.1:{port}", "--token", api_auth.TOKENS[auth.VIEWER])
        for node_name in ("capped", "cold"):
            saved = await asyncio.to_thread(_koordbus, "scheduler", "state", node_name, *connection)
            assert saved.returncode == 0, saved.stderr
            (tmp_path / "state.json").write_text(saved.stdout)
            state = json.loads(saved.stdout)
            await _replay(extender, pod, node_name, state, explain)
        refused = await asyncio.to_thread(_koordbus, "scheduler", "state", "ghost", *connection)
        assert refused.returncode != 0 and "unknown to the load-aware extender" in refused.stderr
    wrong = await asyncio.to_thread(_koordbus, *explain, "hot")
    assert wrong.returncode == 1 and "is the state of node 'cold', not 'hot'" in wrong.stderr


async def _replay(
    extender: httpx.AsyncClient, pod: dict[str, Any], node_name: str, state: dict[str, Any], explain: tuple[str, ...]
) -> None:
    """The offline explanation and `koordbus calc loadaware` of a saved state answer as the extender does now."""
    live = (await extender.post("/explain", json={"pod": pod, "node": node_name})).json()
    offline = await asyncio.to_thread(_koordbus, *explain, node_name, "--json")
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout) == live
    printed = await asyncio.to_thread(_koordbus, *explain)
    assert printed.stdout.startswith(f"pod default/be on node {node_name}\n")
    calc = await asyncio.to_thread(_koordbus, "calc", "loadaware", stdin=json.dumps({**state, "pod": pod}))
    assert calc.returncode == 0, calc.stderr
    decided = json.loads(calc.stdout)
    assert decided["score"] == live["score"]["score"]
    assert (decided["filter"]["status"] == "Success") is live["filter"]["passed"]
    assert decided["filter"]["reason"] == ("" if live["filter"]["passed"] else live["filter"]["reason"])


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/api/v1/scheduler/nodes/ghost/state", api_auth.headers(auth.VIEWER), 404),
        ("/api/v1/scheduler/nodes/Not_A_Node/state", api_auth.headers(auth.VIEWER), 422),
        ("/api/v1/scheduler/nodes/cold/state", {}, 401),
        ("/api/v1/scheduler/nodes/cold/state", {"Authorization": "Bearer wrong"}, 401),
    ],
)
async def test_unknown_nodes_bad_names_and_missing_tokens(
    stack: Any, path: str, headers: dict[str, str], status: int
) -> None:
    api = stack[2]
    response = await api.get(path, headers=headers)
    assert response.status_code == status
    assert response.json()["error"]


async def test_without_an_extender_the_export_is_unavailable(koordbus_bus: JetStreamBus) -> None:
    context = ApiContext(
        settings=ApiSettings(),
        registry=new_registry(),
        tokens=api_auth.token_store(),
        components=(loadaware_component.queries(LoadAwareClient(koordbus_bus, timeout=0.5)),),
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(context)), base_url="http://api") as api:
        response = await api.get("/api/v1/scheduler/nodes/cold/state", headers=api_auth.headers(auth.VIEWER))
    assert response.status_code == 503 and "does not answer" in response.json()["error"]
