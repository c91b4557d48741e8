"""Sparse-coded docids (SToICaL's ESCI setting, `rozonoyer_stoical_autoregressive_ranking.txt` §5.1 and footnote 9):
each document's embedding is coded over a learned dictionary of `atoms` atoms with `nonzeros` non-zero coefficients
by scikit-learn's orthogonal matching pursuit (OMP); its id is the chosen atoms sorted by |coefficient|, largest first
("25,36,39"), ties to the lower atom.

    python -m gr_jax.tools.semantic_ids --data_dir DIR --scheme sparse [--atoms 100 --nonzeros 3 --alpha 1.0
                                        --iterations 1000 --seed 0]

The dictionary and the codes are scikit-learn's, as the paper's ("the omp algorithm available in scikit-learn, with
`n_components=100` and `transform_n_nonzero_coefs=3`"): `MiniBatchDictionaryLearning(n_components=atoms,
transform_algorithm='omp', transform_n_nonzero_coefs=nonzeros, alpha=alpha, max_iter=iterations,
random_state=seed)`, every other parameter scikit-learn's default; the codes are its `transform`, a chunk of
documents at a time. Why the mini-batch class rather than `DictionaryLearning` (same parameters, same OMP
transform): the full one codes every document by LARS at every iteration and holds all codes (N x atoms) and an SVD
of the whole matrix, which does not fit a collection of 8.8M passages; the mini-batch one fits on batches of 256 and
stops when its cost stops improving (scikit-learn's `max_no_improvement`), so its fit does not grow with N beyond
one randomized SVD for the first atoms. `iterations` is its `max_iter` (passes over the documents at most; the
default is scikit-learn's). `alpha` is the fit's lasso penalty (scikit-learn's default, 1, the paper's as far as it
says): a lasso code is zero when no atom correlates with the document by more than alpha, so on unit-norm embeddings
(MiniLM's) at alpha 1, once the atoms are projected to norm <= 1 after the first mini-batch, every fit code is zero
and the dictionary learns from no later mini-batch (it keeps what the first gave and documents scikit-learn draws for
unused atoms). A lower alpha (0.1) keeps every mini-batch in the fit.

Tokens: atom a is the new token `vocab_size + a` at every position, appended after the vocabulary. Why not the
vocabulary's digit pieces (as the semantic scheme): an atom is one direction of the dictionary whatever its rank, as
the paper writes the same numeral wherever it appears, and one token per atom keeps an id `nonzeros` tokens long
(the paper wants ids short enough to generate pointwise) with every step a choice among the atoms (the trie
branches on the strongest atom first; the docid vocabulary is the dictionary, close to the model's width as §3
wants), where digits would take two steps per atom and put atoms 20..29 under one "2".

Collisions: documents with the same atoms in the same order (the paper's ids collide: "[25,36,39]" twice in its
App. B prompt) each get a collision position after their atoms, `vocab_size + atoms + j` with j their index in
collection order among them, as codebook ids do; a unique id ends with EOS right after its atoms. So every docid is
unique, and `read_sparse_docid` gives back its atoms and collision index.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import tqdm

from gr_jax.docids.codebook_ids import collision_indices
from gr_jax.docids.kmeans import check_embeddings
from gr_jax.docids.scheme import PrebuiltScheme, PrebuiltTable, option, register_scheme
from gr_jax.docids.schemes.semantic import check_docids
from gr_jax.docids.table import (DocidTable, ExtendedDocidTable, appended_tokens_problem,
                                 check_appended_vocab_size)
from gr_jax.vocabulary import EOS_ID, PAD_ID

if TYPE_CHECKING:
    from sklearn.decomposition import MiniBatchDictionaryLearning

# Documents coded at a time: bounds the dense codes and scikit-learn's Gram products of a chunk.
_CHUNK = 16_384
_NO_ATOM = -1


@dataclasses.dataclass(frozen=True)
class SparseSettings:
    """scikit-learn's dictionary learning and OMP codes of the sparse scheme (`build_sparse_ids`)."""

    atoms: int = option(100, "dictionary atoms, scikit-learn's n_components (SToICaL's ESCI: 100)")
    nonzeros: int = option(3, "atoms per document, scikit-learn's transform_n_nonzero_coefs (SToICaL's ESCI: 3)")
    alpha: float = option(1.0, "the dictionary fit's lasso penalty, scikit-learn's alpha (its default)")
    iterations: int = option(1000, "passes over the documents at most, scikit-learn's max_iter (its default)")
    seed: int = option(0, "scikit-learn's random_state (first atoms, mini-batches, re-drawn atoms)")


@register_scheme
class SparseScheme(PrebuiltScheme[SparseSettings]):
    name = "sparse"
    description = "the atoms of an OMP code over a learnt dictionary, by |coefficient| (SToICaL's ESCI)"
    settings_type = SparseSettings

    def from_embeddings(self, *, docids, embeddings, vocabulary, settings, show_progress=False) -> PrebuiltTable:
        ids = build_sparse_ids(embeddings=embeddings, atoms=settings.atoms, nonzeros=settings.nonzeros,
                               alpha=settings.alpha, iterations=settings.iterations, seed=settings.seed,
                               show_progress=show_progress)
        return PrebuiltTable(extended=sparse_docid_table(docids=docids, ids=ids, vocab_size=vocabulary.vocab_size),
                             diagnostics=ids.stats.to_json())

    def check(self, table, *, vocabulary, rows) -> str | None:
        return appended_tokens_problem(table, vocab_size=vocabulary.vocab_size)


@dataclasses.dataclass(frozen=True)
class SparseIdStats:
    """Diagnostics of sparse ids: how many distinct ids, how many documents share theirs with another (and got a
    collision position), how many atom sets occur in several orders, and how well the codes fit.

    relative_residual: the mean ||x - code @ D|| / ||x|| of the ids' codes; fit_passes, fit_steps: scikit-learn's
      `n_iter_` and `n_steps_` (passes over the documents and mini-batches before it stopped).
    """

    documents: int
    atoms: int
    nonzeros: int
    unique_ids: int
    colliding_documents: int
    collision_groups: int
    largest_collision_group: int
    distinct_atom_sets: int
    short_codes: int
    atoms_used: int
    relative_residual: float
    fit_passes: int
    fit_steps: int

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["relative_residual"] = round(self.relative_residual, 6)
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class SparseIds:
    """Each document's sparse id (row i: document i of the embedding matrix).

    atoms: int32[N, nonzeros], its atoms by |coefficient|, largest first (ties: the lower atom), -1 after the last
      when OMP stopped early; coefficients: float64[N, nonzeros] in the same order, 0 after the last;
    collision: int32[N], its index among the documents with the same atoms (in row order) when there are several,
      else -1; num_atoms: the dictionary's size; dictionary: float64[num_atoms, dim], scikit-learn's `components_`;
    relative_residual, fit_passes, fit_steps: as in `SparseIdStats`.
    """

    atoms: np.ndarray
    coefficients: np.ndarray
    collision: np.ndarray
    num_atoms: int
    dictionary: np.ndarray
    relative_residual: float = 0.0
    fit_passes: int = 0
    fit_steps: int = 0

    def __len__(self) -> int:
        return self.atoms.shape[0]

    @property
    def max_collisions(self) -> int:
        """The largest collision index + 1 (0 when every id is unique)."""
        return int(self.collision.max()) + 1 if len(self) else 0

    def id_of(self, row: int) -> tuple[int, ...]:
        """Document `row`'s atoms, largest |coefficient| first (the paper's "25,36,39")."""
        return tuple(int(a) for a in self.atoms[row] if a != _NO_ATOM)

    @property
    def stats(self) -> SparseIdStats:
        colliding = self.collision >= 0
        lengths = (self.atoms != _NO_ATOM).sum(axis=1)
        atom_sets = np.sort(self.atoms, axis=1)
        return SparseIdStats(
            documents=len(self), atoms=self.num_atoms, nonzeros=self.atoms.shape[1],
            unique_ids=len(self) - int(colliding.sum()) + int((self.collision == 0).sum()),
            colliding_documents=int(colliding.sum()), collision_groups=int((self.collision == 0).sum()),
            largest_collision_group=self.max_collisions,
            distinct_atom_sets=int(np.unique(atom_sets, axis=0).shape[0]) if len(self) else 0,
            short_codes=int((lengths < self.atoms.shape[1]).sum()),
            atoms_used=int(np.unique(self.atoms[self.atoms != _NO_ATOM]).size),
            relative_residual=self.relative_residual, fit_passes=self.fit_passes, fit_steps=self.fit_steps)


class OmpCoder(Protocol):
    """What codes documents: a fitted scikit-learn `MiniBatchDictionaryLearning` or `SparseCoder` with OMP."""

    def transform(self, X: np.ndarray) -> np.ndarray: ...

    def inverse_transform(self, X: np.ndarray) -> np.ndarray: ...


def order_by_magnitude(codes: np.ndarray, *, nonzeros: int) -> tuple[np.ndarray, np.ndarray]:
    """(atoms int32[n, nonzeros], coefficients float64[n, nonzeros]) of dense codes float[n, num_atoms]: each row's
    non-zero entries sorted by |coefficient|, largest first (ties: the lower atom), -1 and 0 after the last."""
    codes = np.asarray(codes, np.float64)
    counts = np.count_nonzero(codes, axis=1)
    if (counts > nonzeros).any():
        raise ValueError(f"code of row {int(np.argmax(counts > nonzeros))} has {int(counts.max())} non-zeros, "
                         f"more than {nonzeros}")
    order = np.argsort(-np.abs(codes), axis=1, kind="stable")[:, :nonzeros]
    coefficients = np.take_along_axis(codes, order, axis=1)
    kept = coefficients != 0
    return np.where(kept, order, _NO_ATOM).astype(np.int32), np.where(kept, coefficients, 0.0)


def sparse_codes(*, coder: OmpCoder, embeddings: np.ndarray,
                 nonzeros: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`coder.transform` (scikit-learn's OMP) over every document, `_CHUNK` at a time: (atoms int32[N, nonzeros],
    coefficients float64[N, nonzeros] as `order_by_magnitude`, relative residual ||x - code @ D|| / ||x||
    float64[N])."""
    n = embeddings.shape[0]
    atoms = np.empty((n, nonzeros), np.int32)
    coefficients = np.empty((n, nonzeros), np.float64)
    relative = np.empty(n, np.float64)
    for start in range(0, n, _CHUNK):
        signals = np.asarray(embeddings[start:start + _CHUNK])
        codes = coder.transform(signals)
        atoms[start:start + _CHUNK], coefficients[start:start + _CHUNK] = order_by_magnitude(codes,
                                                                                           nonzeros=nonzeros)
        signals = signals.astype(np.float64)
        relative[start:start + _CHUNK] = (np.linalg.norm(signals - coder.inverse_transform(codes), axis=1)
                                          / np.linalg.norm(signals, axis=1))
    return atoms, coefficients, relative


def learn_dictionary(*, embeddings: np.ndarray, atoms: int, nonzeros: int, alpha: float, iterations: int,
                     seed: int) -> MiniBatchDictionaryLearning:
    """scikit-learn's dictionary of `atoms` atoms for the rows of `embeddings` float[N, dim], fitted, its transform
    OMP with `nonzeros` non-zeros (see the module docstring)."""
    # Imported here: scikit-learn's import (with scipy's) costs every process that registers the schemes about a
    # second, and only this offline build uses it.
    from sklearn.decomposition import MiniBatchDictionaryLearning
    learner = MiniBatchDictionaryLearning(n_components=atoms, alpha=alpha, max_iter=iterations,
                                          transform_algorithm="omp", transform_n_nonzero_coefs=nonzeros,
                                          random_state=seed)
    return learner.fit(np.asarray(embeddings))


def build_sparse_ids(*, embeddings: np.ndarray, atoms: int = 100, nonzeros: int = 3, alpha: float = 1.0,
                     iterations: int = 1000, seed: int = 0, show_progress: bool = False) -> SparseIds:
    """Sparse ids of the rows of `embeddings` float[N, dim] (an array or a read-only memmap; see the module
    docstring). Deterministic for a given `seed`."""
    check_embeddings(embeddings)
    n = embeddings.shape[0]
    if not 1 <= nonzeros <= atoms:
        raise ValueError(f"need 1 <= nonzeros <= atoms, got nonzeros={nonzeros}, atoms={atoms}")
    if iterations < 1:
        raise ValueError(f"iterations (scikit-learn's max_iter) must be >= 1, got {iterations}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if n < atoms:
        raise ValueError(f"{n} documents cannot start a dictionary of {atoms} atoms: lower atoms")
    for start in range(0, n, _CHUNK):
        zero = np.flatnonzero(~np.asarray(embeddings[start:start + _CHUNK]).any(axis=1))
        if zero.size:
            raise ValueError(f"embedding row {start + int(zero[0])} is zero: it has no sparse code")
    with tqdm.tqdm(total=2, desc="dictionary learning, OMP codes", disable=not show_progress) as progress:
        learner = learn_dictionary(embeddings=embeddings, atoms=atoms, nonzeros=nonzeros, alpha=alpha,
                                   iterations=iterations, seed=seed)
        progress.update()
        chosen, coefficients, relative = sparse_codes(coder=learner, embeddings=embeddings, nonzeros=nonzeros)
        progress.update()
    empty = np.flatnonzero((chosen == _NO_ATOM).all(axis=1))
    if empty.size:
        raise ValueError(f"embedding row {int(empty[0])} has no atom: it is orthogonal to every atom of the dictionary")
    return SparseIds(atoms=chosen, coefficients=coefficients, collision=collision_indices(chosen), num_atoms=atoms,
                     dictionary=np.asarray(learner.components_, np.float64), relative_residual=float(relative.mean()),
                     fit_passes=int(learner.n_iter_), fit_steps=int(learner.n_steps_))


def sparse_docid_table(*, docids: Sequence[str], ids: SparseIds, vocab_size: int) -> ExtendedDocidTable:
    """tokens int32[N, <= nonzeros + 2]: atom a as `vocab_size + a`, then the collision position
    `vocab_size + num_atoms + j` of a colliding document, then EOS; num_extra_tokens = num_atoms + max_collisions."""
    docids = check_docids(docids, len(ids))
    num_extra_tokens = ids.num_atoms + ids.max_collisions
    check_appended_vocab_size(vocab_size, num_extra_tokens)
    n, nonzeros = ids.atoms.shape
    lengths = (ids.atoms != _NO_ATOM).sum(axis=1)
    tokens = np.full((n, nonzeros + 2), PAD_ID, np.int64)
    tokens[:, :nonzeros] = np.where(ids.atoms != _NO_ATOM, vocab_size + ids.atoms.astype(np.int64), PAD_ID)
    colliding = ids.collision >= 0
    tokens[np.flatnonzero(colliding), lengths[colliding]] = vocab_size + ids.num_atoms + ids.collision[colliding]
    ends = lengths + colliding
    tokens[np.arange(n), ends] = EOS_ID
    tokens = tokens[:, :int(ends.max(initial=0)) + 1]
    return ExtendedDocidTable(table=DocidTable(docids=docids, tokens=tokens.astype(np.int32)), vocab_size=vocab_size,
                              num_extra_tokens=num_extra_tokens)
