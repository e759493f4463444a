"""`koordbus calc quota-runtime` (../shared/design/CALC-CONTRACT.md, spec §3.5–3.7): the runtime of every quota of
one tree from the quotas, the cluster total, the pods and extra requests.

Registered in koordbus.calc.CALCULATORS; runs the same pure tree the quota service runs (services.quota.runtime,
services.quota.pods).
"""

from __future__ import annotations

from typing import Any

import msgspec

from koordbus.calc_errors import InputError
from schemas import kube, quantity
from schemas import quota as quota_schema
from services.quota import pods as quota_pods
from services.quota import runtime as quota_runtime


class QuotaRuntimeInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    total: kube.RawResourceList
    quotas: list[quota_schema.ElasticQuota] = []
    pods: list[kube.Pod] = []
    requests: dict[str, kube.RawResourceList] = {}
    enable_min_quota_scale: bool = True


def runtimes(inp: QuotaRuntimeInput) -> dict[str, Any]:
    """One tree (MultiQuotaTree off, tree-id labels ignored): `total` is the cluster total, from which the used of
    the system and default quotas is taken before the root distributes it; pods resolve to quotas as in §3.4."""
    total = _input_resources(inp.total, "$.total")
    specs: list[quota_schema.QuotaSpec] = []
    seen: set[str] = set()
    for i, obj in enumerate(inp.quotas):
        try:
            spec = quota_schema.quota_spec(obj)
        except quota_schema.QuotaFormatError as err:
            raise InputError(f"$.quotas[{i}].{err.field}: quota {err.quota}: {err.problem}") from None
        if spec.name in seen:
            raise InputError(f"$.quotas[{i}].metadata.name: quota {spec.name!r} appears twice")
        seen.add(spec.name)
        specs.append(spec)
    tree = quota_runtime.QuotaTree(total, enable_min_quota_scale=inp.enable_min_quota_scale)
    for spec in specs:
        tree.set_quota(spec)
    loads: dict[str, quota_pods.QuotaLoad] = {}
    placed: dict[str, str | None] = {}
    index = quota_pods.QuotaIndex.build(specs)
    for pod in inp.pods:
        name = index.resolve_pod(pod)
        placed[kube.pod_key(pod)] = name
        if name is not None:
            loads[name] = loads.get(name, quota_pods.EMPTY_LOAD).plus(quota_pods.pod_load(pod))
    for name, raw in inp.requests.items():
        if name not in tree:
            raise InputError(f"$.requests.{name}: no quota named {name!r} in $.quotas")
        extra = quota_pods.QuotaLoad(request=_input_resources(raw, f"$.requests.{name}"))
        loads[name] = loads.get(name, quota_pods.EMPTY_LOAD).plus(extra)
    for name, load in loads.items():
        tree.set_load(name, load)
    states = tree.states()
    shown = [quota_schema.ROOT_QUOTA, *(s.name for s in specs), *(n for n in loads if n not in seen)]
    out: dict[str, Any] = {}
    explain: dict[str, Any] = {}
    for name in dict.fromkeys(shown):
        state = states[name]
        out[name] = {
            "runtime": state.runtime,
            "request": state.request,
            "used": state.used,
            "childRequest": state.child_request,
            "limitedRequest": state.limited_request,
            "scaledMin": state.scaled_min,
            "nonPreemptibleRequest": state.non_preemptible_request,
            "nonPreemptibleUsed": state.non_preemptible_used,
            "parent": state.parent,
            "attached": state.attached,
        }
        explain[name] = msgspec.to_builtins(tree.explain(name))
    return {
        "quotas": out,
        "explain": {"total": total, "rootTotal": tree.root_total(), "pods": placed, "quotas": explain},
    }


def _input_resources(raw: kube.RawResourceList, path: str) -> dict[str, int]:
    try:
        return quantity.resource_list(raw)
    except quantity.QuantityError as err:
        raise InputError(f"{path}.{err}") from None
