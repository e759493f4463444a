"""The descheduler's view on a real nats-server (issue 25, point 5): a plan over the migration service's state asks
for nothing and leaves its anomaly detectors alone; each LowNodeLoad round is published to KOORD_DESCHEDULER with
each node's class and why and the job it asked for; the REST routes serve both, and `koordbus migration plan`
prints them through a live API."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio

from bus.cluster import free_port
from bus.jetstream import JetStreamBus
from koordbus import cli, http_serve
from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common import auth
from services.common.metrics import new_registry
from services.migration import component as migration_component
from services.migration import lownodeload_round as lnl
from services.migration.client import MigrationClient
from tests.integration.test_migration_lownodeload import ARGS, _service
from tests.support import api_auth
from tests.support.waiting import eventually

ONE_ROUND = ARGS.replace("consecutiveAbnormalities: 2", "consecutiveAbnormalities: 1")


@pytest_asyncio.fixture
async def api(koordbus_bus: JetStreamBus) -> AsyncIterator[httpx.AsyncClient]:
    context = ApiContext(
        settings=ApiSettings(),
        registry=new_registry(),
        tokens=api_auth.token_store(),
        components=(migration_component.routes_over(None, MigrationClient(koordbus_bus)),),
    )
    transport = httpx.ASGITransport(app=create_app(context), raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://api", headers=api_auth.headers(auth.VIEWER), timeout=30
    ) as client:
        yield client


async def test_a_plan_acts_on_nothing_and_a_round_is_published_with_its_jobs(
    koordbus_bus: JetStreamBus, tmp_path: Path, api: httpx.AsyncClient
) -> None:
    none_yet = await api.get("/api/v1/descheduler/rounds/latest")
    assert none_yet.status_code == 404 and "no LowNodeLoad round yet" in none_yet.json()["error"]
    no_service = await api.get("/api/v1/descheduler/plan")
    assert no_service.status_code == 503 and "no migration service answered" in no_service.json()["error"]
    service = await _service(koordbus_bus, tmp_path, ONE_ROUND)
    try:
        answer = await api.get("/api/v1/descheduler/plan")
        assert answer.status_code == 200, answer.text
        plan = answer.json()
        assert plan["planned"] and plan["problems"] == []
        hot = next(n for n in plan["nodes"] if n["node"] == "hot")
        assert hot["nodeClass"] == "highNodes" and hot["abnormal"]
        assert hot["why"].startswith("usage over high: cpu 80.0% > 50.0%")
        assert [e["pod"] for e in plan["evictions"]] == ["default/b1"]  # maxNoOfPodsToEvictPerNode: 1
        assert plan["evictions"][0]["job"] == ""  # nothing was asked for
        assert service.state.jobs == {} and service.detectors.node == {}  # the plan's detectors were copies
        assert (await api.get("/api/v1/descheduler/rounds/latest")).status_code == 404  # a plan is not a round

        assert await service.deschedule() == 1
        await eventually(lambda: len(service.state.jobs) == 1)
        (job,) = service.state.jobs
        answer = await api.get("/api/v1/descheduler/rounds/latest")
        assert answer.status_code == 200, answer.text
        latest = answer.json()
        assert not latest["planned"] and latest["evictions"][0]["job"] == job
        assert job == lnl.job_name(service._pods["default/b1"])
        assert latest["pools"][0]["counts"]["highNodes"] == 1 and latest["pools"][0]["counts"]["abnormal"] == 1
        assert latest["pools"][0]["outcome"] == "1 pod(s) to move off the abnormal node(s)"

        bad_args = await api.get("/api/v1/descheduler/rounds/latest?x=" + "y" * 10_000)
        assert bad_args.status_code < 500  # an unknown query parameter harms nothing
    finally:
        await service.stop()


async def test_koordbus_migration_plan_prints_the_round_through_a_live_api(
    koordbus_bus: JetStreamBus, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    service = await _service(koordbus_bus, tmp_path, ONE_ROUND)
    context = ApiContext(
        settings=ApiSettings(),
        registry=new_registry(),
        tokens=api_auth.token_store(),
        components=(migration_component.routes_over(None, MigrationClient(koordbus_bus)),),
    )

    async def koordbus(*args: str) -> tuple[int, str, str]:
        argv = ["migration", "--api", base, "--token", api_auth.TOKENS[auth.VIEWER], "plan", *args]
        code = await asyncio.to_thread(cli.main, argv)
        out, err = capsys.readouterr()
        return code, out, err

    try:
        async with contextlib.AsyncExitStack() as exits:
            port = free_port()
            await http_serve.serve_http(exits, create_app(context), host="127.0.0.1", port=port)
            base = f"http://127.0.0.1:{port}"
            code, out, err = await koordbus()
            assert code == 0, err
            assert "LowNodeLoad plan (nothing acted on) at" in out
            assert "pool __default_node_pool__: 2 nodes (high 1," in out
            assert "usage over high: cpu 80.0% > 50.0%; abnormal" in out
            assert "default/b1" in out and "node is overutilized" in out
            code, out, err = await koordbus("--last")
            assert code == 1 and "no LowNodeLoad round yet" in err
            assert await service.deschedule() == 1
            code, out, err = await koordbus("--last", "-o", "json")
            assert code == 0, err
            assert '"planned": false' in out
    finally:
        await service.stop()
