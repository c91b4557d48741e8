"""seqio Tasks and Mixtures of gr_jax: register a data dir's tasks with
`register_dataset(name=..., data_dir=..., docid_space=load_docid_space(data_dir=..., docid_scheme=...))`.

Nothing is registered on import: tasks need a data dir (and its `spm.model`), which entry points or gin provide.
Names: `{dataset}.{representation}.{scheme}` for Tasks and `{dataset}.{row}.{scheme}` for Mixtures, `row` being a
row name (`firstp_labeled`) or its table id (`2a`). Installed as `gr_jax.tasks`.
"""
from gr_jax.tasks.options import RepresentationOptions
from gr_jax.tasks.retrieval import (
    MIXTURE_ROWS,
    REPRESENTATIONS,
    ROW_IDS,
    Representation,
    load_docid_space,
    mixture_name,
    register_dataset,
    row_name,
    task_name,
    unregister_dataset,
)

__all__ = ["MIXTURE_ROWS", "REPRESENTATIONS", "ROW_IDS", "Representation", "RepresentationOptions", "load_docid_space",
           "mixture_name", "register_dataset", "row_name", "task_name", "unregister_dataset"]
