"""services.slo.core.SloState: which nodes' NodeSLO specs change on node and ConfigMap events."""

from __future__ import annotations

import json

import msgspec

from schemas import kube
from schemas.cluster import ConfigMapObserved, NodeObserved
from services.common.sloconfig import CONFIGMAP_NAME, CONFIGMAP_NAMESPACE
from services.slo.core import SloState
from services.slo.render import ANNOTATION_NETWORK_BANDWIDTH

T0 = 1_700_000_000.0


def _node(name: str, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> NodeObserved:
    node = msgspec.convert(
        {"metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}}}, kube.Node
    )
    return NodeObserved(name=name, observed_at=T0, node=node)


def _configmap(data: dict[str, str], *, deleted: bool = False, name: str = CONFIGMAP_NAME) -> ConfigMapObserved:
    return ConfigMapObserved(namespace=CONFIGMAP_NAMESPACE, name=name, observed_at=T0, data=data, deleted=deleted)


THRESHOLD = json.dumps(
    {
        "clusterStrategy": {"enable": True},
        "nodeStrategies": [{"nodeSelector": {"matchLabels": {"pool": "batch"}}, "cpuSuppressThresholdPercent": 50}],
    }
)


def test_a_new_node_gets_the_defaults_and_a_replayed_event_changes_nothing() -> None:
    state = SloState()
    changed = state.apply(_node("n1"))
    assert list(changed) == ["n1"]
    assert changed["n1"] == state.spec("n1")
    assert changed["n1"] is not None and changed["n1"]["resourceUsedThresholdWithBE"]["enable"] is False
    assert state.apply(_node("n1")) == {}


def test_a_configmap_change_re_renders_every_node_but_returns_only_those_that_differ() -> None:
    state = SloState()
    state.apply(_node("online"))
    state.apply(_node("batch", {"pool": "batch"}))
    changed = state.apply(_configmap({"resource-threshold-config": THRESHOLD}))
    assert sorted(changed) == ["batch", "online"]
    batch = state.spec("batch")
    assert batch is not None and batch["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] == 50
    # Changing only the node-level entry touches only the node it selects.
    other = THRESHOLD.replace("50", "45")
    assert list(state.apply(_configmap({"resource-threshold-config": other}))) == ["batch"]


def test_a_node_relabel_or_annotation_only_re_renders_that_node() -> None:
    state = SloState()
    state.apply(_configmap({"resource-threshold-config": THRESHOLD}))
    state.apply(_node("a"))
    state.apply(_node("b"))
    assert list(state.apply(_node("a", {"pool": "batch"}))) == ["a"]
    changed = state.apply(_node("b", annotations={ANNOTATION_NETWORK_BANDWIDTH: "10G"}))
    assert changed["b"] is not None and changed["b"]["systemStrategy"]["totalNetworkBandwidth"] == 10**10


def test_a_deleted_node_is_returned_once_as_none() -> None:
    state = SloState()
    state.apply(_node("n1"))
    assert state.apply(NodeObserved(name="n1", observed_at=T0, deleted=True)) == {"n1": None}
    assert state.spec("n1") is None and state.nodes() == []
    assert state.apply(NodeObserved(name="n1", observed_at=T0, deleted=True)) == {}


def test_a_bad_key_keeps_the_last_good_value_and_a_deleted_configmap_restores_defaults() -> None:
    state = SloState()
    state.apply(_node("n1"))
    state.apply(_configmap({"resource-threshold-config": THRESHOLD}))
    assert state.apply(_configmap({"resource-threshold-config": "{broken"})) == {}
    assert "not JSON" in state.errors["resource-threshold-config"]
    spec = state.spec("n1")
    assert spec is not None and spec["resourceUsedThresholdWithBE"]["enable"] is True
    changed = state.apply(_configmap({}, deleted=True))
    assert changed["n1"] is not None and changed["n1"]["resourceUsedThresholdWithBE"]["enable"] is False
    assert not state.errors


def test_other_configmaps_are_ignored() -> None:
    state = SloState()
    state.apply(_node("n1"))
    assert state.apply(_configmap({"resource-threshold-config": THRESHOLD}, name="something-else")) == {}
