"""The two planes: `orbit.core.control` (CoreControlService, the one API every client calls)
and `orbit.core.execution` (ExecutionService, bundles, backends), with the task plugins.

Imports the vocabulary (`orbit.model`, `orbit.wire`), the store, the scheduler and forensics.
"""
