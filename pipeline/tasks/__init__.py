"""The tasks `docscore run --task` can run: name -> Task (pipeline/tasks/base.py). Registering a task is
one module in this package and one line here; every stage asks the Task, none branches on its name."""
from __future__ import annotations

from pipeline.tasks import choice, classify, embed, loglik, similarity
from pipeline.tasks.base import Task

TASKS: dict[str, Task] = {
    "embed": embed.TASK,
    "similarity": similarity.TASK,
    "classify": classify.TASK,
    "loglik": loglik.TASK,
    "choice": choice.TASK,
}


def get(name: str) -> Task:
    """The registered task called `name` (validate.py refuses an unknown --task before this is asked)."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; the tasks are {', '.join(TASKS)}") from None
