"""What a proposed `slo-controller-config` would do (`koordbus slo preview`): each node's NodeSLO spec rendered from
it, the changes against the spec the node's NodeSLO holds now, the keys in error with every problem by JSON path,
and the node entries Koordinator would skip. Pure.

The parsing and rendering are services.common.sloconfig's and services.slo.render's, fed as the slo service feeds it:
the ConfigMap in effect now is the previous config, so a key in error keeps the value the nodes already have. Nodes
whose rendered spec, current spec and chosen entries are all the same form one outcome. Without nodes, the preview lists
each key's strategies per node-selector group instead: the cluster strategy and every node entry as merged. Called by
koordbus.slo.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from schemas import quantity
from schemas.selectors import selector_problems
from services.common import sloconfig
from services.slo import render


class NodeFacts(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    labels: Mapping[str, str] = {}
    annotations: Mapping[str, str] = {}
    current: Mapping[str, Any] | None = None
    """The spec of the node's NodeSLO now; None: the node has none yet."""


class Change(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    path: str
    """Dotted path in the NodeSLO spec."""
    change: Literal["added", "removed", "changed"]
    before: Any = None
    after: Any = None


class Outcome(msgspec.Struct, frozen=True, kw_only=True):
    nodes: tuple[str, ...]
    entries: Mapping[str, str]
    """ConfigMap key → the entry these nodes take ("clusterStrategy", "nodeStrategies[1] (gpu)", ...)."""
    spec: Mapping[str, Any]
    current: Mapping[str, Any] | None
    changes: tuple[Change, ...]
    """Empty when the NodeSLO would not change; None current: the NodeSLO would be created."""


class KeyProblem(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    """The ConfigMap key, e.g. resource-threshold-config."""
    path: str
    """The JSON path inside that key's JSON."""
    reason: str


class SelectorGroup(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """One strategy of one key as merged: the cluster strategy, or a node entry with its selector."""

    key: str
    entry: str
    node_selector: Any = None
    strategy: Any = None
    skipped: str = ""
    """Why Koordinator would never pick this entry ("" when it can)."""


class Preview(msgspec.Struct, frozen=True, kw_only=True):
    errors: tuple[KeyProblem, ...]
    warnings: tuple[str, ...]
    outcomes: tuple[Outcome, ...]
    groups: tuple[SelectorGroup, ...]
    """Only without nodes."""


def preview(
    proposed: Mapping[str, str] | None, *, in_effect: Mapping[str, str] | None, nodes: Sequence[NodeFacts] | None
) -> Preview:
    """`proposed` (a ConfigMap's data) rendered for `nodes` (None: per node-selector group), with the ConfigMap
    `in_effect` now (None: none) as the last good values."""
    previous = sloconfig.parse_slo_config(in_effect) if in_effect is not None else None
    config = sloconfig.parse_slo_config(proposed, previous=previous)
    errors = tuple(
        KeyProblem(key=key, path=problem.path, reason=problem.reason)
        for key, problems in config.problems.items()
        for problem in problems
    )
    warnings = tuple(f"{group.key} {group.entry}: {group.skipped}" for group in _groups(config) if group.skipped)
    if nodes is None:
        return Preview(errors=errors, warnings=warnings, outcomes=(), groups=_groups(config))
    return Preview(errors=errors, warnings=warnings, outcomes=_outcomes(config, nodes), groups=())


def _groups(config: sloconfig.SloConfig) -> tuple[SelectorGroup, ...]:
    groups: list[SelectorGroup] = []
    for key in sloconfig.STRATEGY_KEYS:
        if key.config_key in config.errors:
            continue
        parsed = config.strategies[key.config_key]
        groups.append(SelectorGroup(key=key.config_key, entry="clusterStrategy", strategy=parsed.cluster))
        for index, node in enumerate(parsed.nodes):
            groups.append(
                _group(key.config_key, f"nodeStrategies[{index}]", node.name, node.node_selector, node.strategy)
            )
    if sloconfig.HOST_APPLICATION_KEY not in config.errors:
        hosts = config.host_applications
        groups.append(
            SelectorGroup(key=sloconfig.HOST_APPLICATION_KEY, entry="applications", strategy=hosts.applications)
        )
        for index, entry in enumerate(hosts.nodes):
            groups.append(
                _group(
                    sloconfig.HOST_APPLICATION_KEY,
                    f"nodeConfigs[{index}]",
                    entry.name,
                    entry.node_selector,
                    entry.applications,
                )
            )
    return tuple(groups)


def _group(key: str, entry: str, name: str, selector: Any, strategy: Any) -> SelectorGroup:
    problems = selector_problems(selector)
    skipped = ""
    if selector is None:
        skipped = "no nodeSelector, so it matches no node (Koordinator's webhook refuses such an entry)"
    elif problems:
        skipped = f"its nodeSelector is invalid, so Koordinator skips it: {'; '.join(problems)}"
    return SelectorGroup(
        key=key,
        entry=_named(entry, name),
        node_selector=None if selector is None else msgspec.to_builtins(selector),
        strategy=strategy,
        skipped=skipped,
    )


def _named(entry: str, name: str) -> str:
    return f"{entry} ({name})" if name else entry


def _entries(config: sloconfig.SloConfig, labels: Mapping[str, str]) -> dict[str, str]:
    taken: dict[str, str] = {}
    for key in sloconfig.STRATEGY_KEYS:
        nodes = config.strategies[key.config_key].nodes
        index = sloconfig.first_match([node.node_selector for node in nodes], labels)
        taken[key.config_key] = (
            "clusterStrategy" if index is None else _named(f"nodeStrategies[{index}]", nodes[index].name)
        )
    hosts = config.host_applications.nodes
    index = sloconfig.first_match([entry.node_selector for entry in hosts], labels)
    taken[sloconfig.HOST_APPLICATION_KEY] = (
        "applications" if index is None else _named(f"nodeConfigs[{index}]", hosts[index].name)
    )
    return taken


def _outcomes(config: sloconfig.SloConfig, nodes: Sequence[NodeFacts]) -> tuple[Outcome, ...]:
    grouped: dict[str, list[tuple[str, dict[str, str], dict[str, Any], Mapping[str, Any] | None]]] = {}
    for node in nodes:
        spec = render.render_node_slo(config, node.labels, node.annotations)
        entries = _entries(config, node.labels)
        current = None if node.current is None else normalized(node.current)
        same = json.dumps([spec, current, entries], sort_keys=True, default=str)
        grouped.setdefault(same, []).append((node.name, entries, spec, current))
    outcomes = []
    for members in grouped.values():
        _, first_entries, first_spec, first_current = members[0]
        outcomes.append(
            Outcome(
                nodes=tuple(sorted(name for name, *_ in members)),
                entries=first_entries,
                spec=first_spec,
                current=first_current,
                changes=tuple(diff(first_current, first_spec)) if first_current is not None else (),
            )
        )
    return tuple(sorted(outcomes, key=lambda outcome: outcome.nodes[0]))


def normalized(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A NodeSLO spec as the renderer writes it: a bandwidth quantity string ("10G", as Koordinator writes it) as
    its integer Value()."""
    out = dict(spec)
    system = out.get("systemStrategy")
    if isinstance(system, Mapping) and isinstance(system.get("totalNetworkBandwidth"), str):
        try:
            value = quantity.int_value(quantity.parse_quantity(system["totalNetworkBandwidth"]))
        except quantity.QuantityError:
            return out
        out["systemStrategy"] = {**system, "totalNetworkBandwidth": value}
    return out


def diff(before: Any, after: Any, path: str = "") -> list[Change]:
    """Leaf-level changes from `before` to `after`: objects are compared key by key, anything else as a whole."""
    if isinstance(before, Mapping) and isinstance(after, Mapping):
        changes: list[Change] = []
        for key in [*after, *(key for key in before if key not in after)]:
            where = f"{path}.{key}" if path else str(key)
            if key not in before:
                changes.append(Change(path=where, change="added", after=after[key]))
            elif key not in after:
                changes.append(Change(path=where, change="removed", before=before[key]))
            else:
                changes += diff(before[key], after[key], where)
        return changes
    if before == after and type(before) is type(after):
        return []
    return [Change(path=path or "$", change="changed", before=before, after=after)]
