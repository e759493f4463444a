"""Pure agent plans and arithmetic: filled in with the agent."""
