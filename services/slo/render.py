"""NodeSLO rendering (spec §7.1): the parsed `slo-controller-config` (services.common.sloconfig) and a node's labels
and annotations in, the node's NodeSLO spec out, as Koordinator's manager (pkg/slo-controller/nodeslo) renders it.

Pure. Each strategy key lands in its spec field as the first node strategy whose selector matches the node's labels,
else the cluster strategy; `hostApplications` is the first matching `nodeConfigs` entry's list, else the top-level
one (absent when empty). The node annotation `node.koordinator.sh/network-bandwidth` overrides
`systemStrategy.totalNetworkBandwidth`; when it is not a quantity the spec has no `systemStrategy`. `extensions` is
always `{}` (no NodeSLO extender is registered). Used by services.slo.core (the service), services.slo.preview and
koordbus.calc_slo.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

from schemas import quantity
from services.common.sloconfig import STRATEGY_KEYS, HostApplicationConfig, SloConfig, StrategyConfig, first_match

ANNOTATION_NETWORK_BANDWIDTH: Final = "node.koordinator.sh/network-bandwidth"
HOST_APPLICATIONS_SPEC_FIELD: Final = "hostApplications"
EXTENSIONS_SPEC_FIELD: Final = "extensions"


def render_node_slo(config: SloConfig, labels: Mapping[str, str], annotations: Mapping[str, str]) -> dict[str, Any]:
    """The NodeSLO spec for a node with these labels and annotations (a fresh copy the caller may change)."""
    spec: dict[str, Any] = {}
    for key in STRATEGY_KEYS:
        spec[key.spec_field] = copy.deepcopy(dict(select_strategy(config.strategies[key.config_key], labels)))
    bandwidth = annotations.get(ANNOTATION_NETWORK_BANDWIDTH)
    if bandwidth is not None:
        try:
            spec["systemStrategy"]["totalNetworkBandwidth"] = quantity.int_value(quantity.parse_quantity(bandwidth))
        except quantity.QuantityError:
            del spec["systemStrategy"]  # Koordinator: getSystemConfigSpec fails, the spec goes without it
    spec[EXTENSIONS_SPEC_FIELD] = {}
    applications = select_host_applications(config.host_applications, labels)
    if applications:
        spec[HOST_APPLICATIONS_SPEC_FIELD] = copy.deepcopy([dict(app) for app in applications])
    return spec


def select_strategy(parsed: StrategyConfig, labels: Mapping[str, str]) -> Mapping[str, Any]:
    """The first node strategy whose selector matches the labels, else the cluster strategy (shared: do not change)."""
    index = first_match([node.node_selector for node in parsed.nodes], labels)
    return parsed.cluster if index is None else parsed.nodes[index].strategy


def select_host_applications(config: HostApplicationConfig, labels: Mapping[str, str]) -> tuple[Mapping[str, Any], ...]:
    """The first matching nodeConfigs entry's applications, else the top-level list (shared: do not change)."""
    index = first_match([node.node_selector for node in config.nodes], labels)
    return config.applications if index is None else config.nodes[index].applications
