"""Validate objects against Koordinator's CRD schemas read from ../shared (never copied into the repo).

The schemas are made strict the way the API server's pruning makes them: fields a schema does
not declare are errors, and `x-kubernetes-int-or-string` becomes an explicit integer-or-string.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

CRD_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "koordinator-crds"
NODEMETRIC_CRD = "slo.koordinator.sh_nodemetrics.yaml"


def _strict(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if out.get("x-kubernetes-int-or-string") and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_validator(filename: str, version: str = "v1alpha1") -> jsonschema.protocols.Validator:
    """A validator for one CRD version; skips the calling test loudly when ../shared is missing."""
    path = CRD_DIR / filename
    if not path.is_file():
        pytest.skip(f"CRD not found at {path}: ../shared is missing next to the repository")
    crd = yaml.safe_load(path.read_text())
    served = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    return jsonschema.Draft7Validator(_strict(served["schema"]["openAPIV3Schema"]))


def crd_errors(validator: jsonschema.protocols.Validator, obj: dict[str, Any]) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(obj)]


def assert_valid_nodemetric(obj: dict[str, Any]) -> None:
    assert crd_errors(crd_validator(NODEMETRIC_CRD), obj) == []
