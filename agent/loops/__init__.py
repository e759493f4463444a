"""The agent's QoS loops, one module each (issue 6), run by agent.loops.runner.QosLoops every round.

Shells over the pure planners: a loop is named after the pure module it runs (agent/loops/burst.py runs
agent/burst.py, evict.py agent/evict.py, suppress.py agent/suppress.py); the be-cgroup and resctrl loops
(cgroups.py, resctrl.py) share agent/qos.py's values, and every loop plans its writes with agent/actuate.py. Each
reads what it needs through agent.loops.base.Actuator (files under their roots, dry-run, counters), writes only
differences, and returns a LoopResult (changes with their reasons, problems, deferred work, eviction victims) for
the round's events.
"""
