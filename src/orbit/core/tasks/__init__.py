"""Task plugins: validate a task request and shape it into a job. Found by name.

May import the vocabulary and the scheduler."""

from orbit.core.tasks.registry import TaskRegistry
from orbit.model.task import ShapedTask, StagedPath, TaskPlugin

__all__ = ["ShapedTask", "StagedPath", "TaskPlugin", "TaskRegistry"]
