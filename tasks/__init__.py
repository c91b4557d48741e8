"""seqio Tasks and Mixtures of gr_jax: register a data dir's tasks with
`register_dataset(name=..., data_dir=..., docid_space=load_docid_space(data_dir=..., docid_scheme=...))`.

Nothing is registered on import: tasks need a data dir (and its `spm.model`), which entry points or gin provide.
Names: `{dataset}.{representation}.{scheme}` for Tasks and `{dataset}.{row}.{scheme}` for Mixtures, `row` being a
row name (`firstp_labeled`) or its table id (`2a`). Installed as `gr_jax.tasks`.
"""
import importlib

# name -> the submodule defining it. Imported on first use (PEP 562), so that `tasks.load_docid_space` and
# `tasks.RepresentationOptions` work without TensorFlow; the seqio tasks (`tasks.retrieval`) need it.
_EXPORTS = {
    "MIXTURE_ROWS": "retrieval", "REPRESENTATIONS": "retrieval", "ROW_IDS": "retrieval", "Representation": "retrieval",
    "mixture_name": "retrieval", "register_dataset": "retrieval", "row_name": "retrieval", "task_name": "retrieval",
    "unregister_dataset": "retrieval", "RepresentationOptions": "options", "load_docid_space": "docid_space",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
