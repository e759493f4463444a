"""One watermark model end to end on a real nats-server (issue 9 point 4, user-asks #8): the slo-controller-config
ConfigMap the bridge publishes sets the load-aware extender's and the descheduler's thresholds alike, node QoS's
resource-threshold-config keeps BE pods off nodes where their agent would evict them, both services state what they
use, and `GET /api/v1/config/watermarks` shows it side by side — following a change of the ConfigMap, and keeping
the last good value of a key in error."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from bus.jetstream import JetStreamBus
from koordbus.common import watermark_defaults
from schemas.cluster import ConfigMapObserved, NodeObserved
from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common import auth
from services.common.metrics import new_registry
from services.common.watermark_feed import WatermarkReader
from services.loadaware.http import create_app as create_extender
from services.loadaware.service import LoadAwareService
from services.loadaware.settings import LoadAwareSettings
from services.migration.lownodeload import LowNodeLoadArgs
from services.migration.service import MigrationService
from services.migration.settings import MigrationSettings
from tests.support import api_auth
from tests.support.events import publish_events
from tests.support.loadaware import GI, node, pod_json, report
from tests.support.waiting import eventually

THRESHOLDS = json.dumps({"clusterStrategy": {"enable": True, "memoryEvictThresholdPercent": 70}})


def configmap(marks: dict[str, Any] | str, *, version: str) -> ConfigMapObserved:
    text = marks if isinstance(marks, str) else json.dumps(marks)
    return ConfigMapObserved(
        namespace="koordinator-system",
        name="slo-controller-config",
        observed_at=time.time(),
        resource_version=version,
        data={"load-watermarks-config": text, "resource-threshold-config": THRESHOLDS},
    )


def filter_body(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"Pod": pod_json(name, cpu="1", memory="2Gi", labels=labels), "NodeNames": ["busy", "calm"]}


async def test_one_watermark_model_across_scheduler_descheduler_and_node_qos(koordbus_bus: JetStreamBus) -> None:
    bus = koordbus_bus
    now = time.time()
    await publish_events(
        bus,
        *(NodeObserved(name=n, observed_at=now, node=node(n, cpu="32", memory="100Gi")) for n in ("busy", "calm")),
        report("busy", at=now - 5, cpu=8000, memory=75 * GI),  # memory 75%: under 90, over BE eviction's 70
        report("calm", at=now - 5, cpu=8000, memory=20 * GI),
        configmap({"usageThresholds": {"cpu": 60, "memory": 90}, "lowThresholds": {"cpu": 20}}, version="1"),
    )
    scheduler = LoadAwareService(bus, LoadAwareSettings(startup_timeout_seconds=5), registry=new_registry())
    descheduler = MigrationService(
        bus,
        MigrationSettings(
            low_node_load=LowNodeLoadArgs(enabled=True, interval_seconds=3600), startup_timeout_seconds=5
        ),
        registry=new_registry(),
    )
    await scheduler.start()
    await descheduler.start()
    extender = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_extender(scheduler, scheduler._registry)), base_url="http://x"
    )
    context = ApiContext(
        settings=ApiSettings(),
        registry=new_registry(),
        watermark_reader=WatermarkReader(bus),
        watermark_defaults=watermark_defaults(),
        tokens=api_auth.token_store(),
    )
    api = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(context)),
        base_url="http://api",
        headers=api_auth.headers(auth.VIEWER),
    )
    try:
        # the same line for both, from the ConfigMap
        assert scheduler.state.args.usage_thresholds == {"cpu": 60, "memory": 90}
        assert descheduler.low_node_load.high_thresholds == {"cpu": 60.0, "memory": 90.0}
        assert descheduler.low_node_load.low_thresholds == {"cpu": 20.0}

        # a BE pod is kept off the node whose agent would evict it; others may go there
        be = (await extender.post("/filter", json=filter_body("be", {"koordinator.sh/qosClass": "BE"}))).json()
        assert be["FailedNodes"] == {"busy": "node(s) memory usage exceed threshold"}
        ls = (await extender.post("/filter", json=filter_body("ls", {"koordinator.sh/qosClass": "LS"}))).json()
        assert ls["NodeNames"] == ["busy", "calm"]

        async def view() -> dict[str, Any]:
            response = await api.get("/api/v1/config/watermarks")
            assert response.status_code == 200, response.text
            body: dict[str, Any] = response.json()
            return body

        async def both_reported(cpu: float) -> bool:
            body = await view()
            return all(
                body[s]["reported"] and body[s]["usageThresholds"]["cpu"] == cpu for s in ("scheduler", "descheduler")
            )

        await eventually(lambda: both_reported(60.0))
        body = await view()
        memory = next(row for row in body["resources"] if row["resource"] == "memory")
        assert (memory["schedule"], memory["descheduleHigh"], memory["descheduleLow"]) == (90, 90, None)
        assert memory["nodeQoS"] == [{"strategy": "cluster", "suppress": None, "evict": 70, "capForBEPods": 69}]
        assert body["scheduler"]["fromConfigMap"] == ["lowThresholds", "usageThresholds"]
        assert body["configMap"]["resourceVersion"] == "1"
        assert [(f["severity"], f["code"]) for f in body["findings"]] == [("info", "eviction-cap")]

        # a key in error keeps the last good line, and says so
        await publish_events(bus, configmap({"usageThresholds": {"cpu": 600}}, version="2"))
        await eventually(lambda: "load-watermarks-config" in scheduler.state.config.errors)
        assert scheduler.state.args.usage_thresholds == {"cpu": 60, "memory": 90}
        body = await view()
        assert ("warning", "config-error") in [(f["severity"], f["code"]) for f in body["findings"]]

        # a new line reaches both, and both restate it
        await publish_events(
            bus, configmap({"usageThresholds": {"cpu": 50, "memory": 80}, "avoidEvictionLoops": False}, version="3")
        )
        await eventually(lambda: both_reported(50.0))
        assert descheduler.low_node_load.high_thresholds == {"cpu": 50.0, "memory": 80.0}
        assert descheduler.low_node_load.low_thresholds == {"cpu": 30.0, "memory": 40.0}  # the args' own again
        be = (await extender.post("/filter", json=filter_body("be", {"koordinator.sh/qosClass": "BE"}))).json()
        assert be["NodeNames"] == ["busy", "calm"]  # 77% ≤ 80, and the caps are off
        body = await view()
        assert ("warning", "evict-reschedule-loop") in [(f["severity"], f["code"]) for f in body["findings"]]
    finally:
        await extender.aclose()
        await api.aclose()
        await descheduler.stop()
        await scheduler.stop()
