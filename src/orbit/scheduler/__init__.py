"""The scheduler: pure filters and scorers over a snapshot of nodes; it computes a plan and
the store commits it."""
