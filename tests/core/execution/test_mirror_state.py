"""The control plane's copy of a pool attempt's agent.json is merged into by several threads of
the server at once (a claim granting its start, a report saying it is alive or ended): no merge
may write over another's."""

from __future__ import annotations

import threading
from pathlib import Path

from orbit.core.execution.mirror import read_agent_state, write_agent_state


def test_merges_from_many_threads_at_once_are_all_kept(tmp_path: Path) -> None:
    folder = tmp_path / "attempt"
    start = threading.Barrier(8)

    def merge(n: int) -> None:
        start.wait()
        for i in range(40):
            write_agent_state(folder, **{f"t{n}": i})

    threads = [threading.Thread(target=merge, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # each thread's last word is there: a claim's `started` is never lost to a report's `alive`
    assert read_agent_state(folder) == {f"t{n}": 39 for n in range(8)}
