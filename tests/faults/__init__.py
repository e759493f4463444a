"""Failure tolerance: real processes killed, stopped and slowed down while koordbus works (marker `faults`)."""
