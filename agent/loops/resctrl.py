"""The resctrl loop (spec §5.4): the LSR/LS/BE groups' L3 masks and MBA, written only when the parsed values
differ (all of a group's lines in one write), and the pods' container threads added to their group's `tasks`."""

from __future__ import annotations

import logging
import os

from agent import actuate, qos
from agent.files import PathRejected
from agent.loops.base import Actuator, LoopResult, Round
from schemas import vocab
from schemas.qos import Change, Problem

log = logging.getLogger(__name__)


def _spelled(resource: str, values: dict[int, int]) -> str:
    spelled = "{}={:d}" if resource == "MB" else "{}={:x}"
    return f"{resource}:" + ";".join(spelled.format(k, v) for k, v in sorted(values.items()))


class Resctrl:
    def __init__(self, *, proc_root: str) -> None:
        self._proc_root = proc_root
        self._said_absent = False

    def run(self, act: Actuator, rnd: Round) -> LoopResult:
        result = LoopResult()
        classes = rnd.slo["resourceQOSStrategy"]
        if not any(classes[c]["resctrlQOS"].get("enable") for c in ("lsrClass", "lsClass", "beClass")):
            return result
        try:
            info = self._info(act)
        except (OSError, qos.QoSError, PathRejected) as e:
            if not self._said_absent:
                log.warning("resctrl QoS is enabled but not usable here: %s", e)
                self._said_absent = True
            result.problems.append(Problem(target=act.resctrl.root, reason=f"resctrl not usable: {e}"))
            return result
        try:
            wanted = actuate.resctrl_schemata(rnd.slo, info)
        except qos.QoSError as e:
            result.problems.append(Problem(target="resourceQOSStrategy", reason=str(e)))
            return result
        for group, lines in wanted.items():
            if not act.resctrl.exists(group) and not act.dry_run:
                try:
                    act.resctrl.mkdir(group)
                except OSError as e:
                    result.problems.append(Problem(target=group, reason=f"cannot create the group: {e}"))
                    continue
            current = actuate.parse_schemata(act.resctrl.read(f"{group}/schemata") or "")
            differing = [resource for resource, line in lines.items() if actuate.schemata_differs(line, current)]
            if not differing:
                continue
            if rnd.budget <= 0:
                result.deferred += 1
                continue
            # every line of the group in one write: the kernel takes several lines at once, and a group is never
            # left with a new L3 mask but an old MBA value between two rounds
            text = "".join(line + "\n" for line in lines.values())
            if act.write(act.resctrl, f"{group}/schemata", text, result):
                result.changes.append(
                    Change(
                        path=f"{group}/schemata",
                        before=";".join(_spelled(resource, current.get(resource, {})) for resource in differing),
                        after=" ".join(lines[resource] for resource in differing),
                        reason=f"{group} {'/'.join(differing)} from the class's resctrlQOS (§5.4)",
                    )
                )
                rnd.budget -= 1
        self._assign_tasks(act, rnd, result)
        return result

    def _info(self, act: Actuator) -> actuate.ResctrlInfo:
        cbm_text = act.resctrl.read("info/L3/cbm_mask")
        root_schemata = act.resctrl.read("schemata")
        if cbm_text is None or root_schemata is None:
            raise qos.QoSError(f"no resctrl filesystem at {act.resctrl.root} (info/L3/cbm_mask, schemata)")
        vendor = ""
        try:
            with open(os.path.join(self._proc_root, "cpuinfo")) as f:
                for line in f:
                    if line.startswith("vendor_id"):
                        vendor = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        return actuate.ResctrlInfo(
            cbm=qos.parse_cbm(cbm_text.strip()),
            cache_ids=actuate.cache_ids_of(root_schemata),
            mba=act.resctrl.exists("info/MB"),
            vendor=vendor,
        )

    @staticmethod
    def _assign_tasks(act: Actuator, rnd: Round, result: LoopResult) -> None:
        layout = rnd.layout
        threads_file = "cgroup.threads" if layout.version == 2 else "tasks"
        by_group: dict[str, set[int]] = {}
        for node_pod in rnd.pods:
            group = actuate.group_of(node_pod, rnd.slo)
            if group is None or node_pod.pod.status.phase not in ("Running", "Pending"):
                continue
            try:
                pod_dir = layout.pod_dir(node_pod.pod.status.qos_class or vocab.KUBE_QOS_BESTEFFORT, node_pod.uid)
                for runtime, container_id in node_pod.containers.values():
                    rel = layout.file("cpu", layout.container_dir(pod_dir, runtime, container_id), threads_file)
                    text = act.cgroups.read(rel) or ""
                    by_group.setdefault(group, set()).update(int(t) for t in text.split() if t.isdigit())
            except (OSError, PathRejected, ValueError) as e:
                result.problems.append(Problem(target=node_pod.key, reason=f"cannot read its threads: {e}"))
        for group, threads in sorted(by_group.items()):
            present = {int(t) for t in (act.resctrl.read(f"{group}/tasks") or "").split() if t.isdigit()}
            missing = sorted(threads - present)
            moved = 0
            for tid in missing:
                if rnd.budget <= 0:
                    result.deferred += len(missing) - moved
                    break
                # a thread that exited meanwhile is refused by the kernel: tolerated, as koordlet does
                if act.try_append(act.resctrl, f"{group}/tasks", str(tid)):
                    moved += 1
                    rnd.budget -= 1
            if moved:
                result.changes.append(
                    Change(
                        path=f"{group}/tasks",
                        before=f"{len(present)} threads",
                        after=f"+{moved} threads",
                        reason=f"threads of {group} pods' containers join their resctrl group (§5.4)",
                    )
                )
