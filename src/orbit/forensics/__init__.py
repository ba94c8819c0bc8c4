"""Reading what a run left behind: the evidence files, `inspect` (which layer went wrong),
`diff` (what differs between two runs) and progress from logging.jsonl.

May import only the vocabulary (orbit.model, orbit.wire)."""
