"""Rank-aware supervision of SToICaL (Rozonoyer et al., Eq. 11): item weights lambda(r) and trie-marginalised token
targets y(r, t), for a query with a ranked list of docids d_1 > d_2 > ... > d_n.

    L(q, d_r, r) = lambda(r) * sum_t CE( y(r, t), p(. | q, T(d_r)_<t) )

Item level (Sec. 4.2): every ranked docid is its own example, weighted by `TopOne` (lambda = [r = 1]: next-token
training on the top document), `Fractional` (1 / r^alpha) or `Stepwise` ((n - r + 1) / n).

Token level (Sec. 4.3): the query's ranked docids form a trie; each docid node w has mass mu(rank(w)) = 1 / rank^beta;
at step t of d_r, with the teacher-forced prefix u = T(d_r)_<t, the target of each next token v is the mass of
the docids in the subtree of u.v, renormalised over u's children. A docid's EOS is one of its tokens, so a docid
that is a prefix of another ("cat", "cats") is the EOS child of the shared node, carrying its own mass. beta -> inf
makes the target one-hot on d_1's path where d_1's subtree holds u, and on d_r's own next token where no mass is
left (the teacher-forced token, as next-token training has it). The combined
variant (App. D) builds d_r's trie from d_r, ..., d_n only (`from_rank=True`), keeping the original ranks in mu.

`trie_targets` works on token arrays, loop-free over positions and docids (numpy sorting and segment sums): the
input pipeline calls it once per (query, rank) example and stores fixed-shape [T, K] arrays.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from gr_jax.vocabulary import PAD_ID


@dataclasses.dataclass(frozen=True)
class TopOne:
    """lambda(r) = 1 for r = 1, else 0: next-token training on the top-ranked docid."""

    def __call__(self, ranks: np.ndarray, list_lengths: np.ndarray) -> np.ndarray:
        del list_lengths
        return (np.asarray(ranks) == 1).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Fractional:
    """lambda(r) = 1 / r^alpha (the paper's best: alpha 2-3)."""
    alpha: float = 2.0

    def __call__(self, ranks: np.ndarray, list_lengths: np.ndarray) -> np.ndarray:
        del list_lengths
        return (1.0 / np.asarray(ranks, np.float64) ** self.alpha).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Stepwise:
    """lambda(r) = (n - r + 1) / n for a list of n docids."""

    def __call__(self, ranks: np.ndarray, list_lengths: np.ndarray) -> np.ndarray:
        ranks, n = np.asarray(ranks, np.float64), np.asarray(list_lengths, np.float64)
        return ((n - ranks + 1) / n).astype(np.float32)


def _check_ranked(ranked: np.ndarray) -> np.ndarray:
    ranked = np.asarray(ranked)
    if ranked.ndim != 2 or not len(ranked):
        raise ValueError(f"ranked docids must be int[n >= 1, length], got shape {ranked.shape}")
    if (ranked[:, 0] == PAD_ID).any():
        raise ValueError("a ranked docid is empty (starts with PAD)")
    return ranked


def trie_targets(ranked: np.ndarray, *, rank: int, beta: float, max_children: int,
                 from_rank: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The soft targets of the example (query, d_rank) over the trie of `ranked`.

    ranked: int[n, T], the query's docids best first, each EOS-terminated and PAD-padded; rank: 1-based r.
    Returns (tokens int32[T, K], mass float32[T, K]), K = `max_children`: at each position t of d_r, the children
    of its prefix with their normalised masses, heaviest first, PAD / 0 where fewer (and at positions past d_r's
    EOS). A prefix with more than K children is an error (nothing is dropped silently).
    """
    ranked = _check_ranked(ranked)
    n, length = ranked.shape
    if not 1 <= rank <= n:
        raise ValueError(f"rank must be in [1, {n}], got {rank}")
    if not beta >= 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    ranks = np.arange(1, n + 1, dtype=np.float64)
    mu = np.exp(-beta * np.log(ranks)) if np.isfinite(beta) else (ranks == 1).astype(np.float64)
    target = ranked[rank - 1]
    # prefix_ok[j, t]: docid j shares d_r's first t tokens (its subtree contains d_r's prefix at step t).
    same = ranked == target[None, :]
    prefix_ok = np.concatenate([np.ones((n, 1), bool), np.cumprod(same, axis=1)[:, :-1].astype(bool)], axis=1)
    live = prefix_ok & (ranked != PAD_ID) & (target[None, :] != PAD_ID)  # [n, T]
    if from_rank:
        live &= (ranks >= rank)[:, None]  # the trie of d_r, ..., d_n only
    positions, docs = np.nonzero(live.T)  # sorted by position, then docid row
    children = ranked[docs, positions]
    # Segment sums of mu over (position, child token).
    keys = positions.astype(np.int64) * (int(ranked.max()) + 1) + children
    unique_keys, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    mass = np.bincount(inverse.reshape(-1), weights=mu[docs], minlength=len(unique_keys))
    key_positions, key_tokens = positions[first], children[first]
    counts = np.bincount(key_positions, minlength=length)
    if counts.max(initial=0) > max_children:
        t = int(np.argmax(counts))
        raise ValueError(f"the prefix of d_{rank} at position {t} has {int(counts[t])} children, more than "
                         f"max_children={max_children}")
    totals = np.bincount(key_positions, weights=mass, minlength=length)
    # A prefix whose subtree has no mass (beta -> inf away from d_1, or the combined variant above d_r) keeps the
    # teacher-forced token: one-hot on d_r.
    empty = totals[key_positions] <= 0
    mass = np.where(empty, (key_tokens == target[key_positions]).astype(np.float64), mass)
    totals = np.bincount(key_positions, weights=mass, minlength=length)
    normalised = mass / np.where(totals[key_positions] > 0, totals[key_positions], 1.0)
    # Heaviest first within each position (ties: smaller token id first), then scatter into [T, K].
    order = np.lexsort((key_tokens, -normalised, key_positions))
    key_positions, key_tokens, normalised = key_positions[order], key_tokens[order], normalised[order]
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    slot = np.arange(len(key_positions)) - starts[key_positions]
    tokens = np.full((length, max_children), PAD_ID, np.int32)
    masses = np.zeros((length, max_children), np.float32)
    tokens[key_positions, slot] = key_tokens
    masses[key_positions, slot] = normalised
    return tokens, masses
