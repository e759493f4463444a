"""The admission check of spec §3.8 (koord-scheduler's ElasticQuota PreFilter): does a pod fit its quota? Pure.

Used by the quota API (`POST /api/v1/quotas/check`), `koordbus quota check` and bench/quota.py. `check_pod`
resolves the pod's quota (services.quota.pods.QuotaIndex, §3.4) and compares against the QuotaTree:

1. the limit is the quota's runtime (its max when `enable_runtime_quota` is off); the pod's request is masked to
   the keys of the quota's max; it fits when used + request ≤ limit on every key the limit has (keys the limit
   lacks are not checked — and, as in Koordinator, a key already over its limit fails any pod);
2. a non-preemptible pod (label preemptible=false) must also keep non-preemptible used + request ≤ spec.min;
3. with `enable_check_parent_quota`, every ancestor below the root must keep used + request ≤ its runtime on the
   pod's request keys.

A pod that resolves to no quota (only with DisableDefaultQuota) fits; a parent quota refuses pods unless
`support_parent_quota_submit_pod`; a detached quota (unknown parent or a cycle) refuses them, having no runtime.
`check_pods` checks a list in order as the scheduler would admit it: each pod that fits is reserved (its request
added to used along its quota's path) before the next is checked; the tree itself is never changed. Every verdict
says why, with the numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Final, Literal

import msgspec

from schemas import kube, quota, resources
from services.quota.pods import QuotaIndex, is_non_preemptible, pod_load
from services.quota.runtime import ROOT, QuotaTree


class CheckOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The scheduler arguments and feature gates the check depends on (Koordinator's defaults)."""

    enable_runtime_quota: bool = True
    enable_check_parent_quota: bool = False
    support_parent_quota_submit_pod: bool = False
    disable_default_quota: bool = False
    ignore_overhead: bool = False


DEFAULT_OPTIONS: Final = CheckOptions()


VerdictCode = Literal["fits", "no-quota", "parent-quota", "detached", "over-limit", "over-min", "over-parent-runtime"]
"""A verdict's kind, for counting: the pod fits, no quota applies, the quota is a parent or detached, or (the first
check that failed) the request exceeds the quota's runtime or max, its min for non-preemptible pods, or an
ancestor's runtime."""


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """One pod's answer: the quota it resolved to, whether it fits, and each reason it does not."""

    pod: str
    """`namespace/name`."""
    quota: str | None
    fits: bool
    reasons: tuple[str, ...] = ()
    request: resources.ResourceList = {}
    """The pod's request masked to the quota's max keys (what was checked)."""
    limit: resources.ResourceList = {}
    """The quota's runtime (or max) it was checked against."""
    used: resources.ResourceList = {}
    """The quota's used before this pod (including pods admitted earlier in the same check)."""
    code: VerdictCode = "fits"
    """What decided the verdict (the first failed check when several failed)."""


TreeLookup = QuotaTree | Callable[[str], QuotaTree]
"""One tree, or the tree a quota name belongs to (the quota service holds one tree per tree id)."""


def _tree(trees: TreeLookup, name: str) -> QuotaTree:
    return trees if isinstance(trees, QuotaTree) else trees(name)


def check_pod(
    trees: TreeLookup,
    index: QuotaIndex,
    pod: kube.Pod,
    *,
    options: CheckOptions = DEFAULT_OPTIONS,
    reserved: Mapping[str, Mapping[str, int]] | None = None,
) -> Verdict:
    """The verdict for one pod; `reserved` adds per-quota used on top of the tree's (pods admitted just before)."""
    key = kube.pod_key(pod)
    name = index.resolve_pod(pod, disable_default_quota=options.disable_default_quota)
    tree = None if name is None else _tree(trees, name)
    if name is None or tree is None or name not in tree:
        return Verdict(pod=key, quota=None, fits=True, reasons=("no quota: the check does not apply",), code="no-quota")
    spec = tree.spec(name)
    if spec.is_parent and not options.support_parent_quota_submit_pod:
        reason = f"quota {name} is a parent quota (is-parent=true): pods cannot be placed in it"
        return Verdict(pod=key, quota=name, fits=False, reasons=(reason,), code="parent-quota")
    ancestors = tree.ancestors(name)
    if ancestors is None and name != ROOT:
        reason = f"quota {name} is detached (parent {spec.parent!r} unknown or a cycle): it has no runtime"
        return Verdict(pod=key, quota=name, fits=False, reasons=(reason,), code="detached")
    extra = reserved or {}
    request = resources.mask(pod_load(pod, ignore_overhead=options.ignore_overhead).request, spec.max.keys())
    limit = tree.runtime(name) if options.enable_runtime_quota else dict(spec.max)
    used = resources.add(tree.used(name), extra.get(name, {}))
    limit_name = "runtime" if options.enable_runtime_quota else "max"
    reasons = _exceeds(name, used, request, limit, limit_name, keys=None)
    code: VerdictCode = "over-limit" if reasons else "fits"
    if is_non_preemptible(pod):
        np_used = resources.add(tree.non_preemptible_used(name), extra.get(_np(name), {}))
        reasons += _exceeds(name, np_used, request, spec.min, "min (non-preemptible pods)", keys=None)
        code = "over-min" if reasons and code == "fits" else code
    if options.enable_check_parent_quota:
        for ancestor in ancestors or ():
            if ancestor == ROOT:
                break
            ancestor_used = resources.add(tree.used(ancestor), extra.get(ancestor, {}))
            runtime = tree.runtime(ancestor)
            reasons += _exceeds(ancestor, ancestor_used, request, runtime, "runtime (parent check)", keys=request)
            code = "over-parent-runtime" if reasons and code == "fits" else code
    return Verdict(
        pod=key,
        quota=name,
        fits=not reasons,
        reasons=tuple(reasons),
        request=request,
        limit=limit,
        used=used,
        code=code,
    )


def check_pods(
    trees: TreeLookup, index: QuotaIndex, pods: Iterable[kube.Pod], *, options: CheckOptions = DEFAULT_OPTIONS
) -> list[Verdict]:
    """Verdicts in order, each fitting pod reserved (request added to used on its path) before the next."""
    reserved: dict[str, resources.ResourceList] = {}
    verdicts: list[Verdict] = []
    for pod in pods:
        verdict = check_pod(trees, index, pod, options=options, reserved=reserved)
        verdicts.append(verdict)
        if not verdict.fits or verdict.quota is None:
            continue
        for name in (verdict.quota, *(_tree(trees, verdict.quota).ancestors(verdict.quota) or ())):
            reserved[name] = resources.add(reserved.get(name, {}), verdict.request)
        if is_non_preemptible(pod):
            reserved[_np(verdict.quota)] = resources.add(reserved.get(_np(verdict.quota), {}), verdict.request)
    return verdicts


def _np(name: str) -> str:
    """The `reserved` key of a quota's non-preemptible used (a name no quota can have)."""
    return f"{name}\x00non-preemptible"


def _exceeds(
    name: str,
    used: Mapping[str, int],
    request: Mapping[str, int],
    limit: Mapping[str, int],
    limit_name: str,
    *,
    keys: Mapping[str, int] | None,
) -> list[str]:
    """Koordinator's `leq(used + request, limit)`: every key of the sum that the limit has (only `keys`' keys when
    given) must stay within it; one plain-words reason per key that does not."""
    total = resources.add(used, request)
    out: list[str] = []
    for resource in sorted(total if keys is None else keys):
        if resource not in limit or total.get(resource, 0) <= limit[resource]:
            continue
        show = _formatter(resource)
        out.append(
            f"insufficient quota {name}: {resource} used {show(used.get(resource, 0))} + request "
            f"{show(request.get(resource, 0))} = {show(total.get(resource, 0))} exceeds {limit_name} "
            f"{show(limit[resource])}"
        )
    return out


def _formatter(resource: str) -> Callable[[int], str]:
    return lambda amount: quota.format_quota_amount(resource, amount)
