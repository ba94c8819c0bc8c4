"""The scheduler: pure filters and scorers over a snapshot of nodes; it computes a plan and
the store commits it.

May import only the vocabulary (orbit.model, orbit.wire)."""
