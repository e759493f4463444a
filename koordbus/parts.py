"""The control-plane services' parts that `koordbus up` and `koordbus service <name>` both start: settings read at
the edge (a bad args file stops the process with one line) and the services started on an open bus and database."""

from __future__ import annotations

import os
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from services.common import settings as settings_loader


def migration_settings(args_file: str | None) -> Any:
    """MigrationSettings from the args file (`args_file`, else KOORDBUS_MIGRATION_ARGS_FILE; if any: its
    MigrationControllerArgs and its lowNodeLoad or lowNodeLoadArgs section) and the KOORDBUS_MIGRATION_* /
    KOORDBUS_* variables (services.common.settings.load); exits with a clear line when unusable."""
    import msgspec

    from services.common.args import ArgsError, load_document
    from services.migration.args import MigrationArgs, load_args, low_node_load_section
    from services.migration.lownodeload import LowNodeLoadArgs
    from services.migration.lownodeload_round import read_section
    from services.migration.settings import MigrationSettings

    migration_args, descheduling, koordinator_descheduling = MigrationArgs(), LowNodeLoadArgs(), None
    args_file = args_file or os.environ.get("KOORDBUS_MIGRATION_ARGS_FILE")  # migration's own: no shared fallback
    if args_file:
        try:
            text = Path(args_file).read_text(encoding="utf-8")
            migration_args = load_args(text, source=args_file)
            koordinator_descheduling = read_section(load_document(text, source=args_file), source=args_file)
            descheduling = msgspec.convert(low_node_load_section(text, source=args_file), LowNodeLoadArgs)
        except (OSError, UnicodeDecodeError, ArgsError, msgspec.ValidationError) as e:
            raise SystemExit(f"koordbus: migration args: {e}") from None
    try:
        return settings_loader.load(
            MigrationSettings,
            {
                "args": migration_args,
                "low_node_load": descheduling,
                "low_node_load_args": koordinator_descheduling,
            },
        )
    except settings_loader.SettingsError as e:
        raise SystemExit(f"koordbus: migration settings: {e}") from None


async def start_migration(stack: AsyncExitStack, bus: Any, registry: Any, settings: Any, *, engine: Any = None) -> Any:
    """The arbiter, projecting into the database when `engine` is given."""
    from services.migration.service import MigrationService
    from services.migration.store import MigrationStore

    store = MigrationStore(engine) if engine is not None else None
    service = MigrationService(bus, settings, registry=registry, store=store)
    await service.start()
    stack.push_async_callback(service.stop)
    return service


async def start_migration_executor(stack: AsyncExitStack, bus: Any, registry: Any, settings: Any) -> Any:
    """The executor of passed jobs, beside the arbiter and with its settings; the bridge carries out its verbs."""
    from services.migration.executor import MigrationExecutor

    executor = MigrationExecutor(bus, settings.args, registry=registry, instance=settings.instance)
    await executor.start()
    stack.push_async_callback(executor.stop)
    return executor


def loadaware_args(path: str) -> Any:
    """LoadAwareSchedulingArgs from `path` (Koordinator's defaults when empty); exits with one line when unusable."""
    from services.common.args import ArgsError
    from services.loadaware.args import DEFAULT_ARGS, load_args

    if not path:
        return DEFAULT_ARGS
    try:
        return load_args(Path(path).read_text(encoding="utf-8"), source=path)
    except (OSError, UnicodeDecodeError, ArgsError) as e:
        raise SystemExit(f"koordbus: loadaware args: {e}") from None
