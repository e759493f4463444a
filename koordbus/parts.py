"""The control-plane services' parts that `koordbus up` and `koordbus service <name>` both start: settings read at
the edge (a bad args file stops the process with one line) and the services started on an open bus and database."""

from __future__ import annotations

import os
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from services.common import settings as settings_loader


async def start_quota(stack: AsyncExitStack, bus: Any, engine: Any, registry: Any) -> tuple[Any, Any]:
    """The quota service (settings from KOORDBUS_* variables) with its projections; returns (service, store)."""
    from services.quota.service import QuotaService
    from services.quota.settings import QuotaSettings
    from services.quota.store import QuotaStore

    store = QuotaStore(engine)
    service = QuotaService(bus, settings_loader.load(QuotaSettings), registry=registry, store=store)
    await service.start()
    stack.push_async_callback(service.stop)
    return service, store


def migration_settings(args_file: str | None) -> Any:
    """MigrationSettings from the args file (if any) and KOORDBUS_INSTANCE; exits with a clear line when unusable."""
    import msgspec

    from services.migration.args import ArgsError, MigrationArgs, load_args, low_node_load_section
    from services.migration.lownodeload import LowNodeLoadArgs
    from services.migration.service import MigrationSettings

    migration_args, descheduling = MigrationArgs(), LowNodeLoadArgs()
    if args_file:
        try:
            text = Path(args_file).read_text(encoding="utf-8")
            migration_args = load_args(text, source=args_file)
            descheduling = msgspec.convert(low_node_load_section(text, source=args_file), LowNodeLoadArgs)
        except (OSError, UnicodeDecodeError, ArgsError, msgspec.ValidationError) as e:
            raise SystemExit(f"koordbus: migration args: {e}") from None
    return MigrationSettings(
        args=migration_args, low_node_load=descheduling, instance=os.environ.get("KOORDBUS_INSTANCE", "")
    )


async def start_migration(stack: AsyncExitStack, bus: Any, registry: Any, settings: Any, *, engine: Any = None) -> Any:
    """The arbiter, projecting into the database when `engine` is given."""
    from services.migration.service import MigrationService
    from services.migration.store import MigrationStore

    store = MigrationStore(engine) if engine is not None else None
    service = MigrationService(bus, settings, registry=registry, store=store)
    await service.start()
    stack.push_async_callback(service.stop)
    return service


def loadaware_args(path: str) -> Any:
    """LoadAwareSchedulingArgs from `path` (Koordinator's defaults when empty); exits with one line when unusable."""
    from services.loadaware.args import DEFAULT_ARGS, ArgsError, load_args

    if not path:
        return DEFAULT_ARGS
    try:
        return load_args(Path(path).read_text(encoding="utf-8"), source=path)
    except (OSError, UnicodeDecodeError, ArgsError) as e:
        raise SystemExit(f"koordbus: loadaware args: {e}") from None
