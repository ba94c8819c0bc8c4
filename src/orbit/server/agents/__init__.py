"""The server's side of the agent protocol (orbit.wire.protocol): /api/v1/agent/*.

Agents authenticate with their node credential (its sha256 looked up per request, so that a
revoked node is refused at once) and can act only for their own node. Long-polls wait on an
event per node, set at once when this process queues a command, and within a second when
another process does (one query a second over all nodes). Heartbeats are gathered in memory and
written in one transaction a second. Every handler is a compare-and-set or an idempotent write:
a message handled twice has the effect of handling it once.

May import what orbit.server may."""
