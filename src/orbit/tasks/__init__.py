"""Task plugins: validate a task request and shape it into a job. Found by name."""

from orbit.tasks.base import ShapedTask, StagedPath, TaskPlugin
from orbit.tasks.registry import TaskRegistry

__all__ = ["ShapedTask", "StagedPath", "TaskPlugin", "TaskRegistry"]
