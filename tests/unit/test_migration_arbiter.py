"""One arbitration round (spec §4.4): outcomes with their filters, passed jobs counting against later ones, and the
property that no round passes more than the global, per-node, per-namespace and per-workload limits allow."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import kube, migration
from services.migration import arbiter
from services.migration.args import MigrationArgs, get_max_unavailable
from tests.support.migration import job, pod, workload


def run(jobs: list[migration.PodMigrationJob], pods: list[kube.Pod], **given: Any) -> arbiter.Round:
    workloads = [workload("rs-1", 10), workload("rs-2", 3), workload("job-x", 4)]
    return arbiter.arbitrate_objects(jobs, pods, workloads, msgspec.convert(given, MigrationArgs))


def test_passed_jobs_count_against_the_next_ones_in_the_same_round() -> None:
    pods = [pod(f"p{i}", node="n1") for i in range(4)]
    result = run([job(f"j{i}", f"p{i}") for i in range(4)], pods)
    assert len(result.names("passed")) == 2  # maxMigratingPerNode 2 (and 2 per workload of 10)
    held = [d for d in result.decisions if d.outcome == "waiting"]
    assert {d.filter for d in held} <= {"MaxMigratingPerNode", "MaxMigratingPerWorkload"} and len(held) == 2


def test_failed_waiting_passed_and_missing_pods() -> None:
    pods = [pod("bare", owner=None, node="n2"), pod("ok", node="n3"), pod("busy", node="n1"), pod("r1", node="n1")]
    jobs = [
        job("j-bare", "bare"),
        job("j-ok", "ok"),
        job("j-ghost", "ghost"),
        job("j-busy", "busy"),
        job("j-running", "r1", phase="Running"),
        job("j-done", "ok", phase="Succeeded"),
    ]
    result = run(jobs, pods, maxMigratingPerNode=1)
    assert result.names("failed") == ["j-bare"]
    assert sorted(result.names("passed")) == ["j-ghost", "j-ok"]
    assert result.names("waiting") == ["j-busy"]
    assert result.order[0] == "j-ghost"  # jobs without a pod go first
    reasons = {d.job: d for d in result.decisions}
    assert reasons["j-bare"].filter == "BarePods" and reasons["j-busy"].filter == "MaxMigratingPerNode"
    assert "j-running" not in result.order and "j-done" not in result.order


def test_paused_jobs_and_jobs_already_passed_are_not_waiting() -> None:
    result = run([job("a", "p", passed=True), job("b", "q")], [pod("p", node="n1"), pod("q", node="n1")])
    assert result.order == ["b"] and result.names("passed") == ["b"]


NODES = ["n1", "n2", "n3"]
NAMESPACES = ["default", "apps"]
OWNERS = ["rs-1", "rs-2", None]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[migration.PodMigrationJob], list[kube.Pod], dict[str, Any]]:
    count = draw(st.integers(1, 25))
    pods, jobs = [], []
    for i in range(count):
        owner = draw(st.sampled_from(OWNERS))
        namespace = draw(st.sampled_from(NAMESPACES))
        p = pod(
            f"p{i}",
            namespace=namespace,
            node=draw(st.sampled_from(NODES)),
            owner=owner,
            ready=draw(st.booleans()),
            priority=draw(st.sampled_from([None, 5500, 9100])),
        )
        pods.append(p)
        state = draw(st.sampled_from(["waiting", "waiting", "running", "passed", "done"]))
        phase = {"running": "Running", "done": "Succeeded"}.get(state, "")
        jobs.append(job(f"j{i}", f"p{i}", namespace=namespace, phase=phase, passed=state == "passed"))
    limits: dict[str, Any] = {
        "maxMigratingGlobally": draw(st.sampled_from([None, 0, 1, 3, 6])),
        "maxMigratingPerNode": draw(st.sampled_from([None, 0, 1, 2])),
        "maxMigratingPerNamespace": draw(st.sampled_from([None, 0, 1, 4])),
        "maxMigratingPerWorkload": draw(st.sampled_from([None, 1, 2, "50%"])),
        "maxUnavailablePerWorkload": draw(st.sampled_from([None, 1, 3, "50%"])),
        "evictAllBarePods": True,
        "skipCheckExpectedReplicas": True,
    }
    return jobs, pods, {k: v for k, v in limits.items() if v is not None}


@settings(max_examples=300, deadline=None)
@given(scenario=scenarios())
def test_no_round_passes_more_than_the_limits_allow(
    scenario: tuple[list[migration.PodMigrationJob], list[kube.Pod], dict[str, Any]],
) -> None:
    """After the round, what migrates (already migrating + passed now) stays within every limit that was not
    already exceeded before it — a round only ever adds up to a limit."""
    jobs, pods, given = scenario
    a = msgspec.convert(given, MigrationArgs)
    result = run(jobs, pods, **given)
    by_name = {p.metadata.name: p for p in pods}
    before = [j for j in jobs if migration.is_migrating(j)]
    passed = set(result.names("passed"))
    after = before + [j for j in jobs if j.metadata.name in passed]

    def count(selected: list[migration.PodMigrationJob], key: Any) -> dict[Any, int]:
        out: dict[Any, int] = {}
        for j in selected:
            k = key(by_name[j.spec.pod_ref.name])  # type: ignore[union-attr]
            if k is not None:
                out[k] = out.get(k, 0) + 1
        return out

    def within(limit: int | None, key: Any) -> None:
        if not limit:
            return
        was, now = count(before, key), count(after, key)
        for k, n in now.items():
            assert n <= max(limit, was.get(k, 0)), (k, n, limit)

    within(a.max_migrating_globally, lambda p: "all")
    within(a.max_migrating_per_node, lambda p: p.spec.node_name)
    within(a.max_migrating_per_namespace, lambda p: p.metadata.namespace)
    for uid, replicas in {"rs-1": 10, "rs-2": 3}.items():

        def mine(p: kube.Pod, uid: str = uid) -> bool:
            owner = kube.controller_of(p.metadata)
            return owner is not None and owner.uid == uid

        moving_before = {j.spec.pod_ref.name for j in before if j.spec.pod_ref and mine(by_name[j.spec.pod_ref.name])}
        moving_after = {j.spec.pod_ref.name for j in after if j.spec.pod_ref and mine(by_name[j.spec.pod_ref.name])}
        if moving_after == moving_before:
            continue  # this round passed none of its pods
        unready = {p.metadata.name for p in pods if mine(p) and not kube.pod_ready(p)}
        assert len(moving_after) <= get_max_unavailable(replicas, a.max_migrating_per_workload), uid
        assert len(unready | moving_after) <= get_max_unavailable(replicas, a.max_unavailable_per_workload), uid


def _succeeded(name: str, pod_name: str, *, reason: str = "") -> migration.PodMigrationJob:
    done = job(name, pod_name, phase="Succeeded")
    return msgspec.structs.replace(done, status=msgspec.structs.replace(done.status, reason=reason))


def test_a_pod_evicted_but_still_in_the_view_counts_as_unavailable() -> None:
    pods = [pod(f"p{i}", node=f"n{i}") for i in range(4)]
    alone = run([job("j1", "p1")], pods, maxUnavailablePerWorkload=1)
    assert alone.names("passed") == ["j1"]
    lagging = run([_succeeded("j0", "p0"), job("j1", "p1")], pods, maxUnavailablePerWorkload=1)
    assert lagging.names("waiting") == ["j1"]
    assert {d.filter for d in lagging.decisions if d.job == "j1"} == {"MaxUnavailablePerWorkload"}
    # A dry run evicted nothing, and a replacement with the same name is another pod (another uid).
    dry = run([_succeeded("j0", "p0", reason="DryRun"), job("j1", "p1")], pods, maxUnavailablePerWorkload=1)
    assert dry.names("passed") == ["j1"]
    replaced = [msgspec.structs.replace(pods[0], metadata=msgspec.structs.replace(pods[0].metadata, uid="new"))]
    fresh = run([_succeeded("j0", "p0"), job("j1", "p1")], replaced + pods[1:], maxUnavailablePerWorkload=1)
    assert fresh.names("passed") == ["j1"]


def small_node(name: str, cpu: str) -> kube.Node:
    return msgspec.convert(
        {"metadata": {"name": name}, "status": {"allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"}}},
        kube.Node,
    )


def test_node_fit_fails_a_pod_that_fits_no_other_node() -> None:
    """nodeFit: the pod (2 cores) must fit some node other than its own; n2 has 3 cores with 2 requested by the pod
    there, n1 is the pod's own. With n3 (4 free cores) known it passes; without, it fails with the NodeFit filter;
    with no nodes known at all it waits; with nodeFit off (or its gate skipped) nodes are not looked at."""
    cores = [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]
    pods = [pod("p", node="n1", containers=cores), pod("q", node="n2", containers=cores)]
    workloads = [workload("rs-1", 10)]
    args = MigrationArgs(node_fit=True)

    def decide(nodes: list[kube.Node], given: MigrationArgs = args) -> arbiter.Decision:
        view = arbiter.ClusterView.build(pods, workloads, given, nodes=nodes)
        return arbiter.arbitrate([job("j", "p")], view, given).decisions[0]

    assert decide([small_node("n1", "8"), small_node("n2", "3"), small_node("n3", "4")]).outcome == "passed"
    refused = decide([small_node("n1", "8"), small_node("n2", "3")])
    assert (refused.outcome, refused.filter) == ("failed", "NodeFit")
    assert refused.message.startswith("pod default/p fits none of the 1 other node(s)")
    waiting = decide([])
    assert (waiting.outcome, waiting.filter) == ("waiting", "NodeFit")
    assert decide([small_node("n1", "8")], MigrationArgs()).outcome == "passed"
    assert decide([small_node("n1", "8")], MigrationArgs(node_fit=True, skip_eviction_gates=["NodeFit"])).outcome == (
        "passed"
    )
    forced = pod("p", node="n1", containers=cores, annotations={migration.ANNOTATION_EVICT: "true"})
    view = arbiter.ClusterView.build([forced, pods[1]], workloads, args, nodes=[small_node("n1", "8")])
    assert arbiter.arbitrate([job("j", "p")], view, args).decisions[0].outcome == "passed"  # the evict annotation
