"""`koordbus up --nats-cluster 3`: the distributed setup on one machine — three clustered nats-servers, koordbus's
streams at R3, the chart's NATS users (each in-process service connected as its own, the agent as its node's user
with only its node's subjects) — serving what `up` serves; a member killed is survived (its streams elect another
leader and the NodeMetrics keep coming); Ctrl-C stops every member."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from bus import auth, subjects
from bus.cluster import free_port
from bus.errors import BusError
from bus.jetstream import JetStreamBus
from koordbus.common import local_node_name
from tests.e2e.test_up import get_json

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]


def _jsz(monitor: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{monitor}?accounts=true&streams=true", timeout=5) as response:
        return dict(json.loads(response.read()))


def _stream(monitor: str, name: str) -> dict[str, Any]:
    details = [d for a in _jsz(monitor)["account_details"] for d in a.get("stream_detail") or []]
    (found,) = [d for d in details if d["name"] == name]
    return dict(found)


def _users(monitors: list[str]) -> set[str]:
    """The users the members' clients connected as (their /connz with auth)."""
    found = set()
    for monitor in monitors:
        url = monitor.replace("/jsz", "/connz?auth=true&limit=1000")
        with urllib.request.urlopen(url, timeout=5) as response:
            found |= {c.get("authorized_user", "") for c in json.loads(response.read()).get("connections") or []}
    return found


async def _agent_is_fenced(url: str, creds: str) -> None:
    """The agent's user (`creds`: its file's text) publishes its node's subjects and is refused another node's and
    the quota service's."""
    user, password = auth.read_creds(creds, source="agent.creds.json")
    bus = await JetStreamBus.connect(url, name="fenced-agent", user=user, password=password)
    try:
        node = local_node_name()
        ack = await bus.publish(subjects.node_metrics(node), b"own", msg_id="e2e-own")
        assert ack.seq > 0
        for forged in (
            bus.publish(subjects.node_metrics("sim-node-0001"), b"forged", msg_id="e2e-forged"),
            bus.request(subjects.QUOTA_RPC_COMMAND, b"{}", timeout=2),
        ):
            with pytest.raises((BusError, TimeoutError)):
                await asyncio.wait_for(forged, 3)
    finally:
        await bus.close()


def _names() -> list[str]:
    """The members' server names, in the banner's order (bus.cluster names them koordbus-nats-<i>)."""
    return [f"koordbus-nats-{i}" for i in range(3)]


def _members(data_dir: Path) -> dict[int, str]:
    """pid → cmdline of the nats-servers whose config lives in `data_dir`."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "nats-server" in cmdline and str(data_dir) in cmdline:
                found[int(entry.name)] = cmdline
    return found


def _wait(check: Any, *, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if value := check():
                return value
        except OSError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


def test_up_runs_a_three_server_cluster_with_r3_streams_and_survives_a_member(tmp_path: Path) -> None:
    port, data_dir = free_port(), tmp_path / "data"
    command = [
        sys.executable, "-m", "koordbus.cli", "up", "--data-dir", str(data_dir), "--port", str(port),
        "--nats-cluster", "3", "--no-extender", "--simulate-nodes", "2", "--simulate-backfill", "120",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    banner: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            banner.append(line)
            if line.startswith("NodeMetrics appear"):
                break
        text = "".join(banner)
        assert "3 clustered nats-servers, streams at R3, routes authenticated" in text, text
        assert "each service its own NATS user, as in the Helm chart" in text, text
        monitors = re.findall(r"http://127\.0\.0\.1:\d+/jsz", text)
        assert len(monitors) == 3, text
        token = (data_dir / "api-token").read_text().strip()
        sims = {"sim-node-0001", "sim-node-0002"}

        def nodemetrics() -> set[str]:
            listed = get_json(f"{base}/api/v1/nodemetrics", token)
            return {item["metadata"]["name"] for item in listed["items"]}  # type: ignore[attr-defined,index]

        _wait(lambda: sims <= nodemetrics(), timeout=60, what="NodeMetrics of the simulated nodes")
        parts = ("up", "nodemetric", "noderesource", "slo", "quota", "migration", "k8s", "api")
        expected = {auth.service_user_name(p) for p in parts} | {auth.node_user_name(local_node_name())}
        assert expected <= _users(monitors), _users(monitors)
        cluster_url = re.search(r"NATS\s+(\S+)", text)
        assert cluster_url, text
        asyncio.run(_agent_is_fenced(cluster_url.group(1), (data_dir / "nats-users" / "agent.creds.json").read_text()))
        node = _stream(monitors[0], "KOORD_NODE")
        assert len(node["cluster"]["replicas"]) == 2  # R3: two followers beside the leader

        leader = node["cluster"]["leader"]
        victim = next(pid for pid, cmdline in _members(data_dir).items() if f"/{leader}/" in cmdline)
        os.kill(victim, signal.SIGKILL)
        survivor = next(m for m, name in zip(monitors, _names(), strict=True) if name != leader)
        _wait(
            lambda: _stream(survivor, "KOORD_NODE")["cluster"].get("leader") not in (None, "", leader),
            timeout=60,
            what="a new KOORD_NODE leader",
        )
        assert process.poll() is None  # a lost member is not fatal
        _wait(lambda: get_json(f"{base}/readyz")["status"] == "ready", timeout=60, what="ready again")
        assert sims <= nodemetrics()
    finally:
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=30)[0]
    assert process.returncode == 0, "".join(banner) + output
    assert "Permissions Violation" not in output, output  # what the in-process parts do, their users may
    assert not _members(data_dir), "a nats-server outlived koordbus up"
