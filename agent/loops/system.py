"""The system-config loop (issue 23, point 1; koordlet's SystemConfig feature, off by default there and here): the
node's memory sysctls from the NodeSLO's systemStrategy (agent.system_config), written under the agent's proc and
sys roots through confined files, on static passes, only where they differ.

Fail-safe: the value a file held before the agent first changed it is kept in `<state_dir>/system-config.json`;
when the agent runs with the loop off (told to stop managing the node's sysctls) those values are written back
once and forgotten, each as a change with its before and after. Dry-run reports every write and remembers nothing.
"""

from __future__ import annotations

import json
import logging
import os

from agent import collect, system_config
from agent.files import PathRejected, RootedFiles
from agent.loops.base import Actuator, LoopResult, Round
from agent.state_file import save_json
from schemas.qos import Change, Problem

log = logging.getLogger(__name__)

STATE_FILE = "system-config.json"


class SystemConfig:
    def __init__(self, *, enabled: bool, proc_root: str, sys_root: str, state_dir: str) -> None:
        self.enabled = enabled
        self._proc_root = proc_root
        self._files: dict[system_config.Root, RootedFiles] = {
            "proc": RootedFiles(proc_root),
            "sys": RootedFiles(sys_root),
        }
        self._state = os.path.join(state_dir, STATE_FILE) if state_dir else ""
        self.originals: dict[str, str] = self._load()
        """"<root>:<path>" → the value before the agent first changed it."""

    def run(self, act: Actuator, rnd: Round) -> LoopResult:
        result = LoopResult()
        for files in self._files.values():
            files.new_round()
        if not self.enabled:
            self._restore(act, result)
            return result
        try:
            mem_total_kb = collect.read_meminfo(self._proc_root).total_kb
        except (OSError, KeyError, ValueError) as e:
            result.problems.append(Problem(target="meminfo", reason=f"cannot read MemTotal: {e}"))
            return result
        wants, skipped = system_config.system_wants(rnd.slo["systemStrategy"], mem_total_kb=mem_total_kb)
        for skip in skipped:
            result.problems.append(Problem(target=f"systemStrategy.{skip.field}", reason=skip.why))
        for want in wants:
            files = self._files[want.root]
            try:
                current = files.read(want.path)
            except (OSError, PathRejected) as e:
                result.problems.append(Problem(target=f"{want.root}/{want.path}", reason=f"cannot read: {e}"))
                continue
            if current is None:
                if want.path != system_config.REAP_BACKGROUND:  # koordlet writes it only where the kernel has it
                    result.problems.append(Problem(target=f"{want.root}/{want.path}", reason="no such file"))
                continue
            before = current.strip()
            if before == want.value:
                continue
            key = f"{want.root}:{want.path}"
            if act.write(files, want.path, want.value, result):
                if not act.dry_run and key not in self.originals:
                    self.originals[key] = before
                    self._save()
                result.changes.append(
                    Change(path=f"{want.root}/{want.path}", before=before, after=want.value, reason=want.reason)
                )
        return result

    def _restore(self, act: Actuator, result: LoopResult) -> None:
        """Write back what the agent changed (the loop is off now), then forget it."""
        if not self.originals:
            return
        for key, value in sorted(self.originals.items()):
            root, _, path = key.partition(":")
            files = self._files.get(root)  # type: ignore[call-overload]
            if files is None:
                continue
            try:
                current = (files.read(path) or "").strip()
            except (OSError, PathRejected) as e:
                result.problems.append(Problem(target=f"{root}/{path}", reason=f"cannot read to restore: {e}"))
                continue
            if current != value and act.write(files, path, value, result):
                reason = "system-config is off: the value before koordbus changed it"
                result.changes.append(Change(path=f"{root}/{path}", before=current, after=value, reason=reason))
        if not act.dry_run and not result.problems:
            self.originals = {}
            self._save()

    def _load(self) -> dict[str, str]:
        if not self._state or not os.path.exists(self._state):
            return {}
        try:
            with open(self._state) as f:
                saved = json.load(f)
            if not isinstance(saved, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in saved.items()
            ):
                raise ValueError("not a map of strings")
            return saved
        except (OSError, ValueError) as e:
            log.warning("ignoring %s (the sysctls' original values cannot be restored from it): %s", self._state, e)
            return {}

    def _save(self) -> None:
        if not self._state:
            return
        try:
            save_json(self._state, self.originals, prefix=".system-config-")
        except OSError as e:
            log.warning("cannot save the sysctls' original values to %s: %s", self._state, e)
