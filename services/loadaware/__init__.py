"""Load-aware scheduling offered to kube-scheduler as an extender (issue 9, spec §6)."""
