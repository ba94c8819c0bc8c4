"""The vocabulary every part speaks: records, the state table and reasons, errors, specs,
templates, overrides, settings, launch modes, the task seam. Pure data and rules.

Imports only `orbit.model` and `orbit.wire` (and third-party libraries): the ground floor.
"""
