"""The reflector's pure decisions (services.k8s.core), its loop over a scripted collection (services.k8s.watch),
and the observer's pending-state publisher against a bus that goes away (services.k8s.observer). No network."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import msgspec
import pytest

from bus import subjects
from bus.api import PublishAck
from bus.errors import BusUnavailableError
from schemas import cluster
from services.k8s import core
from services.k8s.observer import KIND_NODE, KIND_POD, ClusterObserver, observed_message
from services.k8s.settings import K8sSettings
from services.k8s.watch import ApiStatusError, Reflector


def obj(name: str, rv: int, *, namespace: str = "", node_name: str = "", uid: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": str(rv), "uid": uid or f"uid-{name}"}
    if namespace:
        meta["namespace"] = namespace
    body: dict[str, Any] = {"metadata": meta}
    if node_name:
        body["spec"] = {"nodeName": node_name}
    return body


def list_body(rv: int, *items: dict[str, Any]) -> bytes:
    return json.dumps({"kind": "List", "metadata": {"resourceVersion": str(rv)}, "items": list(items)}).encode()


def line(kind: str, body: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": body}).encode()


def gone(message: str = "too old resource version") -> bytes:
    return json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": message}}).encode()


def event(kind: str, body: dict[str, Any]) -> core.WatchEvent:
    return core.parse_watch_line(line(kind, body))


# --- parsing


def test_parse_list_keeps_items_raw() -> None:
    result = core.parse_list(list_body(7, obj("a", 3), obj("b", 5)))
    assert result.resource_version == "7"
    assert [json.loads(item)["metadata"]["name"] for item in result.items] == ["a", "b"]
    assert core.parse_list(b'{"metadata": {"resourceVersion": "1"}, "items": null}').items == []


@pytest.mark.parametrize("body", [b"not json", b'{"items": []}', b'{"metadata": {"resourceVersion": 1}}'])
def test_parse_list_rejects_what_it_cannot_resume_from(body: bytes) -> None:
    with pytest.raises(core.MalformedError):
        core.parse_list(body)


def test_parse_watch_line_reads_error_status() -> None:
    parsed = core.parse_watch_line(gone("expired at 5"))
    assert (parsed.type, parsed.error_code, parsed.error_message) == ("ERROR", 410, "expired at 5")
    with pytest.raises(core.MalformedError):
        core.parse_watch_line(b'{"type": "ADDED"}')
    with pytest.raises(core.MalformedError):
        core.parse_watch_line(b'{"type": "ERROR", "object": []}')


@pytest.mark.parametrize(
    ("body", "namespaced", "reason"),
    [
        ({"metadata": {"resourceVersion": "1"}}, False, "without metadata.name"),
        ({"metadata": {"name": "a"}}, False, "without metadata.resourceVersion"),
        ({"metadata": {"name": "a", "resourceVersion": "1"}}, True, "without metadata.namespace"),
        ({"metadata": {"name": 5, "resourceVersion": "1"}}, False, "object metadata"),
        ({"metadata": {"name": "p", "resourceVersion": "1"}, "spec": {"nodeName": 3}}, False, "object metadata"),
    ],
)
def test_identity_needs_name_version_and_namespace(body: dict[str, Any], namespaced: bool, reason: str) -> None:
    with pytest.raises(core.MalformedError, match=reason):
        core.identity(json.dumps(body).encode(), namespaced=namespaced)


def test_error_status_prefers_the_status_message() -> None:
    assert core.error_status(b'{"kind": "Status", "code": 500, "message": "boom"}') == "boom"
    assert core.error_status(b"<html>bad gateway</html>") == "<html>bad gateway</html>"


def test_backoff_doubles_up_to_the_bound() -> None:
    delays = [core.backoff_delay(n, initial=0.5, maximum=3.0) for n in range(6)]
    assert delays == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]
    assert core.backoff_delay(10_000, initial=0.5, maximum=3.0) == 3.0


def test_backoff_jitter_only_shortens_the_delay_by_up_to_its_share() -> None:
    assert core.backoff_delay(3, initial=0.5, maximum=3.0, jitter=1.0) == pytest.approx(2.0 * (1 - core.BACKOFF_JITTER))
    assert core.backoff_delay(3, initial=0.5, maximum=3.0, jitter=0.5) == pytest.approx(
        2.0 * (1 - core.BACKOFF_JITTER / 2)
    )
    assert core.backoff_delay(0, initial=0.5, maximum=3.0, jitter=0.7) == 0.0
    spread = {core.backoff_delay(4, initial=0.5, maximum=3.0, jitter=j / 10) for j in range(11)}
    assert len(spread) == 11 and min(spread) >= 3.0 * (1 - core.BACKOFF_JITTER) and max(spread) == 3.0


# --- state transitions


def test_first_list_yields_every_object_and_sets_the_resume_point() -> None:
    state = core.ReflectorState(namespaced=True)
    changes, rejected = state.relist(
        core.parse_list(list_body(9, obj("p", 4, namespace="ns", node_name="n1"), {"metadata": {"name": "x"}}))
    )
    assert [(c.key, c.seen, c.deleted) for c in changes] == [(("ns", "p"), core.Seen("4", "uid-p", "n1"), False)]
    assert rejected == ["object 'x' without metadata.resourceVersion"]
    assert state.resource_version == "9"
    assert state.known == {("ns", "p"): core.Seen("4", "uid-p", "n1")}


def test_relist_yields_only_changes_and_tombstones_for_vanished_objects() -> None:
    state = core.ReflectorState(namespaced=True)
    state.relist(
        core.parse_list(
            list_body(
                9,
                obj("same", 2, namespace="ns"),
                obj("changed", 3, namespace="ns"),
                obj("gone", 4, namespace="ns", node_name="n2"),
            )
        )
    )
    state.expire()
    assert state.resource_version == ""
    changes, _ = state.relist(
        core.parse_list(
            list_body(
                20, obj("same", 2, namespace="ns"), obj("changed", 15, namespace="ns"), obj("new", 18, namespace="ns")
            )
        )
    )
    assert [(c.key[1], c.seen.resource_version, c.deleted) for c in changes] == [
        ("changed", "15", False),
        ("new", "18", False),
        ("gone", "20", True),
    ]
    tombstone = changes[-1]
    assert tombstone.raw is None and tombstone.seen == core.Seen("20", "uid-gone", "n2")
    assert set(state.known) == {("ns", "same"), ("ns", "changed"), ("ns", "new")}


def test_watch_events_update_state_and_skip_repeats() -> None:
    state = core.ReflectorState(namespaced=False)
    state.relist(core.parse_list(list_body(5, obj("a", 5))))
    assert state.apply(event("ADDED", obj("a", 5))) is None  # the list already had it
    change = state.apply(event("MODIFIED", obj("a", 6)))
    assert change is not None and change.seen.resource_version == "6" and change.raw is not None
    assert state.resource_version == "6"
    deleted = state.apply(event("DELETED", obj("a", 7)))
    assert deleted is not None and deleted.deleted and deleted.key == ("", "a")
    assert state.known == {}
    assert state.apply(event("BOOKMARK", {"metadata": {"resourceVersion": "12"}})) is None
    assert state.resource_version == "12"
    with pytest.raises(core.MalformedError):
        state.apply(event("BOOKMARK", {"metadata": {}}))
    with pytest.raises(core.MalformedError, match="unexpected watch event type"):
        state.apply(event("SOMETHING", obj("a", 13)))


def test_deleted_pod_keeps_the_node_it_was_on() -> None:
    state = core.ReflectorState(namespaced=True)
    state.relist(core.parse_list(list_body(5, obj("p", 5, namespace="ns", node_name="n1"))))
    deleted = state.apply(event("DELETED", {"metadata": {"name": "p", "namespace": "ns", "resourceVersion": "8"}}))
    assert deleted is not None and deleted.seen == core.Seen("8", "uid-p", "n1")


def test_observed_message_is_deterministic_and_on_the_object_subject() -> None:
    change = core.Change(key=("", "node-a"), seen=core.Seen("5"), raw=json.dumps(obj("node-a", 5)).encode())
    subject, data, identity = observed_message(KIND_NODE, change, observed_at=100.0)
    again = observed_message(KIND_NODE, change, observed_at=200.0)
    assert subject == subjects.cluster_node("node-a") and again[2] == identity
    decoded = cluster.CLUSTER_EVENT_DECODER.decode(data)
    assert isinstance(decoded, cluster.NodeObserved) and decoded.node is not None
    bad = core.Change(key=("", "b"), seen=core.Seen("6"), raw=b'{"status": {"capacity": {"cpu": "lots"}}}')
    with pytest.raises(msgspec.ValidationError, match="capacity"):
        observed_message(KIND_NODE, bad, observed_at=1.0)


# --- the loop, over a scripted collection


class ScriptedCollection:
    """Lists and watches answered from scripts; a watch past the script stays open until cancelled."""

    kind = "node"
    namespaced = False

    def __init__(self, lists: list[bytes | Exception], watches: list[list[bytes] | Exception]) -> None:
        self.lists = lists
        self.watches = watches
        self.watched_from: list[str] = []
        self.idle = asyncio.Event()

    async def list(self) -> bytes:
        answer = self.lists.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def watch(self, resource_version: str) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        self.watched_from.append(resource_version)
        return self._watch()

    @asynccontextmanager
    async def _watch(self) -> AsyncIterator[AsyncIterator[bytes]]:
        if not self.watches:
            self.idle.set()
            await asyncio.Event().wait()
        script = self.watches.pop(0)
        if isinstance(script, Exception):
            raise script
        yield _iterate(script)


async def _iterate(lines: list[bytes]) -> AsyncIterator[bytes]:
    for item in lines:
        yield item


async def run_until_idle(reflector: Reflector, collection: ScriptedCollection) -> None:
    task = asyncio.create_task(reflector.run())
    try:
        async with asyncio.timeout(5):
            await collection.idle.wait()
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def make_reflector(collection: ScriptedCollection) -> tuple[Reflector, list[tuple[str, bool]], list[float]]:
    seen: list[tuple[str, bool]] = []
    delays: list[float] = []

    def sink(kind: str, changes: list[core.Change]) -> None:
        seen.extend((f"{c.key[1]}@{c.seen.resource_version}", c.deleted) for c in changes)

    async def sleep(delay: float) -> None:
        delays.append(delay)

    reflector = Reflector(collection, sink, backoff_initial_seconds=0.5, backoff_max_seconds=4.0, sleep=sleep)
    return reflector, seen, delays


async def test_reflector_resumes_relists_on_gone_and_skips_bad_lines() -> None:
    collection = ScriptedCollection(
        lists=[ApiStatusError(500, "boom"), list_body(5, obj("a", 3), obj("b", 4)), list_body(20, obj("a", 9))],
        watches=[
            [line("MODIFIED", obj("a", 6)), b"garbage", line("BOOKMARK", {"metadata": {"resourceVersion": "8"}})],
            ApiStatusError(503, "unavailable"),
            [line("ADDED", obj("c", 10)), gone()],
        ],
    )
    reflector, seen, delays = make_reflector(collection)
    await run_until_idle(reflector, collection)

    assert seen == [("a@3", False), ("b@4", False), ("a@6", False), ("c@10", False), ("a@9", False),
                    ("b@20", True), ("c@20", True)]  # fmt: skip
    # resumed from the list, then from the bookmark (after the clean end and after the 503), then relisted at 20
    assert collection.watched_from == ["5", "8", "8", "20"]
    assert delays == [0.5, 0.5]  # after the failed list, after the 503 (the first watch had delivered events)
    assert reflector.stats.lists == 2 and reflector.stats.relists == 1
    assert reflector.stats.bad_events == 1 and reflector.stats.watch_errors == 2
    assert reflector.listed.is_set()


async def test_reflector_backs_off_when_watches_end_at_once_without_events() -> None:
    collection = ScriptedCollection(lists=[list_body(5)], watches=[[], [], []])
    reflector, _, delays = make_reflector(collection)
    await run_until_idle(reflector, collection)
    assert delays == [0.5, 1.0, 2.0]
    assert collection.watched_from == ["5", "5", "5", "5"]


async def test_http_gone_on_watch_relists() -> None:
    collection = ScriptedCollection(
        lists=[list_body(5, obj("a", 3)), list_body(9)], watches=[ApiStatusError(410, "Expired")]
    )
    reflector, seen, delays = make_reflector(collection)
    await run_until_idle(reflector, collection)
    assert seen == [("a@3", False), ("a@9", True)]
    assert delays == [] and collection.watched_from == ["5", "9"]


# --- publishing while the bus is away


class FlakyBus:
    """Fails every publish while `away`; records what it stored (last value per subject)."""

    def __init__(self) -> None:
        self.away = True
        self.attempts = 0
        self.stored: dict[str, bytes] = {}

    async def publish(self, subject: str, data: bytes, *, msg_id: str, options: object = None) -> PublishAck:
        self.attempts += 1
        if self.away:
            raise BusUnavailableError("no servers available")
        self.stored[subject] = data
        return PublishAck(stream="KOORD_CLUSTER", seq=len(self.stored))


async def test_latest_state_waits_for_the_bus_and_is_published_when_it_returns() -> None:
    collection = ScriptedCollection(
        lists=[list_body(5, obj("a", 3))],
        watches=[[line("MODIFIED", obj("a", 6)), line("MODIFIED", obj("a", 7)), line("ADDED", obj("b", 8))]],
    )
    bus = FlakyBus()
    delays: list[float] = []

    async def sleep(delay: float) -> None:
        delays.append(delay)
        await asyncio.sleep(0)

    observer = ClusterObserver(
        bus,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        K8sSettings(backoff_initial_seconds=0.01, backoff_max_seconds=0.04),
        collections={KIND_NODE: collection},
        sleep=sleep,
    )
    await observer.start()
    try:
        async with asyncio.timeout(5):
            await collection.idle.wait()
            while True:  # six failed attempts: the publisher keeps retrying with bounded backoff
                if observer.stats.publish_failures >= 6:
                    break
                await asyncio.sleep(0)
        assert observer.pending == 2 and not observer.ready.is_set()
        assert observer.stats.publish_failures >= 6
        assert max(delays) == 0.04
        bus.away = False
        assert await observer.wait_published(5)
        async with asyncio.timeout(5):
            await observer.ready.wait()
    finally:
        await observer.stop()
    latest = cluster.CLUSTER_EVENT_DECODER.decode(bus.stored[subjects.cluster_node("a")])
    assert isinstance(latest, cluster.NodeObserved) and latest.resource_version == "7"
    assert set(bus.stored) == {subjects.cluster_node("a"), subjects.cluster_node("b")}
    assert observer.stats.published == 2


def test_the_scheduling_fields_nodefit_reads_cross_the_bridge() -> None:
    """A Node's taints and unschedulable flag, a Pod's nodeSelector, required node affinity and tolerations reach
    the cluster stream (the descheduler's nodeFit and the arbiter's read them there)."""
    node = {
        **obj("node-a", 5),
        "spec": {"unschedulable": True, "taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]},
    }
    change = core.Change(key=("", "node-a"), seen=core.Seen("5"), raw=json.dumps(node).encode())
    decoded = cluster.CLUSTER_EVENT_DECODER.decode(observed_message(KIND_NODE, change, observed_at=1.0)[1])
    assert isinstance(decoded, cluster.NodeObserved) and decoded.node is not None
    assert decoded.node.spec.unschedulable
    assert [(t.key, t.value, t.effect) for t in decoded.node.spec.taints or ()] == [("gpu", "yes", "NoSchedule")]
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    pod = {
        "metadata": {"name": "web-1", "namespace": "default", "uid": "u1", "resourceVersion": "7"},
        "spec": {
            "nodeName": "node-a",
            "nodeSelector": {"disk": "ssd"},
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
            },
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
    change = core.Change(key=("default", "web-1"), seen=core.Seen("7"), raw=json.dumps(pod).encode())
    decoded = cluster.CLUSTER_EVENT_DECODER.decode(observed_message(KIND_POD, change, observed_at=1.0)[1])
    assert isinstance(decoded, cluster.PodObserved) and decoded.pod is not None
    spec = decoded.pod.spec
    assert spec.node_selector == {"disk": "ssd"}
    assert [(t.key, t.operator, t.effect) for t in spec.tolerations or ()] == [("gpu", "Exists", "NoSchedule")]
    required = spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution  # type: ignore[union-attr]
    assert required is not None and required.node_selector_terms is not None
    assert required.node_selector_terms[0].match_expressions[0].values == ["a"]  # type: ignore[index]
