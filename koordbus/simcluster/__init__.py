"""The simulated cluster `koordbus up --simulate-nodes` runs around its synthetic nodes: teams with elastic quotas
whose pods are scheduled through the load-aware extender, hot nodes for load-aware descheduling, and the cluster's
side of migrations (pure plans in `teams`, `placement`, `pods` and `descheduling`; the loop in `loop`)."""
