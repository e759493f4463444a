"""What every service shares: database engines, settings loading, health and metrics."""
