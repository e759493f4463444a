"""The NodeSLO controller's state (spec §7.1): cluster events in, the NodeSLO specs to publish out.

Pure. `SloState.apply` folds a NodeObserved or the `slo-controller-config` ConfigMapObserved and returns what
changed: for each affected node its new rendered spec, or None when the node is gone (its NodeSLO is deleted). A
ConfigMap change re-renders every node, a node change only that node; a spec equal to the last one returned for the
node is not returned again, so replaying the cluster stream after a restart publishes nothing new. A ConfigMap key
in error keeps its last good value (services.common.sloconfig); `errors` says which and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from schemas.cluster import ConfigMapObserved, NodeObserved
from services.common.sloconfig import CONFIGMAP_NAME, CONFIGMAP_NAMESPACE, SloConfig, parse_slo_config
from services.slo.render import render_node_slo


class NodeFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What of a node the rendering reads."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]


class SloState:
    """The config in effect, the nodes, and the spec last returned per node."""

    def __init__(self, *, configmap_namespace: str = CONFIGMAP_NAMESPACE, configmap_name: str = CONFIGMAP_NAME):
        self._configmap = (configmap_namespace, configmap_name)
        self.config: SloConfig = parse_slo_config({})
        self._nodes: dict[str, NodeFacts] = {}
        self._rendered: dict[str, dict[str, Any]] = {}

    @property
    def errors(self) -> Mapping[str, str]:
        """ConfigMap key → why its last good value (or the default) is in use."""
        return self.config.errors

    def spec(self, node: str) -> dict[str, Any] | None:
        """The node's current NodeSLO spec; None for a node we have not seen."""
        return self._rendered.get(node)

    def nodes(self) -> list[str]:
        return sorted(self._nodes)

    def apply(self, event: NodeObserved | ConfigMapObserved) -> dict[str, dict[str, Any] | None]:
        """Fold one event; returns node → new spec (None = delete) for the nodes whose NodeSLO changed."""
        if isinstance(event, ConfigMapObserved):
            if (event.namespace, event.name) != self._configmap:
                return {}
            self.config = parse_slo_config({} if event.deleted else event.data, previous=self.config)
            return self._render(list(self._nodes))
        if event.deleted or event.node is None:
            self._nodes.pop(event.name, None)
            return {event.name: None} if self._rendered.pop(event.name, None) is not None else {}
        metadata = event.node.metadata
        self._nodes[event.name] = NodeFacts(labels=dict(metadata.labels), annotations=dict(metadata.annotations))
        return self._render([event.name])

    def _render(self, names: list[str]) -> dict[str, dict[str, Any] | None]:
        changed: dict[str, dict[str, Any] | None] = {}
        for name in names:
            facts = self._nodes[name]
            spec = render_node_slo(self.config, facts.labels, facts.annotations)
            if self._rendered.get(name) != spec:
                self._rendered[name] = spec
                changed[name] = spec
        return changed
