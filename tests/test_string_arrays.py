"""Texts as StringDType arrays: an iterator is converted a chunk at a time, in order, and nothing but str passes."""
import pytest
from numpy.dtypes import StringDType

from gr_jax.data import string_arrays


def test_an_iterator_is_converted_in_chunks_in_order(monkeypatch):
    monkeypatch.setattr(string_arrays, "CHUNK", 3)
    texts = [f"query {i} " + "é" * (i % 4) + "x" * (20 * (i % 3)) for i in range(11)]  # inline and arena strings
    chunks = []
    checked = string_arrays._checked
    monkeypatch.setattr(string_arrays, "_checked", lambda part: chunks.append(len(part)) or checked(part))
    array = string_arrays.string_array(iter(texts))
    assert isinstance(array.dtype, StringDType) and array.tolist() == texts and chunks == [3, 3, 3, 2]
    assert string_arrays.string_array(iter([])).shape == (0,)


def test_only_strings_pass():
    assert string_arrays.string_array(("a", "b")).tolist() == ["a", "b"]
    for texts in (["a", 5], iter(["a", b"b"]), [None]):
        with pytest.raises(TypeError, match="expected strings"):
            string_arrays.string_array(texts)
