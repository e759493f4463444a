"""koord-manager's admission webhooks (issue 24): the ClusterColocationProfile Pod mutation (colocation.py)."""
