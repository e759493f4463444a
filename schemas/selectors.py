"""Kubernetes LabelSelectors: the struct and its matching, as the API server defines them. Pure.

Used by the colocation config's nodeConfigs (services.noderesource.config), ElasticQuotaProfiles' node selectors
(schemas.quota, services.quota.profiles) and anything else that picks nodes or objects by labels.
`selector_problems` says why Kubernetes would refuse a selector (`node_profile_problems` adds the slo-controller-config
webhook's rule for a per-node entry's); `selector_matches` applies one (an absent or
invalid selector matches nothing, an empty one everything).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

import msgspec


class LabelSelectorRequirement(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    key: str = ""
    operator: str = ""
    values: tuple[str, ...] | None = None


class LabelSelector(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """A Kubernetes LabelSelector; an empty one matches every node (an absent one matches none)."""

    match_labels: dict[str, str] | None = None
    match_expressions: tuple[LabelSelectorRequirement, ...] | None = None


_LABEL_NAME: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_OPERATORS: Final = ("In", "NotIn", "Exists", "DoesNotExist")


def _label_key_ok(key: str) -> bool:
    """A qualified name: `name` or `dns.prefix/name`, name ≤ 63 characters, prefix ≤ 253 (Kubernetes' rules)."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or _DNS_SUBDOMAIN.fullmatch(prefix) is None):
        return False
    return len(name) <= 63 and _LABEL_NAME.fullmatch(name) is not None


def _label_value_ok(value: str) -> bool:
    return value == "" or (len(value) <= 63 and _LABEL_NAME.fullmatch(value) is not None)


def selector_problems(selector: LabelSelector | None) -> list[str]:
    """Why Kubernetes would refuse to build this selector (Koordinator then skips the entry); [] when usable."""
    if selector is None:
        return ["absent, so the entry matches no node"]
    problems = [
        f"matchLabels {key}={value!r}: invalid label"
        for key, value in (selector.match_labels or {}).items()
        if not (_label_key_ok(key) and _label_value_ok(value))
    ]
    for index, req in enumerate(selector.match_expressions or ()):
        where = f"matchExpressions[{index}]"
        values = req.values or ()
        if req.operator not in _OPERATORS:
            problems.append(f"{where}: operator {req.operator!r} is not one of {', '.join(_OPERATORS)}")
        elif req.operator in ("In", "NotIn") and not values:
            problems.append(f"{where}: operator {req.operator} needs values")
        elif req.operator in ("Exists", "DoesNotExist") and values:
            problems.append(f"{where}: operator {req.operator} takes no values")
        if not _label_key_ok(req.key):
            problems.append(f"{where}: invalid label key {req.key!r}")
        problems += [f"{where}: invalid label value {value!r}" for value in values if not _label_value_ok(value)]
    return problems


def node_profile_problems(selector: LabelSelector | None) -> list[str]:
    """Koordinator's webhook rule for a nodeStrategies / nodeConfigs entry of the slo-controller-config: a nodeSelector
    that is present, not empty and one Kubernetes can build; [] when it is."""
    if selector is None:
        return ["required: an entry without a nodeSelector matches no node"]
    if not selector.match_labels and not selector.match_expressions:
        return ["must not be empty (it would match every node: set the cluster strategy instead)"]
    return selector_problems(selector)


def selector_matches(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes LabelSelector semantics; an absent or invalid selector matches nothing, an empty one everything."""
    if selector is None or selector_problems(selector):
        return False
    if any(labels.get(key) != value for key, value in (selector.match_labels or {}).items()):
        return False
    for req in selector.match_expressions or ():
        present, value = req.key in labels, labels.get(req.key)
        matched = {
            "In": present and value in (req.values or ()),
            "NotIn": not present or value not in (req.values or ()),
            "Exists": present,
            "DoesNotExist": not present,
        }[req.operator]
        if not matched:
            return False
    return True
