"""Batch and mid overcommit resources (spec §2): colocation config, the pure calculation, the service shell."""
