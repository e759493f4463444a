"""Pure nodemetric calculations (spec §1.5–1.6): filled in with the nodemetric service."""
