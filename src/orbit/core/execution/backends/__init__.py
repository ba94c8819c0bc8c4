"""Execution backends, one module per `f"{placement}_{launch_mode}"` key."""

from orbit.core.execution.backends.base import (
    AttemptContext,
    ExecutionBackend,
    LaunchError,
    LogLayer,
)

__all__ = ["AttemptContext", "ExecutionBackend", "LaunchError", "LogLayer"]
