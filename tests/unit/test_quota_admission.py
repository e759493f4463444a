"""The admission check (spec §3.8): fit against runtime, max without runtime quota, the non-preemptible cap at min,
the optional parent check, parent and detached quotas, no-quota pods, and sequential reservation in check_pods."""

from __future__ import annotations

import msgspec

from schemas import kube
from schemas import quota as q
from services.quota import admission
from services.quota.pods import QuotaIndex, QuotaLoad
from services.quota.runtime import QuotaTree

ROOT = q.ROOT_QUOTA


def spec(name: str, minimum: int, maximum: int, *, parent: str = ROOT, is_parent: bool = False) -> q.QuotaSpec:
    return q.QuotaSpec(
        name=name,
        namespace="teams",
        parent=parent,
        is_parent=is_parent,
        min={"cpu": minimum},
        max={"cpu": maximum},
        shared_weight={"cpu": maximum},
    )


def pod(name: str, cpu: str, *, quota: str = "a", preemptible: bool = True, node: str = "") -> kube.Pod:
    labels = {q.LABEL_QUOTA_NAME: quota} if quota else {}
    if not preemptible:
        labels[q.LABEL_PREEMPTIBLE] = "false"
    return msgspec.convert(
        {
            "metadata": {"name": name, "namespace": "apps", "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Pending"},
        },
        kube.Pod,
    )


def tree() -> QuotaTree:
    """Total 10 cores. team (parent, min 8, max 10) holds a (min 4, max 6) and b (min 4, max 6); a uses 3 cores and
    asks 5, b asks 4: a's runtime is 5 cores (request), b's 4."""
    t = QuotaTree({"cpu": 10_000})
    t.set_quota(spec("team", 8_000, 10_000, is_parent=True))
    t.set_quota(spec("a", 4_000, 6_000, parent="team"))
    t.set_quota(spec("b", 4_000, 6_000, parent="team"))
    t.set_load("a", QuotaLoad(request={"cpu": 5_000}, used={"cpu": 3_000}, non_preemptible_used={"cpu": 3_000}))
    t.set_load("b", QuotaLoad(request={"cpu": 4_000}, used={"cpu": 4_000}))
    return t


def check(p: kube.Pod, t: QuotaTree | None = None, **options: bool) -> admission.Verdict:
    t = t or tree()
    return admission.check_pod(t, QuotaIndex.build(t.specs()), p, options=admission.CheckOptions(**options))


def test_a_pod_fits_up_to_the_runtime_and_not_a_millicore_more() -> None:
    assert tree().runtime("a") == {"cpu": 5_000}
    fits = check(pod("p", "2"))
    assert fits.fits and fits.quota == "a" and fits.used == {"cpu": 3_000} and fits.limit == {"cpu": 5_000}
    over = check(pod("p", "2001m"))
    assert not over.fits
    assert over.reasons == ("insufficient quota a: cpu used 3 + request 2001m = 5001m exceeds runtime 5",)
    assert (fits.code, over.code) == ("fits", "over-limit")


def test_without_runtime_quota_the_limit_is_max() -> None:
    assert check(pod("p", "3"), enable_runtime_quota=False).fits
    verdict = check(pod("p", "3001m"), enable_runtime_quota=False)
    assert not verdict.fits and "exceeds max 6" in verdict.reasons[0]


def test_a_non_preemptible_pod_is_capped_at_min() -> None:
    assert check(pod("p", "1", preemptible=False)).fits  # 3 + 1 ≤ min 4
    verdict = check(pod("p", "1500m", preemptible=False))
    assert not verdict.fits
    assert verdict.reasons == (
        "insufficient quota a: cpu used 3 + request 1500m = 4500m exceeds min (non-preemptible pods) 4",
    )
    assert verdict.code == "over-min"
    assert check(pod("p", "1500m")).fits  # the same pod, preemptible, only meets the runtime


def test_the_parent_check_is_off_by_default_and_uses_ancestor_runtimes() -> None:
    t = tree()
    t.set_load("b", QuotaLoad(request={"cpu": 4_000}, used={"cpu": 5_000}))  # b runs over: team uses 8 of its 9
    assert (t.runtime("team"), t.runtime("a"), t.used("team")) == ({"cpu": 9_000}, {"cpu": 5_000}, {"cpu": 8_000})
    assert check(pod("p", "1500m"), t).fits  # a: 3 + 1.5 ≤ 5
    verdict = check(pod("p", "1500m"), t, enable_check_parent_quota=True)
    assert not verdict.fits
    assert verdict.reasons == (
        "insufficient quota team: cpu used 8 + request 1500m = 9500m exceeds runtime (parent check) 9",
    )
    assert verdict.code == "over-parent-runtime"
    assert check(pod("p", "1"), t, enable_check_parent_quota=True).fits


def test_parent_and_detached_quotas_refuse_pods_and_pods_without_quota_pass() -> None:
    verdict = check(pod("p", "1", quota="team"))
    assert not verdict.fits and "parent quota" in verdict.reasons[0] and verdict.code == "parent-quota"
    assert check(pod("p", "1", quota="team"), support_parent_quota_submit_pod=True).quota == "team"
    t = tree()
    t.set_quota(spec("orphan", 0, 1_000, parent="nowhere"))
    detached = check(pod("p", "1", quota="orphan"), t)
    assert not detached.fits and "detached" in detached.reasons[0] and detached.code == "detached"
    loose = check(pod("p", "1", quota=""), disable_default_quota=True)
    assert loose.fits and loose.quota is None and loose.code == "no-quota"


def test_an_over_used_key_fails_every_pod_as_koordinator_does() -> None:
    t = tree()
    t.set_load("b", QuotaLoad(request={"cpu": 4_000}, used={"cpu": 7_000}))  # b is over its runtime of 4 cores
    verdict = check(pod("p", "0", quota="b"), t)
    assert not verdict.fits and "used 7 + request 0 = 7 exceeds runtime" in verdict.reasons[0]


def test_check_pods_reserves_each_admitted_pod_before_the_next() -> None:
    t = tree()
    verdicts = admission.check_pods(t, QuotaIndex.build(t.specs()), [pod("p1", "1"), pod("p2", "1"), pod("p3", "1")])
    assert [v.fits for v in verdicts] == [True, True, False]
    assert [v.used for v in verdicts] == [{"cpu": 3_000}, {"cpu": 4_000}, {"cpu": 5_000}]
    assert t.used("a") == {"cpu": 3_000}  # the tree itself is untouched
    np = admission.check_pods(
        t, QuotaIndex.build(t.specs()), [pod("n1", "500m", preemptible=False), pod("n2", "600m", preemptible=False)]
    )
    assert [v.fits for v in np] == [True, False]  # 3 + 0.5 ≤ 4, then 3.5 + 0.6 > 4
