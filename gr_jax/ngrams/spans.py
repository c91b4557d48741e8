"""n-gram identifiers (MINDER-style, as Cai et al. 2025 train them): a document is identified by the word spans of
its text, and a query is trained to generate spans of its relevant documents that overlap it.

Windows: a document's text split on whitespace into words w_0 .. w_{m-1}; the window at start i is
w_i .. w_{i+width-1} (shorter at the end of the text), so every span the model can generate is a word-aligned
substring of some document. `document_windows` lists them.

Span selection (`select_starts`, the authors' code): each start i is weighted by how well the document's word
3-gram at i matches the query, the best `difflib.SequenceMatcher` ratio (in [0, 1]; fuzzywuzzy's `ratio` / 100)
against any of the query's word 3-grams (lower-cased; a query or document shorter than 3 words is one gram), and
`num_spans` starts are drawn with replacement from softmax(weight / temperature), temperature 1. With ratios in
[0, 1] and temperature 1 the draw is close to uniform (a perfect match is e = 2.7 times as likely as none): the
code's setting, kept.
"""
from __future__ import annotations

import difflib

import numpy as np


def words_of(text: str) -> list[str]:
    return text.split()


def document_windows(words: list[str], *, width: int) -> list[list[str]]:
    """The window at every start (see the module docstring): len(words) windows, the last ones shorter."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    return [words[i:i + width] for i in range(len(words))]


def _grams(words: list[str]) -> list[str]:
    lowered = [w.lower() for w in words]
    if len(lowered) < 3:
        return [" ".join(lowered)]
    return [" ".join(lowered[i:i + 3]) for i in range(len(lowered) - 2)]


def start_weights(query: str, document_words: list[str]) -> np.ndarray:
    """float64[len(document_words)]: the best fuzzy ratio of the document's 3-gram at each start with the query's."""
    query_grams = _grams(words_of(query))
    lowered = [w.lower() for w in document_words]
    weights = np.zeros(len(lowered))
    for i in range(len(lowered)):
        gram = " ".join(lowered[i:i + 3])
        matcher = difflib.SequenceMatcher(None, "", gram, autojunk=False)  # b (cached): the document gram
        best = 0.0
        for other in query_grams:
            matcher.set_seq1(other)
            if matcher.real_quick_ratio() > best and matcher.quick_ratio() > best:
                best = max(best, matcher.ratio())
        weights[i] = best
    return weights


def select_starts(query: str, document_words: list[str], *, num_spans: int, rng: np.random.Generator,
                  temperature: float = 1.0) -> np.ndarray:
    """int64[num_spans]: starts drawn with replacement from softmax(start_weights / temperature)."""
    if not document_words:
        raise ValueError("the document has no words")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits = start_weights(query, document_words) / temperature
    p = np.exp(logits - logits.max())
    return rng.choice(len(document_words), size=num_spans, replace=True, p=p / p.sum())
