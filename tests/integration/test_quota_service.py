"""The quota service on a real nats-server: commands over request/reply with optimistic concurrency, statuses on
last-value subjects, pods from the cluster stream, restart and replay, and an unusable event in the log."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from typing import Any

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from bus import streams, subjects
from bus.errors import BusUnavailableError
from bus.jetstream import JetStreamBus
from schemas import kube, quota
from schemas import quota_events as ev
from schemas.cluster import NodeObserved, PodObserved
from schemas.quota_service import (
    QUOTA_STATUS_DECODER,
    CheckReply,
    CheckRequest,
    CommandReply,
    CommandRequest,
    QuotaStatusComputed,
    QuotaTreeComputed,
    WhatIfReply,
    WhatIfRequest,
)
from services.common.metrics import new_registry
from services.quota.core import DEFAULT_TREE
from services.quota.service import QuotaService
from services.quota.settings import QuotaSettings
from services.quota.store import QuotaStore
from tests.support.waiting import eventually
from tests.unit.test_quota_model import node, pod
from tests.unit.test_quota_validation import eq

SETTINGS = QuotaSettings(tick_seconds=0.2, linger_seconds=0.0, startup_timeout_seconds=10)


async def started(koordbus_bus: JetStreamBus) -> QuotaService:
    service = QuotaService(koordbus_bus, SETTINGS, registry=new_registry())
    await service.start()
    return service


async def command(koordbus_bus: JetStreamBus, cmd: ev.QuotaCommand, *, version: str = "") -> CommandReply:
    request = CommandRequest(actor="alice", command=cmd, expected_resource_version=version)
    data = await koordbus_bus.request(subjects.QUOTA_RPC_COMMAND, msgspec.json.encode(request), timeout=10)
    return msgspec.json.decode(data, type=CommandReply)


def cid() -> str:
    return uuid.uuid4().hex


async def status(koordbus_bus: JetStreamBus, name: str) -> QuotaStatusComputed | None:
    stored = await koordbus_bus.last_on_subject(streams.KOORD_QUOTA_STATUS, subjects.quota_status(name))
    if stored is None:
        return None
    decoded = QUOTA_STATUS_DECODER.decode(stored.data)
    assert isinstance(decoded, QuotaStatusComputed)
    return decoded


async def tree_status(koordbus_bus: JetStreamBus, tree: str = DEFAULT_TREE) -> QuotaTreeComputed | None:
    stored = await koordbus_bus.last_on_subject(streams.KOORD_QUOTA_STATUS, subjects.quota_tree_status(tree))
    if stored is None:
        return None
    decoded = QUOTA_STATUS_DECODER.decode(stored.data)
    assert isinstance(decoded, QuotaTreeComputed)
    return decoded


async def observe(koordbus_bus: JetStreamBus, *objects: Any) -> None:
    for obj in objects:
        if isinstance(obj, kube.Node):
            event: Any = NodeObserved(name=obj.metadata.name, observed_at=1.0, node=obj)
            subject = subjects.cluster_node(obj.metadata.name)
        else:
            event = PodObserved(namespace=obj.metadata.namespace, name=obj.metadata.name, observed_at=1.0, pod=obj)
            subject = subjects.cluster_pod(obj.metadata.namespace, obj.metadata.name)
        await koordbus_bus.publish(subject, msgspec.json.encode(event), msg_id=cid())


async def build_team(koordbus_bus: JetStreamBus) -> None:
    for cmd in (
        ev.CreateQuota(command_id=cid(), quota=eq("org", is_parent=True, min={"cpu": "30"}, max={"cpu": "40"})),
        ev.CreateQuota(command_id=cid(), quota=eq("a", parent="org", min={"cpu": "15"}, max={"cpu": "40"})),
        ev.CreateQuota(command_id=cid(), quota=eq("b", parent="org", min={"cpu": "10"}, max={"cpu": "40"})),
    ):
        reply = await command(koordbus_bus, cmd)
        assert reply.outcome == "applied", reply


async def test_commands_append_events_and_statuses_follow(koordbus_bus: JetStreamBus) -> None:
    await observe(koordbus_bus, node("n1", "40"))
    service = await started(koordbus_bus)
    try:
        await build_team(koordbus_bus)
        await observe(koordbus_bus, pod("p1", "30", quota_name="a", node_name="n1"), pod("p2", "5", quota_name="b"))

        async def a_runtime_is_30() -> bool:
            held = await status(koordbus_bus, "a")
            return held is not None and held.state is not None and held.state.runtime == {"cpu": 30_000}

        await eventually(a_runtime_is_30)
        a = await status(koordbus_bus, "a")
        assert a is not None and a.state is not None and a.object is not None and a.explanation is not None
        assert a.state.used == {"cpu": 30_000} and a.pods == 1 and a.tree == DEFAULT_TREE
        assert a.object.metadata.resource_version == "2"
        assert a.explanation.resources["cpu"].runtime == 30_000
        tree = await tree_status(koordbus_bus)
        assert tree is not None and tree.total["cpu"] == 40_000 and not tree.problems

        rejected = await command(koordbus_bus, ev.DeleteQuota(command_id=cid(), name="a"))
        assert rejected.outcome == "rejected" and [v.rule for v in rejected.violations] == ["delete-with-pods"]
        too_much = await command(
            koordbus_bus, ev.PatchQuota(command_id=cid(), name="b", patch={"spec": {"min": {"cpu": "20"}}})
        )
        assert too_much.outcome == "rejected" and "min-sum" in {v.rule for v in too_much.violations}
        count, _ = await koordbus_bus.stream_info(streams.KOORD_QUOTA)
        assert count == 3  # nothing appended for rejected commands

        check = CheckRequest(pods=[pod("q1", "10", quota_name="a"), pod("q2", "4", quota_name="b")])
        raw = await koordbus_bus.request(subjects.QUOTA_RPC_CHECK, msgspec.json.encode(check), timeout=10)
        verdicts = msgspec.json.decode(raw, type=CheckReply)
        assert [v["fits"] for v in verdicts.verdicts] == [False, True] and not verdicts.fits
        what_if = WhatIfRequest(
            commands=[ev.PatchQuota(command_id="w", name="b", patch={"spec": {"min": {"cpu": "5"}}})]
        )
        raw = await koordbus_bus.request(subjects.QUOTA_RPC_WHAT_IF, msgspec.json.encode(what_if), timeout=10)
        changes = {c.quota: c for c in msgspec.json.decode(raw, type=WhatIfReply).changes}
        assert changes["b"].after is not None and changes["b"].after.min == {"cpu": 5_000}
        assert service.model.state.quotas["b"].spec.min == {"cpu": "10"}
    finally:
        await service.stop()


async def test_a_status_that_returns_to_an_earlier_value_is_published_again(koordbus_bus: JetStreamBus) -> None:
    """A → B → A within JetStream's duplicate window: the third status must not be taken for a duplicate of the
    first (it once was, leaving B as the quota's status), and a restarted service publishes nothing unchanged."""
    await observe(koordbus_bus, node("n1", "40"))
    service = await started(koordbus_bus)
    try:
        await build_team(koordbus_bus)

        async def a_uses(cpu: int) -> bool:
            held = await status(koordbus_bus, "a")
            return held is not None and held.state is not None and held.state.used.get("cpu", 0) == cpu

        for quota_name, used_by_a in (("a", 30_000), ("b", 0), ("a", 30_000)):
            await observe(koordbus_bus, pod("p1", "30", quota_name=quota_name, node_name="n1"))
            await eventually(lambda used=used_by_a: a_uses(used))  # type: ignore[misc]
    finally:
        await service.stop()
    before, _ = await koordbus_bus.stream_info(streams.KOORD_QUOTA_STATUS)
    restarted = await started(koordbus_bus)
    try:
        await restarted.publish_changes()
        after, _ = await koordbus_bus.stream_info(streams.KOORD_QUOTA_STATUS)
        assert after == before  # the last statuses on the stream were read back: nothing to publish again
    finally:
        await restarted.stop()


async def test_statuses_a_failed_publish_left_out_are_published_after_it(
    koordbus_bus: JetStreamBus, monkeypatch: Any
) -> None:
    """A status publish that fails (an election outlasting the bus's retries) is not forgotten. The model reports a
    change once: when the tick's publish took it and failed, the statuses stayed as they were until the quota
    changed again (a redelivered batch applies its changes again, a tick has nothing to apply again)."""
    await observe(koordbus_bus, node("n1", "40"))
    service = await started(koordbus_bus)
    publish_many = koordbus_bus.publish_many
    failing = asyncio.Event()

    async def fails_once(messages: Any) -> Any:
        if failing.is_set():
            failing.clear()
            raise BusUnavailableError("no answer (as during an election)")
        return await publish_many(messages)

    async def a_uses(cpu: int) -> bool:
        held = await status(koordbus_bus, "a")
        return held is not None and held.state is not None and held.state.used.get("cpu", 0) == cpu

    try:
        await build_team(koordbus_bus)
        await eventually(lambda: a_uses(0))
        monkeypatch.setattr(koordbus_bus, "publish_many", fails_once)
        failing.set()
        # a change only the tick publishes (as when the tick's refresh takes a batch's change before its flush)
        service.model.set_pod("apps/p1", pod("p1", "30", quota_name="a", node_name="n1"), now=time.time())
        await eventually(lambda: not failing.is_set())  # the publish with a's new status failed
        await eventually(lambda: a_uses(30_000))  # the next tick publishes it
    finally:
        await service.stop()


async def test_nodes_observed_after_start_make_the_default_trees_total(koordbus_bus: JetStreamBus) -> None:
    """The service starts before any node is observed (`koordbus up --simulate-nodes`, whose simulated cluster
    publishes its Nodes on the bridge's subjects once the services run): the tree's total and the root's runtime
    follow the nodes as they come, with only the three system quotas in the tree."""
    service = await started(koordbus_bus)
    try:
        tree = await tree_status(koordbus_bus)
        assert tree is not None and tree.total == {}
        await observe(koordbus_bus, node("n1", "32", "128Gi"), node("n2", "16", "64Gi"))

        async def total_is_48_cores() -> bool:
            held = await tree_status(koordbus_bus)
            return held is not None and held.total == {"cpu": 48_000, "memory": 192 * 2**30}

        await eventually(total_is_48_cores)
        root = await status(koordbus_bus, quota.ROOT_QUOTA)
        assert root is not None and root.state is not None
        assert root.state.runtime == {"cpu": 48_000, "memory": 192 * 2**30}
    finally:
        await service.stop()


async def test_an_object_version_guards_updates(koordbus_bus: JetStreamBus) -> None:
    service = await started(koordbus_bus)
    try:
        await build_team(koordbus_bus)
        patch = {"spec": {"min": {"cpu": "12"}}}
        stale = await command(koordbus_bus, ev.PatchQuota(command_id=cid(), name="b", patch=patch), version="1")
        assert stale.outcome == "conflict" and "resourceVersion 3, not 1" in stale.message
        fresh = await command(koordbus_bus, ev.PatchQuota(command_id=cid(), name="b", patch=patch), version="3")
        assert fresh.outcome == "applied" and fresh.quota is not None
        assert fresh.quota.metadata.resource_version == "4" and fresh.quota.spec.min == {"cpu": "12"}
    finally:
        await service.stop()


async def test_a_command_does_not_wait_for_the_linger(koordbus_bus: JetStreamBus) -> None:
    """Default settings (pods and nodes linger 0.1 s): a command waits for its own event, which comes back through
    the quota log's consumer at once, not after a linger (it did: ~100 ms a command, ~10 commands/s at most)."""
    service = QuotaService(
        koordbus_bus, replace(SETTINGS, linger_seconds=QuotaSettings().linger_seconds), registry=new_registry()
    )
    await service.start()
    try:
        await build_team(koordbus_bus)
        loop = asyncio.get_running_loop()
        started_at = loop.time()
        for cpu in range(20, 30):
            patch = {"spec": {"max": {"cpu": str(cpu)}}}
            reply = await command(koordbus_bus, ev.PatchQuota(command_id=cid(), name="b", patch=patch))
            assert reply.outcome == "applied", reply
        assert loop.time() - started_at < 10 * QuotaSettings().linger_seconds * 0.9
    finally:
        await service.stop()


async def test_two_replicas_racing_on_one_tree_cannot_both_win(koordbus_nats_url: str) -> None:
    """Two services (as two replicas) decide conflicting commands on the same state at the same moment: each
    raises b's or a's min so that Σ min stays ≤ org's min 30 alone but not together. Exactly one is appended."""
    buses = [await JetStreamBus.connect(koordbus_nats_url, name=f"replica-{i}") for i in range(2)]
    services = [
        QuotaService(b, replace(SETTINGS, instance=f"r{i}"), registry=new_registry()) for i, b in enumerate(buses)
    ]
    try:
        for service in services:
            await service.start()
        await build_team(buses[0])
        await eventually(lambda: all(s.model.tree_seq.get(DEFAULT_TREE) == 3 for s in services))
        requests = [
            services[0].execute(
                CommandRequest(
                    actor="alice",
                    command=ev.PatchQuota(command_id=cid(), name="a", patch={"spec": {"min": {"cpu": "20"}}}),
                )
            ),
            services[1].execute(
                CommandRequest(
                    actor="bob",
                    command=ev.PatchQuota(command_id=cid(), name="b", patch={"spec": {"min": {"cpu": "15"}}}),
                )
            ),
        ]
        replies = await asyncio.gather(*requests)
        outcomes = sorted(r.outcome for r in replies)
        assert outcomes in (["applied", "conflict"], ["applied", "rejected"]), replies
        count, _ = await buses[0].stream_info(streams.KOORD_QUOTA)
        assert count == 4
        await eventually(lambda: all(s.model.tree_seq.get(DEFAULT_TREE) == 4 for s in services))
        mins = [services[0].model.state.specs()[n].min["cpu"] for n in ("a", "b")]
        assert sum(mins) <= 30_000  # the invariant the race would have broken
        assert services[0].model.state == services[1].model.state
    finally:
        for service in services:
            await service.stop()
        for b in buses:
            await b.close()


async def test_the_loser_of_a_stale_append_gets_a_conflict(koordbus_bus: JetStreamBus) -> None:
    """Another writer appends to the tree after the service decided and before its own append lands: the
    expected-sequence check on the NATS server refuses the service's event and the reply is a conflict."""
    service = await started(koordbus_bus)
    try:
        await build_team(koordbus_bus)
        real_publish = koordbus_bus.publish

        async def another_writer_first(subject: str, data: bytes, *, msg_id: str, options: Any = None) -> Any:
            if subject == subjects.quota_events(DEFAULT_TREE) and msg_id != "sneak":
                sneak = ev.QuotaUpdated(
                    quota=service.model.state.quotas["b"], actor="other", time=service._now(), command_id="sneak"
                )
                await real_publish(subject, ev.encode_quota_event(sneak), msg_id="sneak", options=options)
            return await real_publish(subject, data, msg_id=msg_id, options=options)

        koordbus_bus.publish = another_writer_first  # type: ignore[method-assign]
        reply = await service.execute(
            CommandRequest(actor="alice", command=ev.PatchQuota(command_id=cid(), name="a", patch={"spec": {}}))
        )
        assert reply.outcome == "conflict" and "another writer won the race" in reply.message
        koordbus_bus.publish = real_publish  # type: ignore[method-assign]
        count, _ = await koordbus_bus.stream_info(streams.KOORD_QUOTA)
        assert count == 4  # the other writer's event only
        retry = await service.execute(
            CommandRequest(actor="alice", command=ev.PatchQuota(command_id=cid(), name="a", patch={"spec": {}}))
        )
        assert retry.outcome == "applied" and retry.seq == 5  # on fresh state, the retry wins
    finally:
        await service.stop()


async def test_restart_replays_the_log_and_an_unusable_event_flags_its_tree(koordbus_bus: JetStreamBus) -> None:
    await observe(koordbus_bus, node("n1", "40"), pod("p1", "8", quota_name="a", node_name="n1"))
    service = await started(koordbus_bus)
    await build_team(koordbus_bus)
    await eventually(lambda: service.model.pod_count("a") == 1)
    before = service.model.state
    await service.stop()
    await koordbus_bus.publish(
        subjects.quota_events(DEFAULT_TREE), b'{"type": "quota.updated.v1", "nonsense": 1}', msg_id="bad"
    )
    again = await started(koordbus_bus)
    try:
        assert again.model.state == before and again.model.tree_seq[DEFAULT_TREE] == 4
        await eventually(lambda: again.model.pod_count("a") == 1)  # pods may trail the log: they count when they come
        assert "event 4 skipped" in again.model.corrupt[DEFAULT_TREE]

        async def flagged() -> bool:
            tree = await tree_status(koordbus_bus)
            return tree is not None and bool(tree.problems)

        await eventually(flagged)
        dead, _ = await koordbus_bus.stream_info(streams.KOORD_DLQ)
        assert dead == 1
        reply = await command(
            koordbus_bus, ev.PatchQuota(command_id=cid(), name="b", patch={"spec": {"min": {"cpu": "5"}}})
        )
        assert reply.outcome == "applied" and reply.seq == 5
    finally:
        await again.stop()


async def test_projections_hold_statuses_history_and_profiles(
    koordbus_bus: JetStreamBus, migrated_engine: AsyncEngine
) -> None:
    store = QuotaStore(migrated_engine)
    service = QuotaService(koordbus_bus, SETTINGS, registry=new_registry(), store=store)
    await service.start()
    try:
        await observe(koordbus_bus, node("n1", "40"))
        await build_team(koordbus_bus)
        profile = quota.ElasticQuotaProfile(
            metadata=kube.ObjectMeta(name="gpu", namespace="ns"),
            spec=quota.ElasticQuotaProfileSpec(quota_name="gpu-root", node_selector=quota.LabelSelector()),
        )
        assert (await command(koordbus_bus, ev.CreateProfile(command_id=cid(), profile=profile))).outcome == "applied"
        await command(koordbus_bus, ev.PatchQuota(command_id=cid(), name="b", patch={"spec": {"min": {"cpu": "12"}}}))

        async def projected() -> bool:
            b = await store.quota("b")
            return b is not None and b.state is not None and b.state.min == {"cpu": 12_000}

        await eventually(projected)
        names = [s.quota for s in await store.quotas(tree=DEFAULT_TREE)]
        assert {"org", "a", "b", quota.ROOT_QUOTA} <= set(names)

        async def history_projected() -> bool:  # its own projector: it may trail the status one
            return len(await store.history("b", limit=10)) == 2

        await eventually(history_projected)
        history = await store.history("b", limit=10)
        assert [h.type for h in history] == ["quota.updated.v1", "quota.created.v1"]
        assert history[0].actor == "alice" and history[0].event["quota"]["spec"]["min"] == {"cpu": "12"}
        assert [p["metadata"]["name"] for p in await store.profiles()] == ["gpu"]

        async def tree_sized() -> bool:  # the tree view is projected from its own events: it may trail the others
            tree = await store.tree(DEFAULT_TREE)
            return tree is not None and tree.total.get("cpu") == 40_000

        await eventually(tree_sized)
        assert (await command(koordbus_bus, ev.DeleteQuota(command_id=cid(), name="b"))).outcome == "applied"

        async def gone() -> bool:
            return await store.quota("b") is None

        await eventually(gone)
    finally:
        await service.stop()


async def test_a_profile_roots_its_own_tree_sized_by_its_nodes(koordbus_bus: JetStreamBus) -> None:
    gpu_node = msgspec.convert(
        {
            "metadata": {"name": "g1", "labels": {"pool": "gpu"}},
            "status": {"allocatable": {"cpu": "32", "memory": "64Gi"}},
        },
        kube.Node,
    )
    await observe(koordbus_bus, node("n1", "40"), gpu_node)
    service = await started(koordbus_bus)
    try:
        profile = msgspec.convert(
            {
                "metadata": {"name": "gpu", "namespace": "teams"},
                "spec": {
                    "quotaName": "gpu-root",
                    "nodeSelector": {"matchLabels": {"pool": "gpu"}},
                    "quotaLabels": {quota.LABEL_TREE_ID: "gpu"},
                },
            },
            quota.ElasticQuotaProfile,
        )
        assert (await command(koordbus_bus, ev.CreateProfile(command_id=cid(), profile=profile))).outcome == "applied"
        await service.reconcile_profiles()
        root = service.model.state.specs()["gpu-root"]
        assert root.is_root and root.tree_id == "gpu" and root.min == {"cpu": 32_000, "memory": 64 * 2**30}
        assert service.model.tree("gpu").total["cpu"] == 32_000
        assert service.model.tree(DEFAULT_TREE).total["cpu"] == 40_000  # 72 − the gpu tree's 32
        child = eq("ml", parent="gpu-root", min={"cpu": "8"}, max={"cpu": "32"})
        created = await command(koordbus_bus, ev.CreateQuota(command_id=cid(), quota=child))
        assert created.outcome == "applied" and created.tree == "gpu"
        assert created.quota is not None and created.quota.metadata.labels[quota.LABEL_TREE_ID] == "gpu"
        await service.reconcile_profiles()
        count, _ = await koordbus_bus.stream_info(streams.KOORD_QUOTA)
        assert count == 3  # nothing changed: no new root event
        bigger = msgspec.structs.replace(gpu_node, metadata=kube.ObjectMeta(name="g2", labels={"pool": "gpu"}))
        await observe(koordbus_bus, bigger)
        await eventually(lambda: len(service.model.nodes()) == 3)
        await service.reconcile_profiles()
        assert service.model.state.specs()["gpu-root"].min["cpu"] == 64_000
        assert service.profile_errors == {}
    finally:
        await service.stop()
