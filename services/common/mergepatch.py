"""RFC 7386 JSON merge patch, applied: what `PATCH` with `application/merge-patch+json` does to an object. Pure.

Used by the quota service (services.quota.core: PatchQuota commands, whatever their intake) and the REST API's
ClusterColocationProfiles (services.webhook.profiles).
"""

from __future__ import annotations

from typing import Any


def merge_patch(target: Any, patch: Any) -> Any:
    """`patch` applied to `target`: objects merge member by member, `null` removes a member, anything else
    replaces (an array too)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out
