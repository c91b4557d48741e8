"""seqio Tasks and Mixtures of gr_jax: register a data dir's tasks with `register_dataset(name=..., data_dir=...)`.

Nothing is registered on import: tasks need a data dir (and its `spm.model`), which entry points or gin
(`tasks.register_dataset`) provide.
"""
from tasks.retrieval import (
    MIXTURE_ROWS,
    REPRESENTATIONS,
    Representation,
    mixture_name,
    register_dataset,
    task_name,
    unregister_dataset,
)

__all__ = ["MIXTURE_ROWS", "REPRESENTATIONS", "Representation", "mixture_name", "register_dataset", "task_name",
           "unregister_dataset"]
