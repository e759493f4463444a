"""NodeMetricsReported's columnar pod and container samples: consistent batches decode, inconsistent ones are
rejected on decode with a message that says what is wrong (the ingest then dead-letters them)."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest

from agent.simulate import SimulatedNode
from schemas.node import NODE_EVENT_DECODER, MetricCollectPolicy, NodeMetricsReported, encode_node_event
from services.nodemetric.window import NodeWindow


def wire(**changes: Any) -> dict[str, Any]:
    """A consistent batch as wire-ready builtins: two pods with two rows each, one container per pod."""
    batch: dict[str, Any] = {
        "type": "node.metrics_reported.v1",
        "node": "node-a",
        "window_start": 0.0,
        "window_end": 10.0,
        "sent_at": 10.0,
        "pods": [{"uid": "pod-a"}, {"uid": "pod-b"}],
        "pod_samples": {
            "pod": [0, 0, 1, 1],
            "t": [1.0, 2.0, 1.0, 2.0],
            "cpu": [0.5, 0.5, 1.0, 1.0],
            "memory": [10, 10, 20, 20],
            "memory_with_page_cache": [15, 15, 25, 25],
        },
        "containers": [{"pod": 0, "id": "c-a"}, {"pod": 1, "id": "c-b"}],
        "container_samples": {"container": [0, 1], "t": [1.0, 1.0], "cpu": [0.1, 0.2], "memory": [1, 2]},
    }
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        target = batch
        for key in parents:
            target = target[key]
        target[leaf] = value
    return batch


def decode(batch: dict[str, Any]) -> NodeMetricsReported:
    event = NODE_EVENT_DECODER.decode(msgspec.msgpack.encode(batch))
    assert isinstance(event, NodeMetricsReported)
    return event


def test_consistent_batch_round_trips() -> None:
    event = decode(wire())
    assert event.pod_samples.pod == [0, 0, 1, 1] and event.containers[1].pod == 1
    assert NODE_EVENT_DECODER.decode(encode_node_event(event)) == event


def test_page_cache_column_may_be_absent_and_pods_may_have_no_rows() -> None:
    event = decode(
        wire(**{"pod_samples.memory_with_page_cache": [], "pod_samples.pod": [1, 1, 1, 1]}, containers=[])
        | {"container_samples": {}}
    )
    assert event.pod_samples.memory_with_page_cache == [] and event.containers == []


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"pod_samples.cpu": [0.5, 0.5, 1.0]},
            "pod_samples: every column needs 4 rows, one per index entry, but `cpu` has 3 - at `$.pod_samples`",
        ),
        (
            {"pod_samples.t": [1.0], "pod_samples.memory": []},
            "pod_samples: every column needs 4 rows, one per index entry, but `t` has 1, `memory` has 0",
        ),
        (
            {"pod_samples.memory_with_page_cache": [15, 15]},
            "pod_samples: optional columns need 0 or 4 rows, but `memory_with_page_cache` has 2",
        ),
        (
            {"pod_samples.pod": [0, 1, 0, 1]},
            "pod_samples: rows must be grouped by pod in list order, but row 2 (pod 0) follows pod 1",
        ),
        ({"pod_samples.pod": [0, 0, 1, 2]}, "pod_samples: index 2 is out of range, the batch lists 2 pods"),
        ({"pod_samples.pod": [0, 0, 1, -1]}, "Expected `int` >= 0 - at `$.pod_samples.pod[3]`"),
        ({"pod_samples.cpu": [0.5, 0.5, 1.0, -1.0]}, "Expected `float` >= 0.0 - at `$.pod_samples.cpu[3]`"),
        ({"pod_samples.t": [1.0, 2.0, 1.0, -2.0]}, "Expected `float` >= 0.0 - at `$.pod_samples.t[3]`"),
        ({"pod_samples.memory": [10, 10, 20, -1]}, "Expected `int` >= 0 - at `$.pod_samples.memory[3]`"),
        ({"containers": [{"pod": 2, "id": "c-a"}]}, "containers: index 2 is out of range, the batch lists 2 pods"),
        (
            {"containers": [{"pod": 1, "id": "c-b"}, {"pod": 0, "id": "c-a"}]},
            "containers: rows must be grouped by pod in list order, but row 1 (pod 0) follows pod 1",
        ),
        (
            {"container_samples.container": [0, 2]},
            "container_samples: index 2 is out of range, the batch lists 2 containers",
        ),
        (
            {"container_samples.container": [1, 0]},
            "container_samples: rows must be grouped by container in list order, but row 1 (container 0) follows",
        ),
        (
            {"container_samples.memory": [1]},
            "container_samples: every column needs 2 rows, one per index entry, but `memory` has 1",
        ),
    ],
)
def test_inconsistent_batches_fail_decoding_with_a_clear_message(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(msgspec.ValidationError) as raised:
        decode(wire(**changes))
    assert message in str(raised.value)


def test_construction_checks_like_decoding() -> None:
    event = decode(wire())
    with pytest.raises(ValueError, match="index 1 is out of range, the batch lists 1 pods"):
        msgspec.structs.replace(event, pods=event.pods[:1])


def test_micro_numbers_decode_and_add_of_a_100_pod_batch() -> None:
    """Prints (does not assert) what the nodemetric ingest pays per batch for decode and NodeWindow.add."""
    node = SimulatedNode("sim-node-0001", 1, pods=100)
    payloads = [encode_node_event(node.batch(10.0 * k, 10.0 * k + 10)) for k in range(1, 201)]
    started = time.perf_counter()
    batches = [NODE_EVENT_DECODER.decode(p) for p in payloads]
    decoded = time.perf_counter()
    window = NodeWindow(MetricCollectPolicy())
    for batch in batches:
        assert isinstance(batch, NodeMetricsReported)
        window.add(batch)
    added = time.perf_counter()
    rows = sum(len(b.pod_samples.t) for b in batches if isinstance(b, NodeMetricsReported)) / len(batches)
    per_batch_us = 1e6 / len(batches)
    print(
        f"100-pod batch, {rows:.0f} pod rows, {sum(map(len, payloads)) / len(payloads) / 1000:.1f} kB: "
        f"decode {(decoded - started) * per_batch_us:.0f} us + add {(added - decoded) * per_batch_us:.0f} us"
    )
