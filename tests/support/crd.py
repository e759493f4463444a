"""Validate objects against Koordinator's CRD schemas read from ../shared (never copied into the repo).

The schema handling is the fake API server's (tests/fakes/kube_rules.py), so a test's "valid" means what the fake
accepts: fields a schema does not declare are errors (as the API server's pruning would drop them), int-or-string
and nullable are explicit, and int32/int64/date-time formats are checked. Skips the calling test loudly when
../shared is missing.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from tests.fakes import kube_rules

NODEMETRIC_CRD = "slo.koordinator.sh_nodemetrics.yaml"
TOPOLOGY_CRD = kube_rules.TOPOLOGY_CRD
TOPOLOGY_VERSION = "v1alpha1"
"""The NodeResourceTopology version koordlet and koordbus write (the CRD serves v1alpha2 too)."""


def crd_validator(filename: str, version: str | None = None) -> jsonschema.Draft7Validator:
    """A validator for a served version of one CRD (default: its storage version)."""
    path = kube_rules.CRD_DIR / filename
    if not path.is_file():
        pytest.skip(f"CRD not found at {path}: ../shared is missing next to the repository")
    return kube_rules.crd_validator(filename, version)


def crd_errors(validator: jsonschema.protocols.Validator, obj: dict[str, Any]) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]


def assert_valid_nodemetric(obj: dict[str, Any]) -> None:
    assert crd_errors(crd_validator(NODEMETRIC_CRD), obj) == []


def assert_valid_topology(obj: dict[str, Any]) -> None:
    """A NodeResourceTopology as the v1alpha1 schema takes it."""
    assert crd_errors(crd_validator(TOPOLOGY_CRD, TOPOLOGY_VERSION), obj) == []
