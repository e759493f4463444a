"""Settings of the migration service (the arbiter and load-aware descheduling), built once by the composition root
with the shared loader (services.common.settings.load: defaults, then KOORDBUS_MIGRATION_* or the shared KOORDBUS_*
variables, then overrides):
koordbus.parts.migration_settings reads the MigrationControllerArgs file (--args-file, else
KOORDBUS_MIGRATION_ARGS_FILE) into `args`, `low_node_load` and `low_node_load_args` and passes them as overrides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from services.common.sloconfig import CONFIGMAP_NAME, CONFIGMAP_NAMESPACE
from services.migration.args import MigrationArgs
from services.migration.lownodeload import LowNodeLoadArgs
from services.migration.lownodeload_round import Descheduling


@dataclass(frozen=True, kw_only=True)
class MigrationSettings:
    ENV_PREFIX: ClassVar[str] = "KOORDBUS_MIGRATION_"
    """Each field from KOORDBUS_MIGRATION_<FIELD>, else the shared KOORDBUS_<FIELD> (services.common.settings)."""

    args: MigrationArgs = field(default_factory=MigrationArgs)
    """MigrationControllerArgs (Koordinator's names; a file of them via the CLI)."""
    instance: str = ""
    """Names this replica's consumers; replicas running at once need distinct names."""
    startup_timeout_seconds: float = 60.0
    """start() waits for the replay of each stream as long as it makes progress; after this many seconds without an
    event it starts with what was read (and logs a warning)."""
    low_node_load: LowNodeLoadArgs = field(default_factory=LowNodeLoadArgs)
    """The older simplified load-aware descheduling (off unless enabled): its thresholds, debounce and interval.
    Used only when `low_node_load_args` is None."""
    low_node_load_args: Descheduling | None = None
    """Koordinator's LowNodeLoad (the args file's `lowNodeLoadArgs` section with deschedulingInterval and the
    maxNoOfPodsToEvict* limits; services.migration.lownodeload_round): when set, the descheduling round is
    Koordinator's Balance round and `low_node_load` is not used."""
    configmap_namespace: str = CONFIGMAP_NAMESPACE
    configmap_name: str = CONFIGMAP_NAME
    """The slo-controller-config ConfigMap whose load-watermarks-config overrides low_node_load's thresholds and
    staleness bound (the ones the load-aware scheduler filters with)."""
    catch_up_timeout_seconds: float = 5.0
    """How long a round waits for the state to contain this service's previous round before it gives up (and
    tries again next interval)."""
