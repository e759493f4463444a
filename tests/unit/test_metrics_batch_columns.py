"""NodeMetricsReported's columnar pod and container samples: consistent batches decode, inconsistent ones are
rejected on decode with a message that says what is wrong (the ingest then dead-letters them)."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest

from schemas.node import (
    NODE_EVENT_DECODER,
    NodeMetricsReported,
    PodRef,
    PodSampleColumns,
    encode_node_event,
    pod_list_digest,
)

_DTYPES = {"pod": "<u2", "container": "<u2", "t": "<f8", "cpu": "<f8", "memory": "<i8", "memory_with_page_cache": "<i8"}


def _binary(columns: dict[str, Any]) -> dict[str, Any]:
    """List-valued columns packed the way producers send them; bytes are left as given (to send bad ones)."""
    return {k: v if isinstance(v, bytes) else np.asarray(v).astype(_DTYPES[k]).tobytes() for k, v in columns.items()}


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
    for table in ("pod_samples", "container_samples"):
        batch[table] = _binary(batch[table])
    return batch


def decode(batch: dict[str, Any]) -> NodeMetricsReported:
    event = NODE_EVENT_DECODER.decode(msgspec.msgpack.encode(batch))
    assert isinstance(event, NodeMetricsReported)
    return event


def test_consistent_batch_round_trips() -> None:
    event = decode(wire())
    rows = event.pod_samples.arrays()
    assert rows.index.tolist() == [0, 0, 1, 1] and rows.memory_with_page_cache.tolist() == [15, 15, 25, 25]
    assert rows.rows()[2] == (1, 1.0, 1.0, 20) and event.containers[1].pod == 1
    assert NODE_EVENT_DECODER.decode(encode_node_event(event)) == event


def test_columns_built_from_sequences_equal_the_decoded_ones() -> None:
    built = PodSampleColumns.of(
        pod=[0, 0, 1, 1], t=[1.0, 2.0, 1.0, 2.0], cpu=[0.5, 0.5, 1.0, 1.0], memory=[10, 10, 20, 20],
        memory_with_page_cache=[15, 15, 25, 25],
    )  # fmt: skip
    assert built == decode(wire()).pod_samples and len(built) == 4


def test_page_cache_column_may_be_absent_and_pods_may_have_no_rows() -> None:
    event = decode(
        wire(**{"pod_samples.memory_with_page_cache": [], "pod_samples.pod": [1, 1, 1, 1]}, containers=[])
        | {"container_samples": {}}
    )
    assert event.pod_samples.arrays().memory_with_page_cache.size == 0 and event.containers == []


def test_a_batch_may_name_its_pod_list_by_digest_instead_of_listing_it() -> None:
    event = decode(wire(pods=[], pods_digest=pod_list_digest([PodRef(uid="pod-a"), PodRef(uid="pod-b")])))
    assert event.pods == [] and len(event.pod_samples) == 4
    with pytest.raises(msgspec.ValidationError, match="index 1 is out of range, the batch lists 0 pods"):
        decode(wire(pods=[]))  # no list and no digest: the rows belong to nobody


def test_pod_list_digest_is_stable_and_tells_lists_apart() -> None:
    a, b = PodRef(uid="pod-a", labels={"x": "1"}), PodRef(uid="pod-b")
    assert pod_list_digest([a, b]) == pod_list_digest([PodRef(uid="pod-a", labels={"x": "1"}), b]) > 0
    assert len({pod_list_digest(pods) for pods in ([a, b], [b, a], [a], [b], [])}) == 5


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"pod_samples.cpu": [0.5, 0.5, 1.0]},
            "pod_samples: every column needs 4 rows, one per `pod` entry, but `cpu` has 3 - at `$.pod_samples`",
        ),
        (
            {"pod_samples.t": [1.0], "pod_samples.memory": []},
            "pod_samples: every column needs 4 rows, one per `pod` entry, but `t` has 1",
        ),
        (
            {"pod_samples.memory_with_page_cache": [15, 15]},
            "pod_samples: `memory_with_page_cache` is optional but then needs 4 rows, it has 2",
        ),
        (
            {"pod_samples.pod": [0, 1, 0, 1]},
            "pod_samples: rows must be grouped by pod in list order, but row 2 (pod 0) follows pod 1",
        ),
        ({"pod_samples.pod": [0, 0, 1, 2]}, "pod_samples: index 2 is out of range, the batch lists 2 pods"),
        (
            {"pod_samples.pod": b"\x00\x00\x00"},
            "pod_samples: `pod` holds 3 bytes, not a whole number of 2-byte values",
        ),
        ({"pod_samples.cpu": [0.5, 0.5, 1.0, -1.0]}, "pod_samples: `cpu` row 3 is -1.0, outside [0, 100000]"),
        ({"pod_samples.cpu": [0.5, float("nan"), 1.0, 1.0]}, "pod_samples: `cpu` row 1 is nan, outside"),
        ({"pod_samples.t": [1.0, 2.0, 1.0, -2.0]}, "pod_samples: `t` row 3 is -2.0, outside [0, 4.10244e+09]"),
        ({"pod_samples.memory": [10, 10, 20, -1]}, "pod_samples: `memory` row 3 is -1, outside [0, 9.0072e+15]"),
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
            "container_samples: every column needs 2 rows, one per `container` entry, but `memory` has 1",
        ),
    ],
)
def test_inconsistent_batches_fail_decoding_with_a_clear_message(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(msgspec.ValidationError) as raised:
        decode(wire(**changes))
    assert message in str(raised.value)


def test_building_checks_nothing_until_check_or_decoding() -> None:
    """Producers (the agent) build batches without numpy; the checks run at the trust boundary, when decoding."""
    event = decode(wire())
    broken = msgspec.structs.replace(event, pods=event.pods[:1])  # building does not check
    with pytest.raises(ValueError, match="index 1 is out of range, the batch lists 1 pods"):
        broken.check()
    with pytest.raises(msgspec.ValidationError, match="index 1 is out of range, the batch lists 1 pods"):
        NODE_EVENT_DECODER.decode(encode_node_event(broken))


def test_columns_pack_with_the_standard_library_and_refuse_values_that_do_not_fit() -> None:
    columns = PodSampleColumns.of(pod=[0, 1], t=[1.5, 2.5], cpu=[0.25, 1.0], memory=[7, 2**40])
    assert columns.pod == np.asarray([0, 1], "<u2").tobytes()
    assert columns.memory == np.asarray([7, 2**40], "<i8").tobytes()
    with pytest.raises(ValueError, match="does not fit a <u2 column"):
        PodSampleColumns.of(pod=[70_000], t=[1.0], cpu=[0.0], memory=[0])


# --- host applications


def _app(name: str = "nginx", **changes: Any) -> dict[str, Any]:
    app: dict[str, Any] = {
        "name": name,
        "samples": [[1.0, 0.5, 100], [2.0, 0.25, 120]],
        "memory_with_page_cache": [150, 170],
        "priority": "koord-prod",
        "qos": "LS",
    }
    return app | changes


def test_host_applications_round_trip_and_are_optional() -> None:
    event = decode(wire(host_applications=[_app(), _app("sshd", memory_with_page_cache=[], priority="", qos="")]))
    nginx, sshd = event.host_applications
    assert (nginx.name, nginx.priority, nginx.qos, nginx.samples[1]) == ("nginx", "koord-prod", "LS", (2.0, 0.25, 120))
    assert sshd.memory_with_page_cache == [] and sshd.priority == ""
    assert NODE_EVENT_DECODER.decode(encode_node_event(event)) == event
    assert decode(wire()).host_applications == []  # batches from before host applications decode as before


@pytest.mark.parametrize(
    ("apps", "message"),
    [
        ([_app("../etc")], "host_applications[0].name"),
        ([_app("a/b")], "host_applications[0].name"),
        ([_app("")], "host_applications[0].name"),
        ([_app("x" * 129)], "host_applications[0].name"),
        ([_app(priority="koord-root")], "at `$.host_applications[0].priority`"),
        ([_app(qos="Guaranteed")], "at `$.host_applications[0].qos`"),
        ([_app(samples=[[1.0, -0.5, 100]])], "at `$.host_applications[0].samples[0][1]`"),
        ([_app(samples=[[1.0, 0.5, -1]], memory_with_page_cache=[])], "at `$.host_applications[0].samples[0][2]`"),
        ([_app(samples=[])], "at `$.host_applications[0].samples`"),
        ([_app(memory_with_page_cache=[-1, 0])], "at `$.host_applications[0].memory_with_page_cache[0]`"),
        (
            [_app(), _app("b", memory_with_page_cache=[1])],
            "host application 'b': `memory_with_page_cache` is optional but then needs 2 values, one per sample, "
            "it has 1 - at `$.host_applications[1]`",
        ),
        (
            [_app("a"), _app("b"), _app("a")],
            "host_applications: 'a' appears twice (entries 0 and 2) - at `$.host_applications[2]`",
        ),
        ([_app(f"app-{i}") for i in range(65)], "at `$.host_applications`"),
    ],
)
def test_bad_host_applications_fail_decoding_naming_the_field(apps: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(msgspec.ValidationError) as raised:
        decode(wire(host_applications=apps))
    assert message in str(raised.value)


def test_the_wire_classes_are_koordinators() -> None:
    from typing import get_args

    from schemas import node, vocab

    assert set(get_args(node.PriorityClassName)) == {vocab.PRIORITY_NONE, *vocab.PRIORITY_RANGES}
    assert set(get_args(node.QoSClassName)) == {vocab.QOS_NONE, *vocab.KOORD_QOS_CLASSES}
