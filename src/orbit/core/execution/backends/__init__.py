"""Execution backends, one module per `f"{placement}_{launch_mode}"` key.

May import what orbit.core.execution may."""

from orbit.core.execution.backends.base import (
    AttemptContext,
    ExecutionBackend,
    LaunchError,
    LogLayer,
)

__all__ = ["AttemptContext", "ExecutionBackend", "LaunchError", "LogLayer"]
