"""Settings of the quota service (built once by the CLI; see services.common.settings.load).

They are koord-scheduler's ElasticQuota args and feature gates that change what the trees compute and what the
admission check answers (spec §3.3, Koordinator's defaults), plus the shell's timings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, get_args

from services.quota.admission import CheckOptions
from services.quota.model import ModelOptions, Terminating


@dataclass(frozen=True, kw_only=True)
class QuotaSettings:
    ENV_PREFIX: ClassVar[str] = "KOORDBUS_QUOTA_"
    """Each field from KOORDBUS_QUOTA_<FIELD>, else the shared KOORDBUS_<FIELD> (services.common.settings)."""

    enable_min_quota_scale: bool = True
    """enableMinQuotaScale: when a parent's total is below Σ children's min, scale the mins down proportionally."""
    enable_runtime_quota: bool = True
    """enableRuntimeQuota: the admission check compares with runtime; false compares with max."""
    enable_check_parent_quota: bool = False
    """enableCheckParentQuota: the admission check also checks every ancestor below the root."""
    guarantee_usage: bool = False
    """Feature ElasticQuotaGuaranteeUsage: no quota lends; guaranteed = max(allocated, min)."""
    disable_default_quota: bool = False
    """Feature DisableDefaultQuota: pods matching no quota belong to none (and are not checked)."""
    ignore_pod_overhead: bool = False
    """Feature ElasticQuotaIgnorePodOverhead."""
    support_parent_quota_submit_pod: bool = False
    """Feature SupportParentQuotaSubmitPod: pods may be placed in parent quotas."""
    terminating_pods: str = "count"
    """count | ignore-immediately (ElasticQuotaImmediateIgnoreTerminatingPod) | ignore-after-grace
    (ElasticQuotaIgnoreTerminatingPod): whether a pod being deleted still counts."""
    instance: str = ""
    """Names this replica's consumers (`quota-events-<instance>`): every replica folds the whole log, so replicas
    running at once need distinct instance names (a Deployment passes the pod name); empty for a single one."""
    tick_seconds: float = 1.0
    """How often terminating pods past their grace period are dropped and changed statuses published."""
    profile_interval_seconds: float = 10.0
    """How often each ElasticQuotaProfile's root quota is brought to its nodes' allocatable (koord-manager: 10 s);
    a change is appended as an ordinary quota command by actor `profile-controller/<profile>`."""
    batch_size: int = 512
    linger_seconds: float = 0.1
    """After a fetched batch of pods and nodes (or of the projections) smaller than batch_size, wait this long
    before the next fetch, so a burst of pod events is recomputed and published once. The quota log's consumer
    never lingers: each command waits for its own event to come back through it."""
    startup_timeout_seconds: float = 60.0
    """start() waits for the replay of the quota log and the cluster state as long as it makes progress; after
    this long without progress it starts with what it has (and logs a warning)."""
    command_timeout_seconds: float = 5.0
    """How long a command waits for the service to have applied its tree's latest event (before deciding) and its
    own event (before answering)."""

    def __post_init__(self) -> None:
        if self.terminating_pods not in get_args(Terminating):
            raise ValueError(f"terminating_pods must be one of {', '.join(get_args(Terminating))}")
        for name in ("tick_seconds", "startup_timeout_seconds", "command_timeout_seconds", "profile_interval_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.batch_size <= 0 or self.linger_seconds < 0:
            raise ValueError("batch_size must be positive and linger_seconds not negative")

    def model_options(self) -> ModelOptions:
        terminating: Terminating = "count"
        for option in get_args(Terminating):
            if option == self.terminating_pods:
                terminating = option
        return ModelOptions(
            enable_min_quota_scale=self.enable_min_quota_scale,
            guarantee_usage=self.guarantee_usage,
            disable_default_quota=self.disable_default_quota,
            ignore_overhead=self.ignore_pod_overhead,
            terminating=terminating,
        )

    def check_options(self, *, enable_check_parent_quota: bool | None = None) -> CheckOptions:
        return CheckOptions(
            enable_runtime_quota=self.enable_runtime_quota,
            enable_check_parent_quota=(
                self.enable_check_parent_quota if enable_check_parent_quota is None else enable_check_parent_quota
            ),
            support_parent_quota_submit_pod=self.support_parent_quota_submit_pod,
            disable_default_quota=self.disable_default_quota,
            ignore_overhead=self.ignore_pod_overhead,
        )
