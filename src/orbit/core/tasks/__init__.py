"""Task plugins: validate a task request and shape it into a job. Found by name."""

from orbit.core.tasks.base import ShapedTask, StagedPath, TaskPlugin
from orbit.core.tasks.registry import TaskRegistry

__all__ = ["ShapedTask", "StagedPath", "TaskPlugin", "TaskRegistry"]
