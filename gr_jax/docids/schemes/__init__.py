"""The built-in docid schemes, one module each; importing this package registers every module in it.

A new scheme (cluster ids, residual-quantisation codes, n-gram spans, synset names) is one new module here that
defines a `gr_jax.docids.scheme.DocidScheme` subclass decorated with `register_scheme`: nothing else changes.
"""
import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
