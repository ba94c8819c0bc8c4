"""The pure core: records, the state table, retry policy, templates, overrides, spec files and
task plugins. Plain functions over plain data; no I/O beyond reading the files a user names.

The two planes build on it: `orbit.core.control` (CoreControlService, the one API every client
calls) and `orbit.core.execution` (ExecutionService, bundles, backends, launch modes).
"""
