"""services.noderesource.cpu_normalization and its use by the noderesource state: the cpu-normalization-config key
and the node's CPU basic info → the node's cpu-normalization-ratio annotation, batch-cpu scaled by it, and the
node's metadata written when only the ratio changed (needSyncMeta)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from schemas import koordinator, kube, vocab
from schemas.cluster import ConfigMapObserved, NodeObserved, NodeTopologyObserved
from schemas.noderesource import NodeResourceComputed
from services.k8s import writes
from services.noderesource import config as colocation
from services.noderesource import cpu_normalization as cn
from services.noderesource.state import PROBLEM_CONFIG_ERROR, ClusterState
from tests.unit.test_noderesource_state import NODE, T0, metric_event, pod_event

RATIOS = {
    "baseRatio": 1.5,
    "hyperThreadEnabledRatio": 1.0,
    "turboEnabledRatio": 1.8,
    "hyperThreadTurboEnabledRatio": 1.2,
}
MODEL = "Intel(R) Xeon(R) Platinum 8269CY CPU @ 2.50GHz"


def basic_info(*, model: str = MODEL, ht: bool = False, turbo: bool = False) -> str:
    info: dict[str, Any] = {"cpuModel": model}
    if ht:
        info["hyperThreadEnabled"] = True
    if turbo:
        info["turboEnabled"] = True
    return json.dumps(info)


def config(**fields: Any) -> cn.CpuNormalizationConfig:
    return cn.parse_config(json.dumps(fields))


# --- the pure decision


@pytest.mark.parametrize(
    ("ht", "turbo", "expected"),
    [(False, False, "1.50"), (True, False, "1.00"), (False, True, "1.80"), (True, True, "1.20")],
)
def test_the_ratio_follows_hyper_threading_and_turbo(ht: bool, turbo: bool, expected: str) -> None:
    decided = cn.node_ratio(config(enable=True, ratioModel={MODEL: RATIOS}), {}, basic_info(ht=ht, turbo=turbo))
    assert decided.ratio == expected
    assert MODEL in decided.reason


def test_disabled_by_default_or_by_config_writes_the_neutral_ratio() -> None:
    assert cn.node_ratio(cn.parse_config(None), {}, basic_info()).ratio == "1.00"
    assert cn.node_ratio(config(ratioModel={MODEL: RATIOS}), {}, basic_info()).ratio == "1.00"
    assert cn.node_ratio(config(enable=False, ratioModel={MODEL: RATIOS}), {}, basic_info()).ratio == "1.00"


def test_the_node_label_overrides_the_strategy_and_a_bad_label_decides_nothing() -> None:
    enabled = config(enable=True, ratioModel={MODEL: RATIOS})
    disabled = config(enable=False, ratioModel={MODEL: RATIOS})
    assert cn.node_ratio(enabled, {cn.LABEL_ENABLED: "false"}, basic_info()).ratio == "1.00"
    assert cn.node_ratio(disabled, {cn.LABEL_ENABLED: "true"}, basic_info()).ratio == "1.50"
    assert cn.node_ratio(disabled, {cn.LABEL_ENABLED: "T"}, basic_info()).ratio == "1.50"  # Go's ParseBool
    bad = cn.node_ratio(enabled, {cn.LABEL_ENABLED: "yes"}, basic_info())
    assert bad.ratio is None and "not a boolean" in bad.reason


@pytest.mark.parametrize(
    ("cfg", "info", "why"),
    [
        (None, basic_info(), "not loaded"),
        ({"enable": True, "ratioModel": {MODEL: RATIOS}}, None, "no readable CPU basic info"),
        ({"enable": True, "ratioModel": {MODEL: RATIOS}}, "{not json", "no readable CPU basic info"),
        ({"enable": True, "ratioModel": {"other": RATIOS}}, basic_info(), "no ratioModel entry"),
        ({"enable": True, "ratioModel": {MODEL: {"baseRatio": 1.5}}}, basic_info(turbo=True), "no turboEnabledRatio"),
        ({"enable": True, "ratioModel": {MODEL: {"baseRatio": 0.9}}}, basic_info(), "outside [1.0, 5.0]"),
        ({"enable": True, "ratioModel": {MODEL: {"baseRatio": 5.5}}}, basic_info(), "outside [1.0, 5.0]"),
    ],
)
def test_anything_missing_leaves_the_annotation_alone_and_says_why(
    cfg: dict[str, Any] | None, info: str | None, why: str
) -> None:
    decided = cn.node_ratio(None if cfg is None else cn.parse_config(json.dumps(cfg)), {}, info)
    assert decided.ratio is None
    assert why in decided.reason


def test_node_configs_merge_over_the_cluster_strategy_per_model_and_the_first_match_wins() -> None:
    other = "AMD EPYC 7742 64-Core Processor"
    cfg = config(
        enable=True,
        ratioModel={MODEL: RATIOS, other: {"baseRatio": 2.0}},
        nodeConfigs=[
            {"name": "pool-a", "nodeSelector": {"matchLabels": {"pool": "a"}}, "ratioModel": {MODEL: {"baseRatio": 3}}},
            {"name": "off", "nodeSelector": {"matchLabels": {"pool": "a"}}, "enable": False},
            {"name": "pool-b", "nodeSelector": {"matchLabels": {"pool": "b"}}, "enable": False},
        ],
    )
    assert cn.node_ratio(cfg, {"pool": "a"}, basic_info()).ratio == "3.00"  # the entry's model replaces the cluster's
    assert cn.node_ratio(cfg, {"pool": "a"}, basic_info(model=other)).ratio == "2.00"  # others stay
    assert cn.node_ratio(cfg, {"pool": "b"}, basic_info()).ratio == "1.00"
    assert cn.node_ratio(cfg, {}, basic_info()).ratio == "1.50"


def test_a_key_that_does_not_decode_names_the_path() -> None:
    with pytest.raises(cn.CpuNormalizationConfigError, match=r"\$\.ratioModel"):
        cn.parse_config(json.dumps({"ratioModel": {MODEL: {"baseRatio": "high"}}}))
    with pytest.raises(cn.CpuNormalizationConfigError, match="not JSON"):
        cn.parse_config("{")


@pytest.mark.parametrize(
    ("current", "ratio", "differs"),
    [(None, "1.00", True), ("1.00", "1.00", False), ("1.005", "1.00", False), ("1.50", "1.51", True),
     ("abc", "1.00", True), ("-1", "1.00", True), ("1.50", None, False)],
)  # fmt: skip
def test_the_annotation_is_rewritten_when_absent_unreadable_or_moved_by_a_hundredth(
    current: str | None, ratio: str | None, differs: bool
) -> None:
    annotations = {} if current is None else {koordinator.ANNOTATION_CPU_NORMALIZATION_RATIO: current}
    assert cn.annotation_differs(annotations, ratio) is differs


# --- through the noderesource state


def _configmap(data: dict[str, Any], *, rv: str) -> ConfigMapObserved:
    return ConfigMapObserved(
        namespace=colocation.CONFIGMAP_NAMESPACE,
        name=colocation.CONFIGMAP_NAME,
        observed_at=T0,
        resource_version=rv,
        data={key: json.dumps(value) for key, value in data.items()},
    )


def _node(*, rv: str, annotations: dict[str, str] | None = None) -> NodeObserved:
    node = msgspec.convert(
        {
            "metadata": {"name": NODE, "annotations": annotations or {}},
            "status": {"capacity": {"cpu": "100", "memory": "400Gi"}, "allocatable": {"cpu": "98", "memory": "392Gi"}},
        },
        kube.Node,
    )
    return NodeObserved(name=NODE, observed_at=T0, resource_version=rv, node=node)


def _topology(info: str, *, rv: str) -> NodeTopologyObserved:
    return NodeTopologyObserved(name=NODE, observed_at=T0, resource_version=rv, zones=[], cpu_basic_info=info)


def _state(normalization: dict[str, Any]) -> ClusterState:
    state = ClusterState()
    state.apply(_configmap({colocation.COLOCATION_CONFIG_KEY: {"enable": True}, cn.CONFIG_KEY: normalization}, rv="1"))
    for event in (_node(rv="1"), pod_event("a", "40", "100Gi"), pod_event("b", "20", "40Gi"), metric_event()):
        state.apply(event)
    return state


def _decide(state: ClusterState) -> NodeResourceComputed:
    decision = state.decide(NODE, now=T0, last_written=None)
    assert decision is not None
    return decision


def test_the_state_scales_batch_cpu_by_the_decided_ratio_and_writes_the_annotation() -> None:
    state = _state({"enable": True, "ratioModel": {MODEL: RATIOS}})
    before = _decide(state)  # no NodeResourceTopology yet: nothing decided, nothing written
    assert koordinator.ANNOTATION_CPU_NORMALIZATION_RATIO not in before.annotations
    assert not before.meta_due and "no readable CPU basic info" in before.cpu_normalization
    assert state.apply(_topology(basic_info(turbo=True), rv="1")) == {NODE}
    after = _decide(state)
    assert after.annotations[koordinator.ANNOTATION_CPU_NORMALIZATION_RATIO] == "1.80"
    assert after.meta_due and "turboEnabledRatio" in after.cpu_normalization
    unscaled = before.resources[vocab.BATCH_CPU]
    assert unscaled is not None and after.resources[vocab.BATCH_CPU] == -(-int(unscaled * 1000 * 1.8) // 1000)
    assert any("cpu-normalization-ratio 1.8" in step for step in after.prepare_steps[vocab.BATCH_CPU])
    # the same basic info again changes nothing; the node carrying the annotation ends the metadata write
    assert state.apply(_topology(basic_info(turbo=True), rv="2")) == set()
    state.apply(_node(rv="2", annotations={koordinator.ANNOTATION_CPU_NORMALIZATION_RATIO: "1.80"}))
    assert not _decide(state).meta_due


def test_a_ratio_change_alone_makes_the_node_write_due_for_its_metadata_only() -> None:
    state = _state({"enable": True, "ratioModel": {MODEL: RATIOS}})
    state.apply(_topology(basic_info(), rv="1"))
    decision = msgspec.structs.replace(_decide(state), write_due=False)
    assert decision.meta_due and decision.node_write_due
    node = {"metadata": {"name": NODE, "annotations": {}}, "status": {}}
    assert writes.node_status_patch(node, decision) is None
    patch = writes.node_annotation_patch(node, decision)
    assert patch is not None
    assert patch.patch["metadata"]["annotations"][koordinator.ANNOTATION_CPU_NORMALIZATION_RATIO] == "1.50"


def test_a_bad_key_keeps_the_previous_configuration_with_a_warning() -> None:
    state = _state({"enable": True, "ratioModel": {MODEL: RATIOS}})
    state.apply(_topology(basic_info(), rv="1"))
    assert _decide(state).annotations[koordinator.ANNOTATION_CPU_NORMALIZATION_RATIO] == "1.50"
    bad = {colocation.COLOCATION_CONFIG_KEY: {"enable": True}, cn.CONFIG_KEY: {"enable": "sometimes"}}
    assert state.apply(_configmap(bad, rv="2")) == set()
    assert PROBLEM_CONFIG_ERROR in state.problems
    decision = _decide(state)
    assert decision.annotations[koordinator.ANNOTATION_CPU_NORMALIZATION_RATIO] == "1.50"
    assert any(cn.CONFIG_KEY in warning and "$.enable" in warning for warning in decision.warnings)
    # turning it off everywhere re-decides every node: the neutral ratio
    off = {colocation.COLOCATION_CONFIG_KEY: {"enable": True}, cn.CONFIG_KEY: {"enable": False}}
    assert state.apply(_configmap(off, rv="3")) == {NODE}
    assert _decide(state).annotations[koordinator.ANNOTATION_CPU_NORMALIZATION_RATIO] == "1.00"
