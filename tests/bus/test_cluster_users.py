"""Who may do what on the three-server cluster configured as the Helm chart renders it (bus.auth.chart_authorization;
`koordbus up --nats-cluster N` runs the same users and permissions): each service connects as its own user and
does what it does — the quota service serves its commands, the slo service writes NodeSLO keys, the API asks and
reads — while an agent's user publishes only its own node's subjects and reads only its own key: another node's
subjects and a service's request subject are refused (the chart gives services everything, so only the agent is
fenced)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from bus import streams, subjects
from bus.errors import BusError
from schemas.qos import NODE_SLO_DECODER, NodeSloRendered
from tests.fixtures.nats_cluster import AGENT, AGENT_NODE, ClusterUnderTest

DENIED = (BusError, TimeoutError)
"""A denied publish or read is dropped by the server: the request fails or times out, nothing is stored."""


async def test_each_user_does_what_its_part_needs_and_an_agent_only_its_node(nats_cluster: ClusterUnderTest) -> None:
    quota = await nats_cluster.connect("quota", user="quota")
    slo = await nats_cluster.connect("slo", user="slo")
    api = await nats_cluster.connect("api", user="api")
    agent = await nats_cluster.connect("agent", user=AGENT)
    try:

        async def answer(data: bytes) -> bytes:
            return b"done:" + data

        await quota.serve(subjects.QUOTA_RPC_COMMAND, answer, queue="quota")
        assert await api.request(subjects.QUOTA_RPC_COMMAND, b"c1", timeout=5) == b"done:c1"
        with pytest.raises(DENIED):  # another service's request subject
            await asyncio.wait_for(agent.request(subjects.QUOTA_RPC_COMMAND, b"forged", timeout=2), 3)

        for node in (AGENT_NODE, "other-node"):
            value = NodeSloRendered(node=node, spec={}, rendered_at=1.0)
            await slo.publish(subjects.slo_key(node), msgspec.json.encode(value), msg_id=node)
        own = await agent.last_on_subject(streams.KV_KOORD_SLO, subjects.slo_key(AGENT_NODE), direct=True)
        assert own is not None and NODE_SLO_DECODER.decode(own.data).node == AGENT_NODE
        with pytest.raises(DENIED):  # another node's key
            await asyncio.wait_for(
                agent.last_on_subject(streams.KV_KOORD_SLO, subjects.slo_key("other-node"), direct=True), 3
            )

        ack = await agent.publish(subjects.node_metrics(AGENT_NODE), b"own", msg_id="own-1")
        assert ack.stream == streams.KOORD_NODE
        with pytest.raises(DENIED):  # another node's subject
            await asyncio.wait_for(agent.publish(subjects.node_metrics("other-node"), b"forged", msg_id="f1"), 3)
        stored = subjects.stored(subjects.node_metrics("other-node"))
        assert await api.last_on_subject(streams.KOORD_NODE, stored) is None
        with pytest.raises(DENIED):  # and no stream administration
            await asyncio.wait_for(agent.ensure_streams(streams.all_streams(replicas=3)), 5)
    finally:
        for bus in (agent, api, slo, quota):
            await bus.close()
