"""The event catalogue: each type's keys come out of the events our services really publish (encoded from our own
schemas), filters and cursors parse or fail with a clear message, envelopes are JSON."""

from __future__ import annotations

import datetime as dt
import json

import msgspec
import pytest

from bus import streams, subjects
from schemas import kube
from schemas.migration import ObjectReference, PodMigrationJob, PodMigrationJobSpec
from schemas.migration_events import JobDecision, MigrationRequested, MigrationRound
from schemas.qos import PodEvictionRequested
from schemas.quota import ElasticQuota
from schemas.quota_events import QuotaCreated, QuotasImported
from schemas.quota_service import QuotaStatusComputed
from services.api import event_catalogue as catalogue

NOW = dt.datetime(2026, 11, 24, tzinfo=dt.UTC)


def keys_of(type_name: str, subject: str, event: object) -> dict[str, tuple[str, ...]]:
    event_type = catalogue.BY_NAME[type_name]
    assert catalogue.classify(event_type.stream, subject, catalogue.CATALOGUE) is event_type
    return {k: v for k, v in event_type.extract(subject, msgspec.json.encode(event)).items() if v}


def quota(name: str, namespace: str = "team-a") -> ElasticQuota:
    return ElasticQuota(metadata=kube.ObjectMeta(name=name, namespace=namespace))


def test_keys_come_from_the_events_as_published() -> None:
    created = QuotaCreated(actor="a", time=NOW, command_id="c", quota=quota("q1"))
    assert keys_of("quota.event", subjects.quota_events("tree-a"), created) == {
        "tree": ("tree-a",), "quota": ("q1",), "namespace": ("team-a",),
    }  # fmt: skip
    imported = QuotasImported(actor="a", time=NOW, command_id="c", quotas=[quota("q1"), quota("q2", "team-b")])
    assert keys_of("quota.event", subjects.quota_events("t"), imported)["quota"] == ("q1", "q2")
    status = QuotaStatusComputed(quota="q1", tree="t", computed_at=1.0, events_seq=3, object=quota("q1"))
    assert keys_of("quota.status", subjects.quota_status("q1"), status) == {
        "quota": ("q1",), "tree": ("t",), "namespace": ("team-a",),
    }  # fmt: skip
    job = PodMigrationJob(
        metadata=kube.ObjectMeta(name="m1"),
        spec=PodMigrationJobSpec(pod_ref=ObjectReference(namespace="web", name="web-1")),
    )
    requested = MigrationRequested(time=NOW, job=job, source="api")
    assert keys_of("migration.event", subjects.MIGRATION_REQUESTS, requested) == {"namespace": ("web",)}
    decided = MigrationRound(
        time=NOW,
        round=4,
        decisions=[
            JobDecision(job="m1", outcome="passed", node="n1", workload="rs-1"),
            JobDecision(job="m2", outcome="failed", node="n2", workload="rs-1"),
        ],
    )
    assert keys_of("migration.event", subjects.MIGRATION_ARBITER, decided) == {
        "node": ("n1", "n2"), "workload": ("rs-1",),
    }  # fmt: skip
    eviction = PodEvictionRequested(
        node="n.1", at=1.0, namespace="batch", name="p", uid="u", feature="BECPUEvict", reason="r"
    )
    stored = subjects.node_eviction("n.1") + ".3"  # KOORD_NODE appends the node's partition
    assert keys_of("node.eviction", stored, eviction) == {"node": ("n.1",), "namespace": ("batch",)}
    assert keys_of("node.lifecycle", subjects.cluster_node("n.1"), {"name": "n.1"}) == {"node": ("n.1",)}
    assert keys_of("noderesource.computed", subjects.noderesource_computed("n.1"), {}) == {"node": ("n.1",)}
    assert catalogue.classify(streams.KOORD_NODERESOURCE, subjects.NODERESOURCE_CONFIG_STATUS, catalogue.CATALOGUE)
    assert catalogue.classify(streams.KOORD_NODE, subjects.node_metrics("n1") + ".0", catalogue.CATALOGUE) is None


def test_filters_narrow_to_the_types_that_carry_the_keys() -> None:
    everything = catalogue.parse_filter([], {})
    assert everything.types == catalogue.CATALOGUE
    by_node = catalogue.parse_filter([], {"node": "n1", "quota": None})
    assert {t.name for t in by_node.types} == {
        "nodemetric.computed", "noderesource.computed", "migration.event", "node.actuation", "node.eviction",
        "node.lifecycle",
    }  # fmt: skip
    assert by_node.matches({"node": ("n0", "n1")}) and not by_node.matches({"node": ("n2",)})
    # where a subject names the node, a catch-up or history page reads only that node's subjects
    assert by_node.subjects_of(streams.KOORD_NODEMETRIC) == ("koord.v1.nodemetric.n1.computed.*",)
    assert by_node.subjects_of(streams.KOORD_NODE) == (
        "koord.v1.node.n1.actuation.*", "koord.v1.node.n1.eviction.*",
    )  # fmt: skip
    assert by_node.subjects_of(streams.KOORD_MIGRATION) == (subjects.MIGRATION_ALL,)  # the node is in the data
    assert not by_node.matches({})
    chosen = catalogue.parse_filter(["quota.status,quota.tree", "quota.status"], {})
    assert [t.name for t in chosen.types] == ["quota.status", "quota.tree"]
    assert chosen.streams == (streams.KOORD_QUOTA_STATUS,)
    with pytest.raises(catalogue.FilterError, match="unknown event type"):
        catalogue.parse_filter(["quota.stat"], {})
    with pytest.raises(catalogue.FilterError, match="unknown filter"):
        catalogue.parse_filter([], {"pod": "x"})
    with pytest.raises(catalogue.FilterError, match=r"quota\.tree carries tree"):
        catalogue.parse_filter(["quota.tree"], {"node": "n1"})


def test_cursors_round_trip_and_reject_garbage() -> None:
    positions = {streams.KOORD_QUOTA: 7, streams.KOORD_NODEMETRIC: 120, streams.KOORD_NODERESOURCE: 4411}
    text = catalogue.encode_cursor(positions)
    assert text == "1-m120-q7-r4411"
    assert catalogue.decode_cursor(text) == positions
    assert catalogue.decode_cursor("1") == {}
    for bad in ("", "2-m1", "1-m", "1-z5", "1-m1-r-2", "m1"):
        with pytest.raises(catalogue.FilterError, match="malformed cursor"):
            catalogue.decode_cursor(bad)


def test_envelopes_are_json_with_the_data_as_published() -> None:
    event_type = catalogue.BY_NAME["node.eviction"]
    body = catalogue.envelope_body(
        event_type,
        stream=streams.KOORD_NODE,
        seq=9,
        time=1795491300.5,
        keys={"node": ("n1",), "namespace": ("a", "b")},
        data=b'{"reason":"memory"}',
    )
    document = json.loads(catalogue.envelope("1-n9", body))
    assert document == {
        "id": "1-n9", "type": "node.eviction", "time": 1795491300.5, "stream": streams.KOORD_NODE, "seq": 9,
        "node": "n1", "quota": None, "tree": None, "namespace": None, "workload": None, "data": {"reason": "memory"},
    }  # fmt: skip
