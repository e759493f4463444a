"""Typed, frozen settings of the node agent's metrics half, built once at the edge (the `koordbus agent` CLI,
`koordbus up`, tests) and injected into agent/collect.py and agent/service.py. Validation fails fast with a
message naming the field, so a bad DaemonSet flag stops the agent at start-up instead of skewing samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from agent import core, evict
from agent.suppress import parse_cpuset
from schemas import names
from schemas.cpi import MAX_WINDOW_SECONDS

CgroupVersion = Literal["auto", 1, 2]
CgroupDriver = Literal["auto", "cgroupfs", "systemd"]


TOPOLOGY_REFRESH_MAX_SECONDS = 3600.0
"""Half of KOORD_NODE's 2 h max age (bus.streams.node_stream): the stream always holds a node's latest report."""


class AgentSettingsError(ValueError):
    """A setting of the agent is out of range or malformed."""


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    ENV_PREFIX: ClassVar[str] = "KOORDBUS_AGENT_"
    """Each field from KOORDBUS_AGENT_<FIELD>, else the shared KOORDBUS_<FIELD> (services.common.settings)."""

    node_name: str
    """Kubernetes name of the node this agent runs on (DNS-1123 subdomain); names its subjects and msg ids."""
    proc_root: str = "/proc"
    """Where procfs is mounted; in a container usually the host's /proc bind-mounted elsewhere."""
    cgroup_root: str = "/sys/fs/cgroup"
    """Where the cgroup hierarchies are mounted; nothing outside it is ever read."""
    cgroup_version: CgroupVersion = "auto"
    """1, 2, or "auto": v2 when <root>/cgroup.controllers exists and <root>/cpuacct does not (hybrid hosts are v1)."""
    cgroup_driver: CgroupDriver = "auto"
    """The kubelet's cgroup driver; "auto" picks whichever of kubepods/ or kubepods.slice/ exists."""
    kubepods_parent: str = ""
    """Relative path under each hierarchy where kubepods lives ("" = directly under it); tests use a private subtree."""
    collect_interval: float = 1.0
    """Seconds between two samples of node, pods and containers (koordlet's collect-res-used-interval)."""
    sys_root: str = "/sys"
    """Where sysfs is mounted: the NUMA nodes' CPUs and memory (numaUsages). The QoS loops read the same setting."""
    publish_interval: float = 10.0
    """Seconds per published batch; windows are aligned to wall-clock multiples [k·interval, (k+1)·interval)."""
    max_buffered_batches: int = 360
    """Batches kept while the bus is unreachable (360 × 10 s = 1 h); the oldest is dropped beyond that."""
    pod_list_resend_batches: int = 6
    """An unchanged pod list is left out of batches (they name it by digest) but sent again after this many."""
    state_interval: float = 300.0
    """Seconds between NodeStateReported re-sends when nothing changed."""
    publish_timeout: float = 5.0
    """Seconds one publish may take before the bus counts as unavailable and batches are buffered."""
    topology_report: bool = True
    """Publish the node's NUMA zones, CPUs and kubelet CPU manager (NodeTopologyReported, agent.topology_watch), from
    which the bridge writes its NodeResourceTopology."""
    kubelet_root_dir: str = "/var/lib/kubelet"
    """The kubelet's root directory (its --root-dir), where its CPU manager's `cpu_manager_state` is read; in a
    container, the host's, mounted read-only."""
    topology_interval_seconds: float = 60.0
    """Seconds between two reads of the topology; a change is published at the read that sees it."""
    topology_refresh_seconds: float = 600.0
    """An unchanged topology is published again after this many seconds (at most TOPOLOGY_REFRESH_MAX_SECONDS), so
    the bridge finds a recent report in KOORD_NODE whenever it starts."""
    cpi_collect: bool = False
    """Count each pod's cycles and instructions with perf counters for its CPI (koordlet's CPICollector; agent.cpi).
    Off by default, as Koordinator's feature gate is: it holds one descriptor per event, CPU and pod for a window
    every interval, competes for the PMU's few counters with anyone else profiling the node, and needs CAP_PERFMON
    (or CAP_SYS_ADMIN) and perf_event_open allowed by the pod's seccomp profile. Where the kernel does not allow it
    the agent says so once and reports no CPI."""
    cpi_interval: float = 60.0
    """Seconds between the starts of two CPI counting windows (koordlet's cpiCollectorInterval)."""
    cpi_window: float = 10.0
    """Seconds the CPI counters run in each interval (koordlet's cpiCollectorTimeWindowSeconds); at most
    `cpi_interval`, and at most an hour."""

    def __post_init__(self) -> None:
        try:
            names.node_name(self.node_name, "node_name")
        except names.InvalidName as e:
            raise AgentSettingsError(str(e)) from None
        for name in (
            "collect_interval",
            "publish_interval",
            "state_interval",
            "publish_timeout",
            "topology_interval_seconds",
            "topology_refresh_seconds",
            "cpi_interval",
        ):
            value = getattr(self, name)
            if not value > 0:
                raise AgentSettingsError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.publish_interval < self.collect_interval:
            raise AgentSettingsError(
                f"publish_interval {self.publish_interval} must not be shorter than collect_interval "
                f"{self.collect_interval}"
            )
        if not 0 < self.cpi_window <= min(self.cpi_interval, MAX_WINDOW_SECONDS):
            raise AgentSettingsError(
                f"cpi_window must be more than 0 seconds and at most cpi_interval ({self.cpi_interval:g}) and "
                f"{MAX_WINDOW_SECONDS:g}, got {self.cpi_window!r}"
            )
        if self.pod_list_resend_batches < 1:
            raise AgentSettingsError(f"pod_list_resend_batches must be at least 1, got {self.pod_list_resend_batches}")
        if self.max_buffered_batches < 1:
            raise AgentSettingsError(f"max_buffered_batches must be at least 1, got {self.max_buffered_batches}")
        if self.cgroup_version in ("1", "2"):  # from the environment (KOORDBUS_CGROUP_VERSION=2) it arrives as text
            object.__setattr__(self, "cgroup_version", int(self.cgroup_version))
        if self.cgroup_version not in ("auto", 1, 2):
            raise AgentSettingsError(f"cgroup_version must be 'auto', 1 or 2, got {self.cgroup_version!r}")
        if self.cgroup_driver not in ("auto", "cgroupfs", "systemd"):
            raise AgentSettingsError(
                f"cgroup_driver must be 'auto', 'cgroupfs' or 'systemd', got {self.cgroup_driver!r}"
            )
        if not self.topology_interval_seconds <= self.topology_refresh_seconds <= TOPOLOGY_REFRESH_MAX_SECONDS:
            raise AgentSettingsError(
                f"topology_refresh_seconds {self.topology_refresh_seconds} must be between topology_interval_seconds "
                f"{self.topology_interval_seconds} and {TOPOLOGY_REFRESH_MAX_SECONDS}"
            )
        for name in ("proc_root", "cgroup_root", "sys_root", "kubelet_root_dir"):
            if not getattr(self, name).startswith("/"):
                raise AgentSettingsError(f"{name} must be an absolute path, got {getattr(self, name)!r}")
        try:
            core.validate_parent(self.kubepods_parent)
        except core.AgentNameError as e:
            raise AgentSettingsError(f"kubepods_parent: {e}") from e


QosMode = Literal["off", "dry-run", "apply"]


@dataclass(frozen=True, kw_only=True)
class QosSettings:
    """The agent's actuation half (issue 6): NodeSLO-driven QoS loops."""

    ENV_PREFIX: ClassVar[str] = "KOORDBUS_AGENT_"
    """Each field from KOORDBUS_AGENT_<FIELD>, else the shared KOORDBUS_<FIELD> (services.common.settings)."""

    qos_mode: QosMode = "dry-run"
    """off: no QoS loops. dry-run: plan every round, log and publish the plan (ActuationApplied dry_run=true), write
    nothing. apply: write."""
    resctrl_root: str = "/sys/fs/resctrl"
    """Where resctrl is mounted; the resctrl loop stays idle (and says so once) when it is not."""
    state_dir: str = "/var/lib/koordbus"
    """Where the last good NodeSLO is kept across restarts ("" = nowhere)."""
    kubelet_pods_url: str = ""
    """The kubelet's pod list, e.g. https://127.0.0.1:10250/pods (or the read-only http://127.0.0.1:10255/pods); ""
    = no pods: only node-level QoS loops run, and the metrics half reports pods by UID only."""
    kubelet_token_file: str = ""
    """Bearer token for the kubelet (a service account token file); "" = none."""
    kubelet_insecure: bool = False
    """Skip TLS verification of the kubelet (its serving certificate is self-signed by default)."""
    kubelet_ca_file: str = ""
    """CA bundle the kubelet's serving certificate is verified with ("" = the system's trust store)."""
    round_interval: float = 1.0
    """Seconds between two rounds of the QoS loops (koordlet: 1 s)."""
    reconcile_interval: float = 10.0
    """Seconds between two full passes of the loops whose targets only change with the pods or the NodeSLO (BE
    cgroups, resctrl schemata and tasks, CFS burst); they also run at once on any such change. The usage-driven
    loops (CPU suppress, CFS quota burst, evictions) run every round."""
    slo_poll_interval: float = 5.0
    """Seconds between two reads of this node's NodeSLO key."""
    pods_poll_interval: float = 5.0
    """Seconds between two reads of the kubelet's pod list (rounds in between use the last list; a new pod's cgroups
    are set at most this much later; 0: every round). Our choice: a 200-pod list every second was a tenth of the
    agent's CPU."""
    system_config: bool = False
    """Write the node's memory sysctls from the NodeSLO's systemStrategy (koordlet's SystemConfig, off by default
    there too); turned off again, the values the agent changed are written back (agent.loops.system)."""
    apply_at_pod_start: bool = True
    """Watch the besteffort cgroup directories (inotify) and set a new BE pod's cgroups at once, rather than at the
    next pod poll (agent.cgroup_watch); off, or where inotify cannot be had, the poll alone does it."""
    max_writes_per_round: int = 256
    """A round writes at most this many files; the rest waits for the next round (bounded movement)."""
    sys_root: str = "/sys"
    """Where sysfs is mounted: the CPU topology the cpuset suppress policy spreads BE pods over."""
    reserved_cpu_milli: int = 0
    """CPU the node reserves for the system (the kubelet's kube/system-reserved), in millicores: CPU suppress never
    counts the system as using less."""
    reserved_cpus: str = ""
    """CPUs BE pods never get, in the kernel's list format ("0-1"): the kubelet's `--reserved-cpus` /
    reservedSystemCPUs, or the reservedCPUs of Koordinator's `node.koordinator.sh/reservation` annotation (the agent
    reads no Node object). They also count as reserved CPU for suppress (at least one core each)."""
    usage_max_age: float = 3.0
    """Seconds after which the latest usage sample is too old for CPU suppress (the loop waits for a fresh one)."""
    evict_features: str = ""
    """Eviction features on, comma-separated: BEMemoryEvict, MemoryEvict, BECPUEvict, CPUEvict (Koordinator's
    feature gates, all off by default there too); each also needs resourceUsedThresholdWithBE.enable in the
    NodeSLO."""
    evict_locally: bool = False
    """When an eviction request cannot be published (the bus is away), kill the pod's containers' processes here
    instead (SIGKILL; the kubelet restarts or fails them). Off: the request waits for the next round."""
    eviction_pending_seconds: float = 120.0
    """A pod whose eviction was requested counts as released (and is not asked for again) for this long."""
    failsafe_after: float = 300.0
    """Seconds without a readable NodeSLO after which BE pods are suppressed to the minimum CFS quota and no new
    eviction is started, until the control plane is back."""
    psi_suppress_threshold: float = 0.0
    """koordbus's opt-in PSI suppress rule (docs/node-qos.md): when an LS pod's CPU `some` stall ratio over the last
    collection interval reaches this (0 < t ≤ 1), CPU suppress lowers BE's allowance by `psi_suppress_step_percent`
    of the node's CPUs. 0: off (the default; Koordinator has no such rule)."""
    psi_suppress_step_percent: float = 10.0
    """The step the PSI suppress rule takes off BE's CPU allowance, in percent of the node's CPUs (0 < s ≤ 100)."""

    @property
    def reserved_cpu_ids(self) -> frozenset[int]:
        return frozenset(parse_cpuset(self.reserved_cpus)) if self.reserved_cpus.strip() else frozenset()

    @property
    def evict_feature_set(self) -> frozenset[str]:
        return frozenset(f.strip() for f in self.evict_features.split(",") if f.strip())

    def __post_init__(self) -> None:
        if self.qos_mode not in ("off", "dry-run", "apply"):
            raise AgentSettingsError(f"qos mode must be 'off', 'dry-run' or 'apply', got {self.qos_mode!r}")
        for name in (
            "round_interval",
            "slo_poll_interval",
            "failsafe_after",
            "usage_max_age",
            "eviction_pending_seconds",
        ):
            if not getattr(self, name) > 0:
                raise AgentSettingsError(f"{name} must be a positive number of seconds, got {getattr(self, name)!r}")
        if not self.pods_poll_interval >= 0:
            raise AgentSettingsError(f"pods_poll_interval must be 0 or more seconds, got {self.pods_poll_interval!r}")
        if self.max_writes_per_round < 1:
            raise AgentSettingsError(f"max_writes_per_round must be at least 1, got {self.max_writes_per_round}")
        unknown = set(self.evict_feature_set) - evict.FEATURES
        if unknown:
            raise AgentSettingsError(
                f"evict_features: unknown {', '.join(sorted(unknown))} (known: {', '.join(sorted(evict.FEATURES))})"
            )
        if self.reserved_cpu_milli < 0:
            raise AgentSettingsError(f"reserved_cpu_milli must not be negative, got {self.reserved_cpu_milli}")
        try:
            self.reserved_cpu_ids  # noqa: B018 - parsed here so a bad list stops the agent at start
        except ValueError as e:
            raise AgentSettingsError(
                f"reserved_cpus must be a cpu list like '0-1,4', got {self.reserved_cpus!r}: {e}"
            ) from None
        if not 0 <= self.psi_suppress_threshold <= 1:
            raise AgentSettingsError(
                f"psi_suppress_threshold must be a stall ratio in [0, 1] (0: off), got {self.psi_suppress_threshold!r}"
            )
        if not 0 < self.psi_suppress_step_percent <= 100:
            raise AgentSettingsError(
                f"psi_suppress_step_percent must be in (0, 100], got {self.psi_suppress_step_percent!r}"
            )
        if not self.resctrl_root.startswith("/") or not self.sys_root.startswith("/"):
            raise AgentSettingsError(
                f"resctrl_root and sys_root must be absolute paths, got {self.resctrl_root!r}, {self.sys_root!r}"
            )
        if self.kubelet_pods_url and not self.kubelet_pods_url.startswith(("http://", "https://")):
            raise AgentSettingsError(f"kubelet_pods_url must be an http(s) URL, got {self.kubelet_pods_url!r}")
        if self.kubelet_ca_file and self.kubelet_insecure:
            raise AgentSettingsError("kubelet_ca_file and kubelet_insecure exclude each other: verify, or do not")
