"""Example targets shipped with the orchestrator (libraries a workflow can run against)."""
