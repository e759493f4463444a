"""Issue #19, names at the agent: one pod with a status.qosClass Kubernetes does not have must not stop the BE cgroup
loop for every other pod of the node (it raised KeyError in agent.core.qos_dir and failed the loop each round), and
a pod UID or container ID with a trailing newline (accepted by `re.match(...$)`) is never a cgroup path."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import actuate, core
from tests.integration.test_agent_qos import CID, GI, UID, StaticPods, be_pod, loops, slo_bus, v1_tree, values


async def test_an_unknown_qos_class_skips_that_pod_and_the_others_are_still_set(tmp_path: Path) -> None:
    files = v1_tree(tmp_path / "cg")
    odd = be_pod("3f1e2d3c-0000-4000-8000-00000000000b", name="odd", kube_qos="Platinum")
    bus = await slo_bus({})
    qos_loops = loops(tmp_path, bus, StaticPods(odd, be_pod()), cgroup_root=tmp_path / "cg")
    (event,) = await qos_loops.round()
    assert event.loop == "be-cgroup"
    (problem,) = event.problems
    assert problem.target.endswith("/odd") and "QoS class 'Platinum'" in problem.reason
    pod = f"kubepods/besteffort/pod{UID}"
    after = values(files)
    for directory in (pod, f"{pod}/{CID}"):  # the good pod got its settings this very round
        assert after[f"cpu/{directory}/cpu.shares"] == "2048"
        assert after[f"memory/{directory}/memory.limit_in_bytes"] == str(8 * GI)
    assert len(event.changes) == 6


@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
def test_a_trailing_newline_is_not_a_pod_uid_or_container_id(driver: core.Driver) -> None:
    layout = actuate.Layout(version=1, driver=driver)
    with pytest.raises(core.AgentNameError, match="pod uid"):
        layout.pod_dir("BestEffort", UID + "\n")
    with pytest.raises(core.AgentNameError, match="container id"):
        layout.container_dir(layout.pod_dir("BestEffort", UID), "containerd", CID + "\n")
    assert core.parse_pod_dir(f"pod{UID}\n", "cgroupfs") is None
    assert core.parse_container_dir(f"cri-containerd-{CID}.scope\n", "systemd") is None


def test_a_cgroup_parent_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(core.AgentNameError):
        core.validate_parent("test\n")
