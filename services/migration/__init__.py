"""Pod migration (spec §4): PodMigrationJob arbitration, its filters, limits and order."""
