"""Sparse-coded docids (SToICaL's ESCI setting, `rozonoyer_stoical_autoregressive_ranking.txt` §5.1): each document's
embedding is coded over a learned dictionary of `atoms` atoms with `nonzeros` non-zero coefficients by orthogonal
matching pursuit (OMP); its id is the chosen atoms sorted by |coefficient|, largest first ("25,36,39").

    python -m gr_jax.tools.semantic_ids --data_dir DIR --scheme sparse [--atoms 100 --nonzeros 3 --iterations 20
                                        --seed 0]

The paper codes with scikit-learn's OMP (`n_components=100`, `transform_n_nonzero_coefs=3`). Here OMP is
`orthogonal_matching_pursuit`, the algorithm of scikit-learn's `orthogonal_mp_gram` (the atom most correlated with
the residual, the first on ties; all coefficients refit by least squares; a document stops early when the best atom
is one it has or the correlation underflows), vectorised over documents; scikit-learn is no dependency.
The dictionary is learnt by alternating those OMP codes with the least-squares dictionary for them (the method of
optimal directions), atoms kept at unit norm, an atom no document uses re-seeded with the worst-coded document;
it starts from `atoms` distinct documents drawn with `seed`. (scikit-learn's `DictionaryLearning` fits with lasso
codes and codes with OMP only at transform: learning with the codes that make the ids fits the dictionary to them.)

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

import numpy as np
import tqdm

from gr_jax.docids.codebook_ids import collision_indices
from gr_jax.docids.kmeans import check_embeddings
from gr_jax.docids.scheme import PrebuiltScheme, PrebuiltTable, option, register_scheme
from gr_jax.docids.schemes.semantic import check_docids
from gr_jax.docids.table import (DocidTable, ExtendedDocidTable, appended_tokens_problem,
                                 check_appended_vocab_size)
from gr_jax.vocabulary import EOS_ID, PAD_ID

# Documents coded at a time: bounds the float64 copies of a chunk (~50 MB for 384 dimensions).
_CHUNK = 16_384
_NO_ATOM = -1


@dataclasses.dataclass(frozen=True)
class SparseSettings:
    """The dictionary and the OMP codes of the sparse scheme (`build_sparse_ids`)."""

    atoms: int = option(100, "dictionary atoms (SToICaL's ESCI: 100)")
    nonzeros: int = option(3, "atoms per document, chosen by OMP (SToICaL's ESCI: 3)")
    iterations: int = option(20, "dictionary learning iterations (OMP codes, then the least-squares dictionary)")
    seed: int = option(0, "seed of the dictionary's first atoms")


@register_scheme
class SparseScheme(PrebuiltScheme[SparseSettings]):
    name = "sparse"
    description = "the atoms of an OMP code over a learnt dictionary, by |coefficient| (SToICaL's ESCI)"
    settings_type = SparseSettings

    def from_embeddings(self, *, docids, embeddings, vocabulary, settings, show_progress=False) -> PrebuiltTable:
        ids = build_sparse_ids(embeddings=embeddings, atoms=settings.atoms, nonzeros=settings.nonzeros,
                               iterations=settings.iterations, seed=settings.seed, show_progress=show_progress)
        return PrebuiltTable(extended=sparse_docid_table(docids=docids, ids=ids, vocab_size=vocabulary.vocab_size),
                             diagnostics=ids.stats.to_json())

    def check(self, table, *, vocabulary, rows) -> str | None:
        return appended_tokens_problem(table, vocab_size=vocabulary.vocab_size)


@dataclasses.dataclass(frozen=True)
class SparseIdStats:
    """Diagnostics of sparse ids: how many distinct ids, how many documents share theirs with another (and got a
    collision position), how many atom sets occur in several orders, and how well the codes fit.

    relative_residual_by_iteration: the mean ||x - code @ D|| / ||x|| of the codes of each dictionary, the first
      one drawn from the documents, the last one the ids'.
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
    relative_residual_by_iteration: tuple[float, ...]

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        out["relative_residual_by_iteration"] = [round(v, 6) for v in self.relative_residual_by_iteration]
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class SparseIds:
    """Each document's sparse id (row i: document i of the embedding matrix).

    atoms: int32[N, nonzeros], its atoms by |coefficient|, largest first (ties: the lower atom), -1 after the last
      when OMP stopped early; coefficients: float64[N, nonzeros] in the same order, 0 after the last;
    collision: int32[N], its index among the documents with the same atoms (in row order) when there are several,
      else -1; num_atoms: the dictionary's size; dictionary: float64[num_atoms, dim], unit-norm rows.
    """

    atoms: np.ndarray
    coefficients: np.ndarray
    collision: np.ndarray
    num_atoms: int
    dictionary: np.ndarray
    relative_residuals: tuple[float, ...]

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
            relative_residual_by_iteration=self.relative_residuals)


def orthogonal_matching_pursuit(*, dictionary: np.ndarray, signals: np.ndarray,
                                nonzeros: int) -> tuple[np.ndarray, np.ndarray]:
    """(atoms int32[n, nonzeros] in the order OMP chose them, -1 after an early stop; their coefficients
    float64[n, nonzeros], 0 there): OMP codes of `signals` float[n, dim] over `dictionary` float[atoms, dim].

    Each step gives every signal the atom whose correlation with its residual is largest in absolute value (the
    first on ties), then refits all its coefficients by least squares (its residual is then orthogonal to its
    atoms). A signal stops early, as in scikit-learn's `orthogonal_mp_gram`, when that atom is one it has or the
    squared correlation underflows (its residual is zero to rounding).
    """
    dictionary = np.asarray(dictionary, np.float64)
    signals = np.asarray(signals, np.float64)
    n = signals.shape[0]
    atoms = np.full((n, nonzeros), _NO_ATOM, np.int32)
    coefficients = np.zeros((n, nonzeros), np.float64)
    residual = signals.copy()
    active = np.ones(n, bool)
    for step in range(nonzeros):
        correlation = np.abs(residual @ dictionary.T)
        best = np.argmax(correlation, axis=1)
        peak = correlation[np.arange(n), best]
        active &= ~(atoms[:, :step] == best[:, None]).any(axis=1) & (peak ** 2 >= np.finfo(np.float64).tiny)
        rows = np.flatnonzero(active)
        if not rows.size:
            break
        atoms[rows, step] = best[rows]
        chosen = dictionary[atoms[rows, :step + 1]]  # [r, step + 1, dim]
        gram = chosen @ chosen.transpose(0, 2, 1)
        target = (chosen @ signals[rows, :, None])[..., 0]
        try:
            solved = np.linalg.solve(gram, target[..., None])[..., 0]
        except np.linalg.LinAlgError:  # an atom in the span of the others (a duplicated atom): least norm
            solved = (np.linalg.pinv(gram) @ target[..., None])[..., 0]
        coefficients[rows, :step + 1] = solved
        residual[rows] = signals[rows] - np.einsum("rk,rkd->rd", solved, chosen)
    return atoms, coefficients


def order_by_magnitude(atoms: np.ndarray, coefficients: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's atoms and coefficients sorted by |coefficient|, largest first (ties: the lower atom); an atom
    whose coefficient is exactly 0 is no non-zero entry of the code and is dropped (-1, after the others)."""
    kept = (atoms != _NO_ATOM) & (coefficients != 0)
    order = np.lexsort((atoms, -np.abs(coefficients), ~kept), axis=1)
    rows = np.arange(atoms.shape[0])[:, None]
    kept = kept[rows, order]
    return (np.where(kept, atoms[rows, order], _NO_ATOM).astype(np.int32),
            np.where(kept, coefficients[rows, order], 0.0))


def _unit_rows(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _code_all(embeddings: np.ndarray, dictionary: np.ndarray, nonzeros: int):
    """OMP over every document, `_CHUNK` at a time: (atoms, coefficients, relative residual float64[N], codes' Gram
    C^T C float64[A, A], C^T X float64[A, dim]) with C the documents' dense codes."""
    n, num_atoms = embeddings.shape[0], dictionary.shape[0]
    atoms = np.empty((n, nonzeros), np.int32)
    coefficients = np.empty((n, nonzeros), np.float64)
    relative = np.empty(n, np.float64)
    code_gram = np.zeros((num_atoms, num_atoms), np.float64)
    code_signal = np.zeros((num_atoms, dictionary.shape[1]), np.float64)
    for start in range(0, n, _CHUNK):
        signals = np.asarray(embeddings[start:start + _CHUNK], np.float64)
        chunk_atoms, chunk_coefficients = orthogonal_matching_pursuit(dictionary=dictionary, signals=signals,
                                                                      nonzeros=nonzeros)
        dense = np.zeros((signals.shape[0], num_atoms), np.float64)
        chosen = chunk_atoms != _NO_ATOM
        dense[np.nonzero(chosen)[0], chunk_atoms[chosen]] = chunk_coefficients[chosen]
        code_gram += dense.T @ dense
        code_signal += dense.T @ signals
        relative[start:start + _CHUNK] = (np.linalg.norm(signals - dense @ dictionary, axis=1)
                                          / np.linalg.norm(signals, axis=1))
        atoms[start:start + _CHUNK], coefficients[start:start + _CHUNK] = chunk_atoms, chunk_coefficients
    return atoms, coefficients, relative, code_gram, code_signal


def build_sparse_ids(*, embeddings: np.ndarray, atoms: int = 100, nonzeros: int = 3, iterations: int = 20,
                     seed: int = 0, show_progress: bool = False) -> SparseIds:
    """Sparse ids of the rows of `embeddings` float[N, dim] (an array or a read-only memmap; see the module
    docstring). Deterministic for a given `seed`."""
    check_embeddings(embeddings)
    n = embeddings.shape[0]
    if not 1 <= nonzeros <= atoms:
        raise ValueError(f"need 1 <= nonzeros <= atoms, got nonzeros={nonzeros}, atoms={atoms}")
    if iterations < 0:
        raise ValueError(f"iterations must be >= 0, got {iterations}")
    if n < atoms:
        raise ValueError(f"{n} documents cannot start a dictionary of {atoms} atoms: lower atoms")
    norms = np.concatenate([np.linalg.norm(np.asarray(embeddings[s:s + _CHUNK], np.float64), axis=1)
                            for s in range(0, n, _CHUNK)])
    if (norms == 0).any():
        raise ValueError(f"embedding row {int(np.argmax(norms == 0))} is zero: it has no sparse code")
    rng = np.random.default_rng(seed)
    dictionary = _unit_rows(np.asarray(embeddings[np.sort(rng.choice(n, size=atoms, replace=False))], np.float64))
    residuals = []
    for _ in tqdm.trange(iterations, desc="dictionary learning", unit="iteration", disable=not show_progress):
        _, _, relative, code_gram, code_signal = _code_all(embeddings, dictionary, nonzeros)
        residuals.append(float(relative.mean()))
        used = np.diag(code_gram) > 0
        updated = dictionary.copy()
        updated[used] = np.linalg.lstsq(code_gram[np.ix_(used, used)], code_signal[used], rcond=None)[0]
        atom_norms = np.linalg.norm(updated, axis=1)
        reseed = ~used | (atom_norms <= 1e-12 * max(float(atom_norms.max()), 1.0))
        worst = np.argsort(-relative, kind="stable")[:int(reseed.sum())]
        updated[reseed] = np.asarray(embeddings[np.sort(worst)], np.float64)
        dictionary = _unit_rows(updated)
    chosen, coefficients, relative, _, _ = _code_all(embeddings, dictionary, nonzeros)
    residuals.append(float(relative.mean()))
    chosen, coefficients = order_by_magnitude(chosen, coefficients)
    empty = np.flatnonzero((chosen == _NO_ATOM).all(axis=1))
    if empty.size:
        raise ValueError(f"embedding row {int(empty[0])} has no atom: it is orthogonal to every atom of the dictionary")
    return SparseIds(atoms=chosen, coefficients=coefficients, collision=collision_indices(chosen), num_atoms=atoms,
                     dictionary=dictionary, relative_residuals=tuple(residuals))


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


def read_sparse_docid(tokens: Sequence[int] | np.ndarray, *, vocab_size: int,
                      num_atoms: int) -> tuple[tuple[int, ...], int | None]:
    """(atoms, collision index or None) of a sparse docid's tokens (EOS included; anything after it ignored)."""
    tokens = [int(t) for t in tokens]
    if EOS_ID not in tokens:
        raise ValueError(f"{tokens} is no docid: it has no EOS ({EOS_ID})")
    content = tokens[:tokens.index(EOS_ID)]
    bad = [t for t in content if t < vocab_size]
    if bad or not content:
        raise ValueError(f"{tokens} is no sparse docid over a vocabulary of {vocab_size} pieces")
    collision = content[-1] - vocab_size - num_atoms if content[-1] >= vocab_size + num_atoms else None
    atoms = tuple(t - vocab_size for t in (content[:-1] if collision is not None else content))
    if any(a >= num_atoms for a in atoms):
        raise ValueError(f"{tokens}: a collision position before the last token")
    return atoms, collision
