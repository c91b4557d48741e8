"""Prefix trie over docid token sequences, as flat arrays queried inside `jax.jit`.

Why: constrained decoding in research code walks a Python trie once per beam per step on the host
(HF `prefix_allowed_tokens_fn`, GENRE's dict trie), which stalls the accelerator at every step. Here
the trie is a pytree of three int32 arrays, and every query is a few batched gathers (and one scatter
for a vocabulary mask) with static shapes, so it runs inside the jitted decoding loop at any corpus size.

Layout (breadth-first numbering):
  state 0 is DEAD (no children; every invalid transition goes there), state 1 is the ROOT, and the
  other states are the distinct prefixes of the docid sequences, numbered level by level and, within a
  level, in lexicographic order. Then the children of any state are *consecutive* states, sorted by
  token, so the trie needs no edge list:

    first_child: int32[S + 1]  children of s are states first_child[s] .. first_child[s + 1] - 1
    token:       int32[S]      the token that leads into each state (PAD for DEAD and ROOT)
    leaf_index:  int32[S]      for a terminal state (a full sequence, EOS included) its row in the
                               token matrix the trie was built from; -1 for other states

  That is 12 bytes per state: 2.6x the int32 docid table for 1M random docids of 8 tokens over a
  2,048-token vocabulary (7.9M states, 95MB vs. 36MB), less than the table when docids share prefixes
  (8.8M MS MARCO digit docids: 17.7M states, 212MB vs. 283MB), and no vocabulary-wide rows, whose
  size would explode for the high fan-out levels of semantic ids.

Queries, for `n` states at once (all shapes static, each method jitted):
  `children` gathers the first `width` children of each state (tokens and next states: children are
  consecutive). Decoding calls it with width K = `sparse_fanout` when every live state has at most K
  children (all but the first levels of realistic docids), wider only near the root and a level's own
  fan-out where that is below K (see `gr_jax.decoding`): candidate scores are gathered from the log-probs at the
  child tokens, so the search builds no vocabulary-wide mask and never searches for a next state.
  `allowed_mask` scatters the children into a [n, vocab] mask (for losses over the vocabulary): K wide
  when every state has at most K children, `max_fanout` wide otherwise (a `lax.cond`).
  `next_states` binary-searches a given token among the sorted children (ceil(log2(max_fanout + 1))
  rounds of gathers); `eos_states` is one gather (EOS is always the first child).
  Terminal states allow only PAD (looping to themselves), so a full PAD-padded target row walks to its
  terminal state and `prefix_states` / `leaf_indices` work on padded target matrices directly.
"""
from __future__ import annotations

import functools
import math

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from gr_jax.docids.table import first_row_problem, sequence_lengths
from gr_jax.vocabulary import EOS_ID, PAD_ID

DEAD_STATE = 0
ROOT_STATE = 1


@flax.struct.dataclass
class Trie:
    """Array trie of docid sequences (see the module docstring); a JAX pytree, so pass it to jitted functions."""

    first_child: jax.Array  # int32[num_states + 1]
    token: jax.Array  # int32[num_states]
    leaf_index: jax.Array  # int32[num_states]
    vocab_size: int = flax.struct.field(pytree_node=False)
    max_length: int = flax.struct.field(pytree_node=False)  # longest sequence, EOS included (the depth)
    max_fanout: int = flax.struct.field(pytree_node=False)  # most children of any state
    sparse_fanout: int = flax.struct.field(pytree_node=False)  # K: width of `children`
    # level_fanouts[d]: most children of a state at depth d (d tokens decoded); static, so decoding can size
    # each level's expansion without looking at the arrays.
    level_fanouts: tuple[int, ...] = flax.struct.field(pytree_node=False, default=())
    # Shortest sequence, EOS included: no EOS is allowed before position min_length - 1 (2: one token and EOS, the
    # shortest a docid can be). min_length == max_length: every docid ends at the last position.
    min_length: int = flax.struct.field(pytree_node=False, default=2)

    @classmethod
    def build(cls, tokens: np.ndarray, *, vocab_size: int, sparse_fanout: int = 32) -> Trie:
        """Builds the trie of the rows of `tokens` (e.g. `DocidTable.tokens`).

        tokens: int[N, L], each row `content EOS PAD...` (content without PAD/EOS), rows distinct.
        sparse_fanout: K, the default width of `children` (wider only for states with more children).
        Time O(N L) numpy plus one O(N log N) sort of the rows as byte strings; no Python loop over rows.
        """
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer) or tokens.shape[0] == 0:
            raise ValueError(f"tokens must be a non-empty integer matrix [num_docids, length], got "
                             f"{tokens.dtype}{list(tokens.shape)}")
        if sparse_fanout < 1:
            raise ValueError(f"sparse_fanout must be >= 1, got {sparse_fanout}")
        problem = first_row_problem(tokens)
        if problem is not None:
            row, reason, count = problem
            raise ValueError(f"row {row} of the docid token matrix ({tokens[row].tolist()}) is malformed: "
                             f"{reason}; {count} malformed row(s) in all")
        if tokens.max() >= vocab_size:
            row = int(np.argmax((tokens >= vocab_size).any(axis=1)))
            raise ValueError(f"row {row} holds token id {int(tokens[row].max())} >= vocab_size {vocab_size}")
        lengths = sequence_lengths(tokens)
        depth = int(lengths.max())
        num_rows = tokens.shape[0]

        # Sort the rows lexicographically by token id: big-endian keys compare like numbers under memcmp.
        key_dtype = np.dtype(">u2") if vocab_size <= 1 << 16 else np.dtype(">u4")
        keys = np.ascontiguousarray(tokens[:, :depth], dtype=key_dtype)
        order = np.argsort(keys.view(np.dtype((np.void, key_dtype.itemsize * depth))).ravel()).astype(np.int32)
        del keys
        sorted_lengths = lengths[order]
        # common[i]: length of the common prefix of sorted rows i-1 and i (0 for the first row).
        common = np.full(num_rows, depth, dtype=np.int32)
        common[0] = 0
        for column in reversed(range(depth)):
            values = tokens[order, column]
            common[1:][values[1:] != values[:-1]] = column
        if (common[1:] == depth).any():
            i = int(np.argmax(common[1:] == depth)) + 1
            a, b = sorted((int(order[i - 1]), int(order[i])))
            raise ValueError(f"rows {a} and {b} of the docid token matrix are identical ({tokens[a].tolist()})")

        # A row starts a new state at level d (its prefix of length d) iff it is that long and its prefix
        # differs from the previous sorted row's; rows sharing a prefix are adjacent after sorting.
        level_sizes = [int(np.count_nonzero((sorted_lengths >= d) & (common < d))) for d in range(1, depth + 1)]
        level_starts = np.cumsum([ROOT_STATE + 1] + level_sizes)  # level d's states start at level_starts[d-1]
        num_states = int(level_starts[-1])
        if num_states >= np.iinfo(np.int32).max:
            raise ValueError(f"{num_states} trie states do not fit int32 state ids")
        first_child = np.empty(num_states + 1, dtype=np.int32)
        token = np.empty(num_states, dtype=np.int32)
        leaf_index = np.full(num_states, -1, dtype=np.int32)
        token[[DEAD_STATE, ROOT_STATE]] = PAD_ID
        first_child[DEAD_STATE] = ROOT_STATE + 1  # DEAD: empty range [2, 2)
        parent_ids = np.full(num_rows, ROOT_STATE, dtype=np.int32)
        parent_start, parent_count = ROOT_STATE, 1
        level_fanouts = []
        for d in range(1, depth + 1):
            start, size = int(level_starts[d - 1]), level_sizes[d - 1]
            is_new = (sorted_lengths >= d) & (common < d)
            ids = np.cumsum(is_new, dtype=np.int32)
            ids += start - 1  # each row's state at level d (meaningful where its length >= d)
            token[start:start + size] = tokens[order[is_new], d - 1]
            num_children = np.bincount(parent_ids[is_new] - parent_start, minlength=parent_count)
            level_fanouts.append(int(num_children.max()))
            first_child[parent_start:parent_start + parent_count] = start + np.cumsum(num_children) - num_children
            ends_here = sorted_lengths == d
            leaf_index[ids[ends_here]] = order[ends_here]
            parent_ids, parent_start, parent_count = ids, start, size
        first_child[parent_start:] = num_states  # the deepest level has no children
        max_fanout = max(int(np.diff(first_child).max()), 1)  # 1: a terminal's PAD self-loop
        return cls(first_child=jnp.asarray(first_child), token=jnp.asarray(token), leaf_index=jnp.asarray(leaf_index),
                   vocab_size=int(vocab_size), max_length=depth, max_fanout=max_fanout,
                   sparse_fanout=int(sparse_fanout), level_fanouts=tuple(level_fanouts),
                   min_length=int(lengths.min()))

    @property
    def num_states(self) -> int:
        return self.token.shape[0]

    @property
    def nbytes(self) -> int:
        return sum(int(x.nbytes) for x in (self.first_child, self.token, self.leaf_index))

    def root_states(self, n: int) -> jax.Array:
        """int32[n]: the state before the first token."""
        return jnp.full((n,), ROOT_STATE, dtype=jnp.int32)

    @jax.jit
    def is_terminal(self, states: jax.Array) -> jax.Array:
        """bool[...]: the state is a full docid sequence (EOS consumed)."""
        return self.leaf_index[states] >= 0

    @jax.jit
    def num_children(self, states: jax.Array) -> jax.Array:
        """int32[...]: number of allowed next tokens (1 for a terminal state: PAD; 0 for DEAD)."""
        count = self.first_child[states + 1] - self.first_child[states]
        return jnp.where(self.is_terminal(states), 1, count)

    @functools.partial(jax.jit, static_argnames="width")
    def children(self, states: jax.Array, *, width: int | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The first `width` (default K = `sparse_fanout`) allowed next tokens of each state, in token order.

        states: int32[n] -> (tokens int32[n, width], next_states int32[n, width], valid bool[n, width]);
        invalid slots hold PAD / DEAD. Complete where `num_children(states) <= width`, so `width=max_fanout`
        is always complete. Pure gathers: this is how decoding expands beams without a vocabulary mask.
        """
        width = self.sparse_fanout if width is None else int(width)
        states = jnp.asarray(states, jnp.int32)
        slots = jnp.arange(width, dtype=jnp.int32)
        start = self.first_child[states]
        count = self.first_child[states + 1] - start
        child = start[:, None] + slots
        valid = slots < count[:, None]
        terminal = self.is_terminal(states)[:, None]
        valid = jnp.where(terminal, slots == 0, valid)
        child = jnp.where(terminal, states[:, None], child)
        tokens = jnp.where(valid & ~terminal, self.token[jnp.minimum(child, self.num_states - 1)], PAD_ID)
        return tokens, jnp.where(valid, child, DEAD_STATE), valid

    @jax.jit
    def eos_states(self, states: jax.Array) -> jax.Array:
        """int32[...]: the terminal state reached by EOS, or DEAD where the prefix is not a full docid.

        One gather: EOS, the smallest token a child can carry, is always the first child.
        """
        states = jnp.asarray(states, jnp.int32)
        first = self.first_child[states]
        first_token = self.token[jnp.minimum(first, self.num_states - 1)]
        has_eos = (first < self.first_child[states + 1]) & (first_token == EOS_ID)
        return jnp.where(has_eos, first, DEAD_STATE)

    @jax.jit
    def allowed_mask(self, states: jax.Array) -> jax.Array:
        """bool[n, vocab_size]: the tokens allowed after each state (all False for DEAD).

        Scatters each state's children into the mask: K slots per state when no state has more than K
        children, `max_fanout` slots otherwise (a `lax.cond`, so deep levels never pay for the root).
        """
        states = jnp.asarray(states, jnp.int32)
        start = self.first_child[states]
        count = self.first_child[states + 1] - start
        terminal = self.is_terminal(states)
        rows = jnp.arange(states.shape[0])[:, None]

        def scatter(width: int) -> jax.Array:
            slots = jnp.arange(width, dtype=jnp.int32)
            child = start[:, None] + slots
            # Empty slots point past the vocabulary and are dropped by the scatter.
            tokens = jnp.where(slots < count[:, None], self.token[jnp.minimum(child, self.num_states - 1)],
                               self.vocab_size)
            mask = jnp.zeros((states.shape[0], self.vocab_size), bool).at[rows, tokens].set(True, mode="drop")
            return mask.at[:, PAD_ID].set(mask[:, PAD_ID] | terminal)

        if self.max_fanout <= self.sparse_fanout:
            return scatter(self.sparse_fanout)
        return jax.lax.cond(jnp.any(count > self.sparse_fanout),
                            lambda: scatter(self.max_fanout), lambda: scatter(self.sparse_fanout))

    @jax.jit
    def next_states(self, states: jax.Array, tokens: jax.Array) -> jax.Array:
        """int32[...]: the state after `tokens` (same shape as `states`); DEAD if the token is not allowed.

        A binary search among the sorted children: ceil(log2(max_fanout + 1)) rounds of gathers.
        """
        states = jnp.asarray(states, jnp.int32)
        tokens = jnp.asarray(tokens, jnp.int32)
        last = self.num_states - 1
        low = self.first_child[states]
        end = self.first_child[states + 1]

        def halve(_, bounds):
            low, high = bounds
            middle = (low + high) // 2
            searching = low < high
            go_right = searching & (self.token[jnp.minimum(middle, last)] < tokens)
            return jnp.where(go_right, middle + 1, low), jnp.where(searching & ~go_right, middle, high)

        # A loop rather than unrolled rounds: chains of unrolled searches make XLA compile times explode.
        low, _ = jax.lax.fori_loop(0, math.ceil(math.log2(self.max_fanout + 1)), halve, (low, end))
        found = (low < end) & (self.token[jnp.minimum(low, last)] == tokens)
        stay = self.is_terminal(states) & (tokens == PAD_ID)
        return jnp.where(stay, states, jnp.where(found, low, DEAD_STATE))

    @jax.jit
    def prefix_states(self, tokens: jax.Array) -> jax.Array:
        """int32[n, L]: the state before each position of teacher-forced sequences `tokens` int32[n, L].

        Column 0 is ROOT; a row leaves the trie (DEAD from then on) at its first disallowed token.
        """
        tokens = jnp.asarray(tokens, jnp.int32)

        def step(states, column):
            return self.next_states(states, column), states

        _, before = jax.lax.scan(step, self.root_states(tokens.shape[0]), tokens.T)
        return before.T

    @jax.jit
    def final_states(self, tokens: jax.Array) -> jax.Array:
        """int32[n]: the state after all of `tokens` int32[n, L]."""
        tokens = jnp.asarray(tokens, jnp.int32)
        final, _ = jax.lax.scan(lambda states, column: (self.next_states(states, column), None),
                                self.root_states(tokens.shape[0]), tokens.T)
        return final

    @jax.jit
    def leaf_indices(self, sequences: jax.Array) -> jax.Array:
        """int32[n]: the row (document index) of each decoded sequence int32[n, L], or -1 if it is not one.

        A sequence is a docid if it is a docid's tokens, EOS, then only PAD (as beam search emits them).
        """
        return self.leaf_index[self.final_states(sequences)]
