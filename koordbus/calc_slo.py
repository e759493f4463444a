"""`koordbus calc nodeslo` (../shared/design/CALC-CONTRACT.md, spec §7.1): one node's NodeSLO spec from the
`slo-controller-config` ConfigMap's data, as koord-manager renders it.

Registered in koordbus.calc.CALCULATORS; parses with services.common.sloconfig and renders with services.slo.render, as
the slo service does. The previous ConfigMap plays the manager's cache: it is parsed against the defaults, and a key of
`configMap` that fails to decode keeps its value from there. Besides `spec`, the output explains itself: which entry of
each key the node took, and every problem of a key in error (the JSON path inside that key's JSON and why).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from koordbus.calc_errors import InputError
from services.common import sloconfig
from services.slo import render


class NodeMeta(msgspec.Struct, frozen=True, kw_only=True):
    labels: dict[str, Any] | None = None
    annotations: dict[str, Any] | None = None


class NodeInput(msgspec.Struct, frozen=True, kw_only=True):
    """A Node: only its labels and annotations are read (everything else is ignored, unparsed)."""

    metadata: NodeMeta | None = None


class NodeSloInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    config_map: dict[str, Any] | None = None
    """The ConfigMap's `data`; null: there is no ConfigMap."""
    previous_config_map: dict[str, Any] | None = None
    """The ConfigMap the manager had processed before; absent or null: its initial cache, the defaults."""
    node: NodeInput


def nodeslo(inp: NodeSloInput) -> dict[str, Any]:
    data = _strings(inp.config_map, "$.configMap")
    previous_data = _strings(inp.previous_config_map, "$.previousConfigMap")
    metadata = inp.node.metadata or NodeMeta()
    labels = _strings(metadata.labels, "$.node.metadata.labels") or {}
    annotations = _strings(metadata.annotations, "$.node.metadata.annotations") or {}
    previous = sloconfig.parse_slo_config(previous_data) if previous_data is not None else None
    config = sloconfig.parse_slo_config(data, previous=previous)
    spec = render.render_node_slo(config, labels, annotations)
    return {"spec": spec, "explain": explain(config, labels, previous=previous)}


def explain(
    config: sloconfig.SloConfig, labels: dict[str, str], *, previous: sloconfig.SloConfig | None
) -> dict[str, Any]:
    """Per ConfigMap key: the entry the node took and, for a key in error, its problems (the value in use is then
    the previous one)."""
    keys: dict[str, Any] = {}
    for key in sloconfig.STRATEGY_KEYS:
        parsed = config.strategies[key.config_key]
        index = sloconfig.first_match([node.node_selector for node in parsed.nodes], labels)
        keys[key.config_key] = _entry("nodeStrategies", index, parsed.nodes[index].name if index is not None else "")
    hosts = config.host_applications.nodes
    index = sloconfig.first_match([node.node_selector for node in hosts], labels)
    keys[sloconfig.HOST_APPLICATION_KEY] = _entry("nodeConfigs", index, hosts[index].name if index is not None else "")
    for config_key, problems in config.problems.items():
        keys[config_key]["problems"] = [{"path": p.path, "reason": p.reason} for p in problems]
        keys[config_key]["inUse"] = "previous" if previous is not None else "default"
    out: dict[str, Any] = {"keys": keys}
    if previous is not None and previous.errors:
        out["previousConfigMapErrors"] = dict(previous.errors)
    return out


def _strings(mapping: Mapping[str, Any] | None, path: str) -> dict[str, str] | None:
    """A ConfigMap's data or a label map: every value a string (InputError naming the key otherwise)."""
    if mapping is None:
        return None
    for key, value in mapping.items():
        if not isinstance(value, str):
            where = f"{path}.{key}" if re.fullmatch(r"[A-Za-z0-9_./-]+", key) else f"{path}[{json.dumps(key)}]"
            raise InputError(f"{where}: expected a string, got {json.dumps(value)[:60]}")
    return dict(mapping)


def _entry(list_name: str, index: int | None, name: str) -> dict[str, Any]:
    if index is None:
        return {"selected": "clusterStrategy" if list_name == "nodeStrategies" else "applications"}
    return {"selected": f"{list_name}[{index}]", **({"name": name} if name else {})}
