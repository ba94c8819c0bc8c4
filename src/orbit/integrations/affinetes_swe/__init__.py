"""affinetes, the black-box upstream: `task_type: affinetes` (task.py) runs one environment of
AffineFoundation/affinetes at an exact commit, its actor's evaluate() called as upstream wrote
it (launch.py, on the node), with a thin manifest beside upstream's raw results.

task.py may import the vocabulary and the planes; launch.py, which runs on the node, imports
only the standard library and orbit.runtime's git_tree (staged beside it)."""
