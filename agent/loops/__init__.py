"""The agent's QoS loops, one module each (issue 6), run by agent.qos_loops.QosLoops every round.

Shells over the pure planners (agent.actuate, agent.suppress, agent.evict, agent.burst): each reads what it needs
through agent.loops.base.Actuator (files under their roots, dry-run, counters), writes only differences, and returns
a LoopResult (changes with their reasons, problems, deferred work, eviction victims) for the round's events.
"""
