"""Agents' NATS identities through the auth callout, on a real nats-server configured by
bus.auth.render_callout_authorization and the callout service (services.natsauth) asking the fake Kubernetes API
for TokenReviews: a pod-bound token of the agents' ServiceAccount makes a user of its node, able to publish only as
that node and to read only its own NodeSLO key; every other token is refused with its reason; service users bypass
the callout and may do everything."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
import pytest_asyncio
from kubernetes_asyncio.client import ApiClient

from bus import auth, nkeys, streams, subjects
from bus.errors import BusError
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from koordbus import runtime
from schemas.qos import NODE_SLO_DECODER, NodeSloRendered
from services.common.metrics import new_registry
from services.k8s.token_review import KubeTokenReviewer
from services.natsauth.service import NatsAuthService
from services.natsauth.settings import NatsAuthSettings
from tests.fakes.kube_api import FakeKubeApi
from tests.integration.test_agent_qos import v1_tree
from tests.support.waiting import eventually

DENIED = (BusError, TimeoutError)
AUDIENCE = "koordbus-nats"
AGENT_SA = "system:serviceaccount:koordbus:koordbus-agent"
NODE_A, NODE_B = "node-a.example", "b"


async def refused(url: str, **options: str) -> str:
    """What the server answers a client that connects once with these CONNECT options (auth_token, user, pass),
    spoken in NATS's text protocol (a JetStreamBus would retry for ever)."""
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        await reader.readline()  # INFO
        connect = json.dumps({"verbose": False, "pedantic": False, "name": "agent", **options})
        writer.write(f"CONNECT {connect}\r\nPING\r\n".encode())
        await writer.drain()
        return (await asyncio.wait_for(reader.readline(), 10)).decode()
    finally:
        writer.close()
        await writer.wait_closed()


@dataclass
class Cluster:
    server: EmbeddedNatsServer
    admin: JetStreamBus
    callout: NatsAuthService
    kube_api: FakeKubeApi

    async def agent(self, token: str, *, name: str = "agent") -> JetStreamBus:
        return await JetStreamBus.connect(self.server.url, name=name, token=lambda: token)

    def refusals(self, reason: str) -> float:
        return self.callout.decisions.labels("refused", reason)._value.get()


def pod_token(
    kube_api: FakeKubeApi, token: str, *, node: str | None, user: str = AGENT_SA, aud: str = AUDIENCE
) -> None:
    """A projected ServiceAccount token as the API server would review it: bound to a pod on `node`."""
    kube_api.tokens[token] = (user, ["system:serviceaccounts", "system:authenticated"])
    kube_api.token_audiences[token] = [aud]
    extra = {"authentication.kubernetes.io/pod-name": [f"agent-{node}"]}
    if node is not None:
        extra["authentication.kubernetes.io/node-name"] = [node]
    kube_api.token_extra[token] = extra


@pytest_asyncio.fixture
async def cluster(tmp_path: Path, kube_api: FakeKubeApi, kube_client: ApiClient) -> AsyncIterator[Cluster]:
    issuer = nkeys.from_random(nkeys.Prefix.ACCOUNT, secrets.token_bytes(32))
    callout_user = auth.NatsUser(user="natsauth", password=secrets.token_urlsafe(16))
    service = auth.issue_service("control-plane")
    server = EmbeddedNatsServer(
        store_dir=tmp_path / "nats",
        authorization=auth.render_callout_authorization(
            issuer_public_key=issuer.public_key, callout_user=callout_user, service_users=[service]
        ),
    )
    await server.start()
    callout_bus = admin = None
    try:
        callout_bus = await JetStreamBus.connect(
            server.url, name="natsauth", user=callout_user.user, password=callout_user.password
        )
        settings = NatsAuthSettings(agent_service_account="koordbus:koordbus-agent", token_audience=AUDIENCE)
        callout = NatsAuthService(
            callout_bus,
            KubeTokenReviewer(kube_client, audiences=[AUDIENCE]),
            issuer=issuer,
            settings=settings,
            registry=new_registry(),
        )
        await callout.start()
        admin = await JetStreamBus.connect(server.url, name="svc", user=service.user, password=service.password)
        await admin.ensure_streams(streams.all_streams())
        for node in (NODE_A, NODE_B):
            value = NodeSloRendered(node=node, spec={}, rendered_at=1.0)
            await admin.publish(subjects.slo_key(node), msgspec.json.encode(value), msg_id=node)
        yield Cluster(server=server, admin=admin, callout=callout, kube_api=kube_api)
        await callout.stop()
    finally:
        for bus in (admin, callout_bus):
            if bus is not None:
                await bus.close()
        await server.stop()


async def test_an_agent_token_acts_only_as_its_node(cluster: Cluster) -> None:
    pod_token(cluster.kube_api, "token-a", node=NODE_A)
    agent = await cluster.agent("token-a")
    try:
        ack = await agent.publish(subjects.node_metrics(NODE_A), b"own", msg_id="a1")
        assert ack.stream == streams.KOORD_NODE
        with pytest.raises(DENIED):
            await asyncio.wait_for(agent.publish(subjects.node_metrics(NODE_B), b"forged", msg_id="b1"), 2)
        stored_b = subjects.stored(subjects.node_metrics(NODE_B))
        assert await cluster.admin.last_on_subject(streams.KOORD_NODE, stored_b) is None

        own = await agent.last_on_subject(streams.KV_KOORD_SLO, subjects.slo_key(NODE_A), direct=True)
        assert own is not None and NODE_SLO_DECODER.decode(own.data).node == NODE_A
        with pytest.raises(DENIED):
            other = agent.last_on_subject(streams.KV_KOORD_SLO, subjects.slo_key(NODE_B), direct=True)
            await asyncio.wait_for(other, 2)
        with pytest.raises(DENIED):  # nor may it create or change streams
            await asyncio.wait_for(agent.ensure_streams(streams.all_streams()), 2)
    finally:
        await agent.close()
    assert cluster.callout.decisions.labels("allowed", "")._value.get() == 1
    reviews = [r for r in cluster.kube_api.requests if r.path.endswith("/tokenreviews")]
    assert len(reviews) == 1


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("unknown", "not_authenticated"),
        ("other-account", "wrong_account"),
        ("no-node", "no_node"),
        ("other-audience", "not_authenticated"),
        ("", "no_token"),
    ],
)
async def test_anything_else_is_refused_with_its_reason(cluster: Cluster, token: str, reason: str) -> None:
    pod_token(cluster.kube_api, "other-account", node=NODE_A, user="system:serviceaccount:koordbus:koordbus-k8s")
    pod_token(cluster.kube_api, "no-node", node=None)
    pod_token(cluster.kube_api, "other-audience", node=NODE_A, aud="https://kubernetes.default.svc")
    assert "Authorization Violation" in await refused(cluster.server.url, **({"auth_token": token} if token else {}))
    assert cluster.refusals(reason) == 1
    await eventually(lambda: "Auth callout service returned an error" in cluster.server.log_path.read_text())


async def test_a_service_user_with_a_wrong_password_is_refused_by_the_server(cluster: Cluster) -> None:
    assert "Authorization Violation" in await refused(cluster.server.url, user="service-control-plane", **{"pass": "x"})
    assert "Authorization Violation" in await refused(cluster.server.url, user="someone", **{"pass": "x"})
    assert cluster.refusals("no_token") == 1  # only the unlisted user reached the callout


async def test_a_service_user_bypasses_the_callout_and_may_do_everything(cluster: Cluster) -> None:
    admin = cluster.admin
    for node in (NODE_A, NODE_B):
        await admin.publish(subjects.node_metrics(node), b"x", msg_id=f"svc-{node}")
        read = await admin.last_on_subject(streams.KV_KOORD_SLO, subjects.slo_key(node), direct=True)
        assert read is not None
    await admin.ensure_streams(streams.all_streams())
    assert cluster.callout.decisions.labels("allowed", "")._value.get() == 0
    assert not [r for r in cluster.kube_api.requests if r.path.endswith("/tokenreviews")]


async def test_the_agent_reads_its_token_file_again_when_it_reconnects(cluster: Cluster, tmp_path: Path) -> None:
    """Projected tokens rotate: a reconnect presents the file's current token (the old one no longer reviews)."""
    pod_token(cluster.kube_api, "first", node=NODE_A)
    token_file = tmp_path / "token"
    token_file.write_text("first\n")
    agent = await JetStreamBus.connect(cluster.server.url, name="agent", token=runtime.token_reader(token_file))
    try:
        await agent.publish(subjects.node_metrics(NODE_A), b"1", msg_id="r1")
        del cluster.kube_api.tokens["first"]
        pod_token(cluster.kube_api, "second", node=NODE_A)
        token_file.write_text("second\n")
        reconnected = asyncio.Event()
        agent._nc._reconnected_cb = lambda: asyncio.sleep(0, reconnected.set())  # type: ignore[attr-defined]
        await agent._nc.force_reconnect()  # as after a NATS server restart
        await asyncio.wait_for(reconnected.wait(), 10)
        await agent.publish(subjects.node_metrics(NODE_A), b"2", msg_id="r2")
    finally:
        await agent.close()
    assert cluster.callout.decisions.labels("allowed", "")._value.get() == 2


async def test_the_cluster_secret_is_made_once_and_only_ever_gains_keys(kube_api: FakeKubeApi, tmp_path: Path) -> None:
    """`koordbus creds ensure-cluster-secret` (the chart's hook Job): the callout's account key and a user per
    service; a second run (an upgrade) keeps every value and adds only a new service's keys."""
    kubeconfig = kube_api.kubeconfig(tmp_path / "kubeconfig")

    async def ensure(services: str) -> str:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "koordbus.cli", "creds", "ensure-cluster-secret", "rel-koordbus-nats-auth",
            "--namespace", "koordbus", "--services", services, "--kubeconfig", str(kubeconfig),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output = (await process.communicate())[0].decode()
        assert process.returncode == 0, output
        return output

    def data() -> dict[str, str]:
        secret = kube_api.get("Secret", "rel-koordbus-nats-auth", "koordbus")
        assert secret is not None
        return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}

    assert "added api-password, api.creds.json, issuer-public-key, issuer-seed, route-password" in await ensure("api")
    first = data()
    issuer = nkeys.from_seed(first[auth.ISSUER_SEED_KEY])
    assert issuer.prefix is nkeys.Prefix.ACCOUNT and issuer.public_key == first[auth.ISSUER_PUBLIC_KEY_KEY]
    assert auth.read_creds(first["api.creds.json"], source="api") == ("service-api", first["api-password"])
    assert "added slo-password, slo.creds.json" in await ensure("api,slo")
    second = data()
    assert {k: second[k] for k in first} == first
    assert "added nothing" in await ensure("api,slo")
    assert data() == second


async def test_the_commands_run_the_callout_and_an_agent_with_its_token_file(
    tmp_path: Path, kube_api: FakeKubeApi
) -> None:
    """`koordbus service natsauth` and `koordbus agent --nats-token-file` as processes, configured as the chart
    configures them: the agent's reports arrive, sent as its node's user."""
    issuer = nkeys.from_random(nkeys.Prefix.ACCOUNT, secrets.token_bytes(32))
    callout_user, service = auth.issue_service("natsauth"), auth.issue_service("control-plane")
    (tmp_path / "natsauth.creds.json").write_text(auth.creds_json(callout_user))
    (tmp_path / "issuer-seed").write_text(issuer.seed)
    (tmp_path / "token").write_text("agent-token\n")
    pod_token(kube_api, "agent-token", node=NODE_A)
    server = EmbeddedNatsServer(
        store_dir=tmp_path / "nats",
        authorization=auth.render_callout_authorization(
            issuer_public_key=issuer.public_key, callout_user=callout_user, service_users=[service]
        ),
    )
    await server.start()
    admin = await JetStreamBus.connect(server.url, name="svc", user=service.user, password=service.password)
    v1_tree(tmp_path / "cg")
    env = {
        **os.environ, "KOORDBUS_AGENT_SERVICE_ACCOUNT": "koordbus:koordbus-agent",
        "KOORDBUS_ISSUER_SEED_FILE": str(tmp_path / "issuer-seed"), "KOORDBUS_TOKEN_AUDIENCE": AUDIENCE,
        "KOORDBUS_CGROUP_DRIVER": "cgroupfs", "KOORDBUS_PUBLISH_INTERVAL": "1",
    }  # fmt: skip
    cli = [sys.executable, "-m", "koordbus.cli"]
    processes: list[asyncio.subprocess.Process] = []
    try:
        await admin.ensure_streams(streams.all_streams())
        for args in (
            ["service", "natsauth", "--nats-creds", str(tmp_path / "natsauth.creds.json"),
             "--kubeconfig", str(kube_api.kubeconfig(tmp_path / "kubeconfig")), "--port", "0"],
            ["agent", "--nats-token-file", str(tmp_path / "token"), "--node-name", NODE_A, "--dry-run",
             "--cgroup-root", str(tmp_path / "cg"), "--port", "0", "--state-dir", str(tmp_path / "state")],
        ):  # fmt: skip
            process = await asyncio.create_subprocess_exec(
                *cli, *args, "--nats-url", server.url, env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
            processes.append(process)

        async def reported() -> bool:
            assert all(p.returncode is None for p in processes), "a process exited"
            stored = subjects.stored(subjects.node_state(NODE_A))
            return await admin.last_on_subject(streams.KOORD_NODE, stored) is not None

        await eventually(reported, timeout=60)
    finally:
        outputs = []
        for process in reversed(processes):
            if process.returncode is None:
                process.send_signal(signal.SIGINT)
            outputs.append((await asyncio.wait_for(process.communicate(), 30))[0].decode())
        await admin.close()
        await server.stop()
    callout_output = outputs[-1]
    assert f"connects as {auth.node_user_name(NODE_A)}" in callout_output, callout_output
    assert all(p.returncode == 0 for p in processes), outputs
