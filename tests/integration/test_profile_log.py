"""The profile log (KOORD_CCP) through services.webhook.client on both buses (MemoryBus and a real nats-server):
appends with optimistic concurrency, one message per profile, tombstones, a retried command stored once, and the
webhook service's view following the log next to the cluster's profiles."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
import pytest_asyncio

from bus import streams, subjects
from bus.errors import ConflictError
from bus.jetstream import JetStreamBus
from bus.memory import MemoryBus
from schemas.cluster import ColocationProfile, ColocationProfileObserved, ProfileMeta
from services.common.metrics import new_registry
from services.webhook.client import ProfileClient
from services.webhook.service import WebhookService
from services.webhook.settings import WebhookSettings
from tests.support.waiting import eventually


@pytest.fixture(params=["memory", "jetstream"])
def backend_url(request: pytest.FixtureRequest) -> str | None:
    """None for the MemoryBus, else a private nats-server with koordbus's streams."""
    if request.param == "memory":
        return None
    url: str = request.getfixturevalue("koordbus_nats_url")
    return url


@pytest_asyncio.fixture
async def bus(backend_url: str | None) -> AsyncIterator[MemoryBus | JetStreamBus]:
    opened: MemoryBus | JetStreamBus
    if backend_url is None:
        opened = MemoryBus()
        await opened.ensure_streams(streams.all_streams())
    else:
        opened = await JetStreamBus.connect(backend_url, name="profile-log")
    try:
        yield opened
    finally:
        await opened.close()


def ccp(name: str, **spec: object) -> ColocationProfile:
    return ColocationProfile(metadata=ProfileMeta(name=name), spec=dict(spec))


async def test_appends_are_guarded_by_the_profiles_last_sequence(bus: MemoryBus | JetStreamBus) -> None:
    client = ProfileClient(bus, clock=lambda: 1000.0)
    assert await client.current("b") == (0, None)
    first = await client.put(ccp("b", qosClass="BE"), expected_seq=0, actor="alice", command_id="c1")
    await client.put(ccp("a", qosClass="LS"), expected_seq=0, actor="bob", command_id="c2")
    seq, stored = await client.current("b")
    assert seq == first.seq and stored is not None and stored.actor == "alice" and stored.time == 1000.0
    assert [s.profile.metadata.name for s in await client.all()] == ["a", "b"]

    with pytest.raises(ConflictError):  # a writer that read nothing (or an older version) loses
        await client.put(ccp("b", qosClass="LS"), expected_seq=0, actor="carol", command_id="c3")
    again = await client.put(ccp("b", qosClass="BE"), expected_seq=first.seq, actor="alice", command_id="c1")
    assert again.duplicate and again.seq == first.seq  # the same command, retried: stored once

    gone = await client.delete("b", expected_seq=seq, actor="alice", command_id="c4")
    assert await client.current("b") == (gone.seq, None)
    assert [s.profile.metadata.name for s in await client.all()] == ["a"]
    assert await client.stored_names() == 2  # the tombstone is b's last message
    back = await client.put(ccp("b", qosClass="LSR"), expected_seq=gone.seq, actor="dave", command_id="c5")
    assert (await client.current("b"))[0] == back.seq


async def test_the_webhooks_view_follows_the_log_next_to_the_clusters_profiles(
    bus: MemoryBus | JetStreamBus,
) -> None:
    client = ProfileClient(bus)
    await client.put(ccp("shared", qosClass="BE"), expected_seq=0, actor="admin", command_id="x1")
    cluster = ColocationProfileObserved(name="shared", observed_at=1.0, profile=ccp("shared", qosClass="LS"))
    await bus.publish(subjects.cluster_profile("shared"), msgspec.json.encode(cluster), msg_id="k1")
    service = WebhookService(
        bus,
        WebhookSettings(tls_cert_file="unused.crt", tls_key_file="unused.key", startup_timeout_seconds=10),
        registry=new_registry(),
    )
    await service.start()
    try:
        assert [p["spec"] for p in service.view.profiles] == [{"qosClass": "BE"}]  # replayed before start returns
        assert service.view.shadowed() == ["shared"]
        seq, _ = await client.current("shared")
        await client.delete("shared", expected_seq=seq, actor="admin", command_id="x2")

        async def clusters_applies() -> bool:
            return [p["spec"] for p in service.view.profiles] == [{"qosClass": "LS"}]

        await eventually(clusters_applies, timeout=10)
    finally:
        await service.stop()
