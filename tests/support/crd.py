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


def crd_validator(filename: str) -> jsonschema.Draft7Validator:
    """A validator for the served version of one CRD."""
    path = kube_rules.CRD_DIR / filename
    if not path.is_file():
        pytest.skip(f"CRD not found at {path}: ../shared is missing next to the repository")
    return kube_rules.crd_validator(filename)


def crd_errors(validator: jsonschema.protocols.Validator, obj: dict[str, Any]) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]


def assert_valid_nodemetric(obj: dict[str, Any]) -> None:
    assert crd_errors(crd_validator(NODEMETRIC_CRD), obj) == []
