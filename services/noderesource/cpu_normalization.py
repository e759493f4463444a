"""CPU normalization (Koordinator's cpunormalization noderesource plugin): the `cpu-normalization-config` key of
`slo-controller-config` and the node's CPU model → the node's `node.koordinator.sh/cpu-normalization-ratio`.

The key holds a cluster strategy `{enable, ratioModel: {<cpuModel>: {baseRatio, hyperThreadEnabledRatio,
turboEnabledRatio, hyperThreadTurboEnabledRatio}}}` and `nodeConfigs: [{name, nodeSelector, enable, ratioModel}]`;
each node entry is the cluster strategy with the entry's fields laid over it as Go's JSON decoding does (a model
named in the entry replaces the cluster's ratios for that model, the others stay). The first entry whose selector
matches the node's labels is its strategy; none matching, the cluster's. An absent key is the default: disabled.
A key that does not decode keeps the previous configuration (as Koordinator does), with the error to show.

`node_ratio` decides one node: the label `node.koordinator.sh/cpu-normalization-enabled` ("true"/"false", Go's
ParseBool) overrides the strategy's `enable`; disabled → "1.00" (the ratio that changes nothing). Enabled, the ratio
is the model's entry for the node's hyper-threading/turbo state (the CPU basic info the node's agent reports on its
NodeResourceTopology, `node.koordinator.sh/cpu-basic-info`), which must lie in [1, 5], written with two decimals.
Anything missing (config not loaded, no basic info, an unknown model, a missing ratio, one out of range, an
unreadable label) decides nothing: the node keeps the annotation it has, and `reason` says why. `config_problems` is
what the webhook refuses in the key (the composition root hands it to services.webhook). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

import msgspec

from schemas.koordinator import (
    ANNOTATION_CPU_NORMALIZATION_RATIO,
    LABEL_CPU_NORMALIZATION_ENABLED,
    parse_cpu_normalization_ratio,
)
from schemas.selectors import LabelSelector, node_profile_problems, selector_matches

CONFIG_KEY: Final = "cpu-normalization-config"
LABEL_ENABLED: Final = LABEL_CPU_NORMALIZATION_ENABLED
DEFAULT_RATIO: Final = "1.00"
MIN_RATIO: Final = 1.0
MAX_RATIO: Final = 5.0
RATIO_DIFF_EPSILON: Final = 0.01
_GO_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE: Final = frozenset({"0", "f", "F", "FALSE", "false", "False"})


class CpuNormalizationConfigError(ValueError):
    """The key does not decode; the message names the JSON path."""


class ModelRatio(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    base_ratio: float | None = None
    hyper_thread_enabled_ratio: float | None = None
    turbo_enabled_ratio: float | None = None
    hyper_thread_turbo_enabled_ratio: float | None = None


class Strategy(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    enable: bool | None = None
    ratio_model: dict[str, ModelRatio] | None = None


class NodeStrategy(Strategy, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    name: str = ""
    node_selector: LabelSelector | None = None


class _ConfigJSON(Strategy, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    node_configs: list[NodeStrategy] | None = None


class CpuNormalizationConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The merged configuration: the cluster strategy and each node entry already merged over it."""

    cluster: Strategy = Strategy(enable=False, ratio_model={})
    nodes: tuple[NodeStrategy, ...] = ()


class CpuBasicInfo(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The annotation's fields the ratio depends on (Go's CPUBasicInfo; its other fields are ignored)."""

    cpu_model: str = ""
    hyper_thread_enabled: bool = False
    turbo_enabled: bool = False


class RatioDecision(msgspec.Struct, frozen=True, kw_only=True):
    """`ratio`: the annotation value to write ("1.00" when disabled); None: leave the node's annotation as it is."""

    ratio: str | None
    reason: str


def _merge(cluster: Strategy, entry: Strategy) -> Strategy:
    models = dict(cluster.ratio_model or {})
    models.update(entry.ratio_model or {})
    return Strategy(enable=cluster.enable if entry.enable is None else entry.enable, ratio_model=models)


def parse_config(text: str | None) -> CpuNormalizationConfig:
    """The key's JSON text, merged; None (the key is absent) is the default, disabled."""
    if text is None:
        return CpuNormalizationConfig()
    try:
        raw = msgspec.json.decode(text, type=_ConfigJSON)
    except msgspec.ValidationError as err:
        raise CpuNormalizationConfigError(str(err)) from None
    except msgspec.DecodeError as err:
        raise CpuNormalizationConfigError(f"not JSON: {err} - at `$`") from None
    cluster = _merge(CpuNormalizationConfig().cluster, raw)
    nodes = []
    for entry in raw.node_configs or ():
        merged = _merge(cluster, entry)
        nodes.append(
            NodeStrategy(
                name=entry.name, node_selector=entry.node_selector, enable=merged.enable, ratio_model=merged.ratio_model
            )
        )
    return CpuNormalizationConfig(cluster=cluster, nodes=tuple(nodes))


def config_problems(text: str) -> list[tuple[str, str]]:
    """(JSON path, reason) for what the key's readers refuse: a document that does not decode, a ratio outside
    [MIN_RATIO, MAX_RATIO] (which node_ratio would never write), a nodeConfigs entry without a usable nodeSelector
    (Koordinator's webhook rule). [] when the key is good."""
    try:
        raw = msgspec.json.decode(text, type=_ConfigJSON)
    except msgspec.ValidationError as err:
        reason, _, path = str(err).rpartition(" - at `")
        return [(path.rstrip("`"), reason[:1].lower() + reason[1:].replace("`", ""))] if reason else [("$", str(err))]
    except msgspec.DecodeError as err:
        return [("$", f"not JSON: {err}")]
    problems: list[tuple[str, str]] = []
    for prefix, strategy in (("$", raw), *((f"$.nodeConfigs[{i}]", e) for i, e in enumerate(raw.node_configs or ()))):
        for model, ratios in (strategy.ratio_model or {}).items():
            for field in msgspec.structs.fields(ModelRatio):
                ratio = getattr(ratios, field.name)
                if ratio is not None and not (math.isfinite(ratio) and MIN_RATIO <= ratio <= MAX_RATIO):
                    where = f"{prefix}.ratioModel[{msgspec.json.encode(model).decode()}].{field.encode_name}"
                    problems.append((where, f"must be between {MIN_RATIO:g} and {MAX_RATIO:g}, got {ratio!r}"))
    for index, entry in enumerate(raw.node_configs or ()):
        reasons = node_profile_problems(entry.node_selector)
        problems += [(f"$.nodeConfigs[{index}].nodeSelector", reason) for reason in reasons]
    return problems


def node_strategy(config: CpuNormalizationConfig, labels: Mapping[str, str]) -> Strategy:
    for entry in config.nodes:
        if selector_matches(entry.node_selector, labels):
            return entry
    return config.cluster


def parse_basic_info(text: str | None) -> CpuBasicInfo | None:
    """The `cpu-basic-info` annotation (ANNOTATION_CPU_BASIC_INFO); None when absent or unreadable."""
    if not text:
        return None
    try:
        return msgspec.json.decode(text, type=CpuBasicInfo)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _model_ratio(info: CpuBasicInfo, ratios: ModelRatio) -> tuple[float | None, str]:
    if info.hyper_thread_enabled and info.turbo_enabled:
        return ratios.hyper_thread_turbo_enabled_ratio, "hyperThreadTurboEnabledRatio"
    if info.hyper_thread_enabled:
        return ratios.hyper_thread_enabled_ratio, "hyperThreadEnabledRatio"
    if info.turbo_enabled:
        return ratios.turbo_enabled_ratio, "turboEnabledRatio"
    return ratios.base_ratio, "baseRatio"


def node_ratio(
    config: CpuNormalizationConfig | None, labels: Mapping[str, str], basic_info: str | None
) -> RatioDecision:
    """The node's ratio annotation (see the module docstring); `config` None: the key was never loaded."""
    if config is None:
        return RatioDecision(ratio=None, reason=f"{CONFIG_KEY} not loaded")
    label = labels.get(LABEL_ENABLED)
    if label is not None and label not in _GO_TRUE and label not in _GO_FALSE:
        return RatioDecision(ratio=None, reason=f"label {LABEL_ENABLED}={label!r} is not a boolean")
    strategy = node_strategy(config, labels)
    if label is not None:
        enabled, source = label in _GO_TRUE, f"label {LABEL_ENABLED}={label}"
    else:
        enabled, source = bool(strategy.enable), f"{CONFIG_KEY} enable: {'true' if strategy.enable else 'false'}"
    if not enabled:
        return RatioDecision(ratio=DEFAULT_RATIO, reason=f"disabled ({source})")
    info = parse_basic_info(basic_info)
    if info is None:
        return RatioDecision(ratio=None, reason="no readable CPU basic info on the node's NodeResourceTopology")
    ratios = (strategy.ratio_model or {}).get(info.cpu_model)
    if ratios is None:
        return RatioDecision(ratio=None, reason=f"no ratioModel entry for CPU model {info.cpu_model!r}")
    ratio, field = _model_ratio(info, ratios)
    if ratio is None:
        return RatioDecision(ratio=None, reason=f"ratioModel[{info.cpu_model!r}] has no {field}")
    if not math.isfinite(ratio) or not MIN_RATIO <= ratio <= MAX_RATIO:
        return RatioDecision(ratio=None, reason=f"{field} {ratio} is outside [{MIN_RATIO}, {MAX_RATIO}]")
    return RatioDecision(ratio=f"{ratio:.2f}", reason=f"{field} of {info.cpu_model!r} ({source})")


def annotation_differs(annotations: Mapping[str, str], ratio: str | None) -> bool:
    """Koordinator's needSyncMeta for the ratio: whether writing `ratio` changes the node's annotation — it is
    absent or unreadable (not a number > 0), or differs by at least 0.01. `ratio` None writes nothing."""
    if ratio is None:
        return False
    current = parse_cpu_normalization_ratio(annotations.get(ANNOTATION_CPU_NORMALIZATION_RATIO))
    if current is None or current <= 0:
        return True
    return abs(float(ratio) - current) >= RATIO_DIFF_EPSILON
