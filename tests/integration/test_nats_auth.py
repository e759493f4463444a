"""NATS authentication and authorization on a real nats-server configured by bus.auth: nothing anonymous; a node's
agent publishes only as its node and reads only its own NodeSLO key; a service user does everything."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import msgspec
import pytest

from agent.allocatable_watch import AllocatableSource
from agent.slo_watch import SloSource
from bus import auth, streams, subjects
from bus.errors import BusError
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from schemas.noderesource import NodeResourceComputed
from schemas.qos import NODE_SLO_DECODER, NodeSloRendered
from tests.integration.test_agent_qos import v1_tree
from tests.support.waiting import eventually

DENIED = (BusError, TimeoutError)
"""A denied publish or read is dropped by the server: the request fails or times out, nothing is stored."""


async def _anonymous_connect(url: str) -> str:
    """What the server answers a client that connects without credentials (spoken in NATS's text protocol)."""
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        await reader.readline()  # INFO
        writer.write(b'CONNECT {"verbose": false, "pedantic": false}\r\nPING\r\n')
        await writer.drain()
        return (await asyncio.wait_for(reader.readline(), 5)).decode()
    finally:
        writer.close()
        await writer.wait_closed()


async def test_agents_act_only_as_their_node(tmp_path: Path) -> None:
    service, node_a, node_b = (
        auth.issue_service("control-plane"),
        auth.issue_node("node-a.example"),
        auth.issue_node("b"),
    )
    server = EmbeddedNatsServer(
        store_dir=tmp_path / "nats", authorization=auth.render_authorization([service, node_a, node_b])
    )
    await server.start()
    try:
        assert "Authorization Violation" in await _anonymous_connect(server.url)
        admin = await JetStreamBus.connect(server.url, name="svc", user=service.user, password=service.password)
        agent = await JetStreamBus.connect(server.url, name="agent-a", user=node_a.user, password=node_a.password)
        try:
            await admin.ensure_streams(streams.all_streams())
            for node in ("node-a.example", "b"):
                value = NodeSloRendered(node=node, spec={}, rendered_at=1.0)
                await admin.publish(subjects.slo_key(node), msgspec.json.encode(value), msg_id=node)

            ack = await agent.publish(subjects.node_metrics("node-a.example"), b"own", msg_id="a1")
            assert ack.stream == streams.KOORD_NODE
            with pytest.raises(DENIED):
                await asyncio.wait_for(agent.publish(subjects.node_metrics("b"), b"forged", msg_id="b1"), 2)
            assert await admin.last_on_subject(streams.KOORD_NODE, subjects.stored(subjects.node_metrics("b"))) is None

            own = await agent.last_on_subject(streams.KV_KOORD_SLO, subjects.slo_key("node-a.example"), direct=True)
            assert own is not None and NODE_SLO_DECODER.decode(own.data).node == "node-a.example"
            with pytest.raises(DENIED):  # another node's key
                await asyncio.wait_for(
                    agent.last_on_subject(streams.KV_KOORD_SLO, subjects.slo_key("b"), direct=True), 2
                )
            with pytest.raises(DENIED):  # the stream API (any key) is not granted either
                await asyncio.wait_for(
                    agent.last_on_subject(streams.KV_KOORD_SLO, subjects.slo_key("node-a.example")), 2
                )

            source = SloSource(agent, "node-a.example", state_dir="", now=0.0)
            assert await source.refresh(1.0) and source.revision > 0  # what the agent runs with these rights

            # its own node's last batch/mid decision (the allocatable evictions' input), and no other node's
            for node, cpu in (("node-a.example", 12000), ("b", 3000)):
                decided = _decision(node, cpu)
                await admin.publish(subjects.noderesource_computed(node), msgspec.json.encode(decided), msg_id=node)
            allocatable = AllocatableSource(agent, "node-a.example")
            await allocatable.refresh()
            assert allocatable.allocatable == {"kubernetes.io/batch-cpu": 12000, "kubernetes.io/batch-memory": 2**34}
            assert allocatable.cpu_normalization_ratio == 1.25  # and its CPU normalization ratio, for BE quotas
            with pytest.raises(DENIED):
                await asyncio.wait_for(
                    agent.last_on_subject(streams.KOORD_NODERESOURCE, subjects.noderesource_computed("b"), direct=True),
                    2,
                )
        finally:
            await agent.close()
            await admin.close()
    finally:
        await server.stop()


def test_credentials_files_round_trip_and_bad_ones_are_named() -> None:
    user = auth.issue_node("n1")
    assert auth.read_creds(auth.creds_json(user), source="x") == (user.user, user.password)
    with pytest.raises(ValueError, match=r"creds\.json is not a koordbus NATS credentials file"):
        auth.read_creds("{}", source="creds.json")
    block = auth.render_authorization([user, auth.issue_service("api")])
    assert block.startswith("authorization {") and '"user": "node-n1"' in block and "koord.v1.node.n1.>" in block


async def test_the_agent_process_runs_with_its_node_credentials(tmp_path: Path) -> None:
    """`koordbus creds issue-node` writes the file; `koordbus agent --nats-creds` runs with it (creating no stream:
    its user could not) and its reports arrive."""
    node = "node-a.example"
    creds_file = tmp_path / "agent.creds.json"
    issued = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "koordbus.cli", "creds", "issue-node", node, "--out", str(creds_file),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    printed = (await issued.communicate())[0].decode()
    assert issued.returncode == 0, printed
    user, password = auth.read_creds(creds_file.read_text(), source=str(creds_file))
    assert (creds_file.stat().st_mode & 0o777) == 0o600 and f'"user": "{user}"' in printed
    service = auth.issue_service("control-plane")
    node_user = auth.NatsUser(user=user, password=password, permissions=auth.node_permissions(node))
    server = EmbeddedNatsServer(
        store_dir=tmp_path / "nats", authorization=auth.render_authorization([service, node_user])
    )
    await server.start()
    admin = await JetStreamBus.connect(server.url, name="svc", user=service.user, password=service.password)
    v1_tree(tmp_path / "cg")
    process = None
    try:
        await admin.ensure_streams(streams.all_streams())
        command = [
            sys.executable, "-m", "koordbus.cli", "agent", "--nats-url", server.url, "--nats-creds", str(creds_file),
            "--node-name", node, "--cgroup-root", str(tmp_path / "cg"), "--dry-run", "--port", "0",
            "--state-dir", str(tmp_path / "state"),
        ]  # fmt: skip
        env = {**os.environ, "KOORDBUS_CGROUP_DRIVER": "cgroupfs", "KOORDBUS_PUBLISH_INTERVAL": "1"}
        process = await asyncio.create_subprocess_exec(
            *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )

        async def reported() -> bool:
            assert process is not None and process.returncode is None, "the agent exited"
            return (
                await admin.last_on_subject(streams.KOORD_NODE, subjects.stored(subjects.node_state(node))) is not None
            )

        await eventually(reported, timeout=30)
    finally:
        if process is not None and process.returncode is None:
            process.send_signal(signal.SIGINT)
            output = (await asyncio.wait_for(process.communicate(), 30))[0].decode()
            assert process.returncode == 0, output
            assert "Permissions Violation" not in output, output
        await admin.close()
        await server.stop()


def _decision(node: str, batch_cpu: int) -> NodeResourceComputed:
    return NodeResourceComputed(
        node=node,
        computed_at=1.0,
        trigger=("nodemetric",),
        outcome="computed",
        resources={"kubernetes.io/batch-cpu": batch_cpu, "kubernetes.io/batch-memory": 2**34},
        write_due=True,
        write_reason="first write",
        annotations={"node.koordinator.sh/cpu-normalization-ratio": "1.25"},
    )
