"""ORBIT's jobs in a cluster's queue, told apart from everyone else's by both of ORBIT's marks:
the job name `orbit-ATTEMPT` and the comment `orbit:run=RUN,attempt=ATTEMPT[,plane=PLANE]`
that scripts/slurm.sbatch sets. A job lacking either, or whose two marks disagree, is not
ORBIT's and is never listed or touched. Pure: `SQUEUE` is what to run; the parser reads it."""

from __future__ import annotations

import re
from dataclasses import dataclass

# the caller's own jobs, still in the queue: id, state, comment, then the name (a name may hold
# the separator; it is last, and a comment holding it no longer reads as ORBIT's)
SQUEUE = ["squeue", "--me", "-h", "-o", "%i|%T|%k|%j"]
COMMENT = re.compile(r"orbit:run=([\w.-]+),attempt=([\w.-]+)(?:,plane=([\w.-]+))?")


def comment(run_id: str, attempt_id: str, plane: str) -> str:
    return f"orbit:run={run_id},attempt={attempt_id}" + (f",plane={plane}" if plane else "")


@dataclass(frozen=True)
class MarkedJob:
    job_id: str
    state: str
    run_id: str
    attempt_id: str
    plane: str | None


def parse_marked(text: str) -> list[MarkedJob]:
    found = []
    for line in text.splitlines():
        parts = line.strip().split("|", 3)
        if len(parts) != 4 or not parts[0]:
            continue
        job_id, state, note, name = parts
        marks = COMMENT.fullmatch(note.strip())
        if marks is None or name.strip() != f"orbit-{marks.group(2)}":
            continue
        found.append(
            MarkedJob(job_id, state.split()[0], marks.group(1), marks.group(2), marks.group(3))
        )
    return found
