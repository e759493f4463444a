"""Koordinator's MergeCfg on decoded JSON: the overlay both the NodeSLO renderer and the agent's SLO merge use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def overlay(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`patch` over `base`: objects merge by key, `null` and empty lists are absent, anything else replaces.

    This is Go's json.Marshal(patch) (omitempty drops nil and empty) unmarshalled into a copy of base.
    """
    merged = dict(base)
    for name, value in patch.items():
        if value is None or value == []:
            continue
        current = merged.get(name)
        if isinstance(value, Mapping) and isinstance(current, Mapping):
            merged[name] = overlay(current, value)
        else:
            merged[name] = value
    return merged
