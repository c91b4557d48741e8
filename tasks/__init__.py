"""seqio Tasks and Mixtures of gr_jax: register a data dir's tasks with `register_dataset(name=..., data_dir=...)`.

Nothing is registered on import: tasks need a data dir (and its `spm.model`), which entry points or gin
(`tasks.register_dataset`) provide. Names: `{dataset}.{representation}.{scheme}` for Tasks and
`{dataset}.{row}.{scheme}` for Mixtures, `row` being a row name (`firstp_labeled`) or its table id (`2a`).
"""
from tasks.docid_tables import DOCID_SCHEMES
from tasks.options import RepresentationOptions
from tasks.retrieval import (
    MIXTURE_ROWS,
    REPRESENTATIONS,
    ROW_IDS,
    Representation,
    docid_token_range,
    docid_vocab_size,
    mixture_name,
    register_dataset,
    row_name,
    task_name,
    unregister_dataset,
)

__all__ = ["DOCID_SCHEMES", "MIXTURE_ROWS", "REPRESENTATIONS", "ROW_IDS", "Representation", "RepresentationOptions",
           "docid_token_range", "docid_vocab_size", "mixture_name", "register_dataset", "row_name", "task_name",
           "unregister_dataset"]
