"""services.k8s.writes for NodeResourceTopologies: zone batch entries set, kept sorted, zeros for zones without a
value, nothing when already there; and the record-only recorder."""

from __future__ import annotations

from typing import Any

from schemas import vocab
from schemas.noderesource import NodeResourceComputed
from services.k8s import writes


def nrt(extra: list[dict[str, str]] | None = None) -> dict[str, Any]:
    cpu = {"name": "cpu", "capacity": "4", "allocatable": "4", "available": "4"}
    return {
        "metadata": {"name": "n1", "resourceVersion": "7"},
        "zones": [
            {"name": "node-0", "type": "Node", "resources": [cpu, *(extra or [])]},
            {"name": "node-1", "type": "Node", "resources": [cpu]},
        ],
    }


def entry(name: str, text: str) -> dict[str, str]:
    return {"name": name, "capacity": text, "allocatable": text, "available": text}


def test_zone_entries_are_set_sorted_and_zeroed_where_no_value_came() -> None:
    zones = {"node-0": {vocab.BATCH_CPU: 6_900, vocab.BATCH_MEMORY: 3 * 1024**3}}
    updated = writes.topology_with_batch_zones(nrt(), zones)
    assert updated is not None and updated["metadata"]["resourceVersion"] == "7"
    first, second = updated["zones"]
    assert [e["name"] for e in first["resources"]] == ["cpu", vocab.BATCH_CPU, vocab.BATCH_MEMORY]
    assert first["resources"][1] == entry(vocab.BATCH_CPU, "6900")
    assert first["resources"][2] == entry(vocab.BATCH_MEMORY, "3Gi")
    assert second["resources"][1:] == [entry(vocab.BATCH_CPU, "0"), entry(vocab.BATCH_MEMORY, "0")]
    assert writes.topology_with_batch_zones(updated, zones) is None  # already there: nothing to write


def test_an_equal_amount_written_differently_is_not_rewritten() -> None:
    held = nrt([entry(vocab.BATCH_CPU, "6900"), entry(vocab.BATCH_MEMORY, "3221225472")])
    held["zones"][1]["resources"] += [entry(vocab.BATCH_CPU, "0"), entry(vocab.BATCH_MEMORY, "0")]
    zones = {"node-0": {vocab.BATCH_CPU: 6_900, vocab.BATCH_MEMORY: 3 * 1024**3}}
    assert writes.topology_with_batch_zones(held, zones) is None


def test_the_recorder_keeps_the_zone_values_and_logs_only_changes() -> None:
    recorder = writes.WriteRecorder(keep=10)
    decision = NodeResourceComputed(
        node="n1",
        computed_at=1.0,
        trigger=("topology",),
        outcome="computed",
        resources={},
        annotations={},
        explanation={},
        write_due=True,
        write_reason="first write",
        zones={"node-0": {vocab.BATCH_CPU: 100, vocab.BATCH_MEMORY: 5}},
    )
    first = recorder.topology_zones(decision, now=1.0)
    assert first.action == "updated" and first.changes == (
        "zone node-0: kubernetes.io/batch-cpu 100, kubernetes.io/batch-memory 5",
    )
    assert recorder.topology_zones(decision, now=2.0).action == "unchanged"
    assert recorder.export()["topologies"] == {"n1": {"node-0": {vocab.BATCH_CPU: 100, vocab.BATCH_MEMORY: 5}}}
