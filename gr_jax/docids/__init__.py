"""Docids: the table of every document's token sequence, the schemes that make it, the trie that constrains
decoding to it, and the `DocidSpace` a run builds once from them (see `gr_jax.docids.space`)."""
from gr_jax.docids.table import DocidTable, ExtendedDocidTable
from gr_jax.docids.trie import Trie
from gr_jax.docids.scheme import SCHEMES, DocidScheme, get_scheme, register_scheme
from gr_jax.docids.space import DocidSpace, docid_table_path, load_docid_space, load_docid_table
from gr_jax.docids import schemes  # noqa: F401  (registers the built-in schemes)

__all__ = ["SCHEMES", "DocidScheme", "DocidSpace", "DocidTable", "ExtendedDocidTable", "Trie", "docid_table_path",
           "get_scheme", "load_docid_space", "load_docid_table", "register_scheme"]
