"""Model-agnostic beam search and sampling in `jax.lax.while_loop`, optionally constrained by a docid `Trie`.

Both loops call `step_fn(tokens, position, cache) -> (logits, new_cache)` once per position:

  tokens:   int32[rows], the previous token of each row (PAD, the decoder start token, at position 0);
  position: int32[], the index of the token being decoded;
  cache:    a pytree whose every leaf has leading dimension `rows` (e.g. the decoder's self-attention
            K/V); beam search reorders it when beams are selected. Per-query constants (encoder outputs,
            cross-attention K/V) are not in the cache: the model closes over them, so they are never
            copied or reordered.
  logits:   float32[rows, vocab].

For beam search rows = batch * beams, batch-major (row = b * beams + k); for sampling rows = batch.

With a trie, the log-softmax is taken over the full vocabulary (the model's distribution) and then
restricted to the trie's allowed tokens, so a docid's score is the model's log-likelihood of it and an
invalid docid can never be emitted. Candidates are the log-probs gathered at the tokens of
`Trie.children`: no vocabulary-wide mask is built and no next state is searched for. Beam search expands
only beam 0 at its first step (the root, the widest level, read whole), since the other beams are not
alive yet, and normalises only its row; below the root it reads each beam's children at one of two widths
(`_inner_widths`: the largest level fan-out up to K = `trie.sparse_fanout`, and the widest level's), a
`lax.cond` picking the narrower where every live beam's children fit. Each width is one more compiled
copy of the selection, so two keep the first call's compilation short while deep levels cost their own
fan-out. At the trie's depth the search only finishes beams (every alive beam's one continuation is EOS),
and where every docid has that depth no earlier step looks at EOS.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from gr_jax.docids.trie import DEAD_STATE, Trie
from gr_jax.vocabulary import EOS_ID, PAD_ID

StepFn = Callable[[jax.Array, jax.Array, Any], tuple[jax.Array, Any]]

NEG_INF = float("-inf")


class BeamSearchResult(NamedTuple):
    sequences: jax.Array  # int32[batch, beams, max_decode_len]: decoded tokens, EOS included, PAD after; best first
    scores: jax.Array  # float32[batch, beams]: sum of token log-probs (length-penalised if asked); -inf: no result


class SampleResult(NamedTuple):
    sequences: jax.Array  # int32[batch, max_decode_len]: decoded tokens, EOS included, PAD after
    log_probs: jax.Array  # float32[batch]: the model's log-likelihood of the sequence (temperature 1)


def brevity_penalty(*, alpha: float, length: jax.Array | float) -> jax.Array:
    """t5x / GNMT length penalty ((5 + length) / 6) ** alpha; a finished score is log_prob / penalty."""
    return jnp.power((5.0 + length) / 6.0, alpha)


def _check_arguments(*, trie: Trie | None, eos_id: int, max_decode_len: int, **positive: int) -> None:
    for name, value in positive.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not isinstance(max_decode_len, int) or max_decode_len < 1:
        raise ValueError(f"max_decode_len must be a positive int, got {max_decode_len!r}")
    if trie is not None:
        if eos_id != EOS_ID:
            raise ValueError(f"the trie's sequences end with EOS={EOS_ID}; eos_id={eos_id} cannot be used with it")
        if max_decode_len < trie.max_length:
            raise ValueError(f"max_decode_len={max_decode_len} is shorter than the longest docid ({trie.max_length} "
                             "tokens with EOS): those docids could never be decoded")


def _check_cache(cache: Any, *, rows: int, rows_are: str) -> None:
    for path, leaf in jax.tree_util.tree_leaves_with_path(cache):
        if jnp.ndim(leaf) == 0 or jnp.shape(leaf)[0] != rows:
            raise ValueError(f"every cache leaf needs leading dimension {rows} ({rows_are}), but "
                             f"cache{jax.tree_util.keystr(path)} has shape {list(jnp.shape(leaf))}")


def _call_step_fn(step_fn: StepFn, tokens: jax.Array, position: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
    """Runs the model step: (logits float32[rows, vocab], new cache)."""
    logits, new_cache = step_fn(tokens, position, cache)
    if logits.ndim != 2 or logits.shape[0] != tokens.shape[0]:
        raise ValueError(f"step_fn must return logits [{tokens.shape[0]}, vocab], got {list(logits.shape)}")
    return logits.astype(jnp.float32), new_cache


def _normalized_step(step_fn: StepFn, tokens: jax.Array, position: jax.Array, cache: Any, *,
                     returns_log_probs: bool = False) -> tuple[jax.Array, jax.Array, Any]:
    """Runs the model step: (logits float32[rows, vocab], log_normalizer float32[rows, 1], new cache).

    A token's log-prob is `logits - log_normalizer` (the full-vocabulary log-softmax); only the candidates'
    log-probs are formed, not a [rows, vocab] copy (a step_fn that returns log-probs has normalizer 0).
    """
    logits, new_cache = _call_step_fn(step_fn, tokens, position, cache)
    return logits, _log_normalizer(logits, returns_log_probs=returns_log_probs), new_cache


def _log_normalizer(logits: jax.Array, *, returns_log_probs: bool) -> jax.Array:
    """float32[n, 1]: the full-vocabulary log-softmax's normalizer of logits float32[n, vocab] (0 for log-probs)."""
    if returns_log_probs:
        return jnp.zeros((logits.shape[0], 1), jnp.float32)
    return jax.nn.logsumexp(logits, axis=-1, keepdims=True)


class _Continuations(NamedTuple):
    """The best allowed continuations of each group of rows, best first (-inf: empty slot)."""

    scores: jax.Array  # float32[groups, count]: the row's score plus the token's log-prob
    sources: jax.Array  # int32[groups, count]: the row (within its group) that the continuation extends
    tokens: jax.Array  # int32[groups, count]
    next_states: jax.Array  # int32[groups, count]: trie states after the tokens


def _best(scores: jax.Array, tokens: jax.Array, next_states: jax.Array, *, count: int) -> _Continuations:
    """The `count` best of each group's candidates, best first: scores float32[groups, sources, width], tokens and
    next_states int32 of that shape. With fewer candidates than `count` the other slots score -inf."""
    groups, sources, width = scores.shape
    flat = scores.reshape(groups, sources * width)
    if sources * width < count:
        flat = jnp.pad(flat, ((0, 0), (0, count - sources * width)), constant_values=NEG_INF)
    best, picked = jax.lax.top_k(flat, count)
    picked = jnp.minimum(picked, sources * width - 1)  # an empty slot keeps its -inf score
    take = lambda x: jnp.take_along_axis(x.reshape(groups, sources * width), picked, axis=1,  # noqa: E731
                                         mode="promise_in_bounds")
    return _Continuations(best, picked // width, take(tokens), take(next_states))


def _root_widths(trie: Trie) -> tuple[int, ...]:
    """The root's children, all read at once (beam search's first step: one row per query)."""
    return (trie.max_fanout,)


def _inner_widths(trie: Trie) -> tuple[int, ...]:
    """Widths for beams below the root: the largest level fan-out up to K (`sparse_fanout`), read at every level
    whose rows fit it, and the largest below the root, for the wide levels near it. Every width is one more
    compiled copy of the selection (docs/decoding.md measures the compile time per width), so there are at most
    two: deep levels cost their own fan-out (random 8-token docids: 6, not K = 30), wide ones their level's."""
    fanouts = trie.level_fanouts[1:] or (trie.max_fanout,)
    narrow = max((f for f in fanouts if f <= trie.sparse_fanout), default=trie.sparse_fanout)
    return tuple(sorted({narrow, max(fanouts)}))


def _any_level_widths(trie: Trie) -> tuple[int, ...]:
    """Widths for rows at any level (sampling): K, and the largest fan-out."""
    return tuple(sorted({min(trie.sparse_fanout, trie.max_fanout), trie.max_fanout}))


def _best_continuations(logits: jax.Array, log_normalizer: jax.Array, states: jax.Array, *, row_scores: jax.Array,
                        trie: Trie, group_size: int, count: int, widths: tuple[int, ...],
                        exclude_eos: bool) -> _Continuations:
    """The `count` best allowed continuations of each group of `group_size` consecutive rows.

    logits: float32[rows, vocab] and log_normalizer float32[rows, 1] (log-probs = logits - log_normalizer, see
    `_normalized_step`); states: int32[rows] trie states; row_scores: float32[rows], added to each continuation's
    log-prob (-inf: the row is not searched). Candidates are the log-probs gathered at the tokens of
    `Trie.children` (no vocabulary-wide mask, no next-state search), at the narrowest of the static `widths`
    (ascending; the last must hold any row's children) that holds every searched row's children, picked by a
    `lax.switch` whose every branch is one compiled copy of the selection.
    """
    rows = states.shape[0]
    groups = rows // group_size
    searched = row_scores > NEG_INF

    def best_of(width: int) -> _Continuations:
        tokens, next_states, valid = trie.children(states, width=width)
        keep = valid & (tokens != EOS_ID) if exclude_eos else valid  # a row not searched scores -inf anyway
        # Children's tokens are vocabulary ids (PAD in empty slots): in bounds, so the gather needs no bounds checks.
        gathered = jnp.take_along_axis(logits, tokens, axis=1, mode="promise_in_bounds")
        scores = jnp.where(keep, row_scores[:, None] + gathered - log_normalizer, NEG_INF)
        return _best(*(x.reshape(groups, group_size, width) for x in (scores, tokens, next_states)), count=count)

    if len(widths) == 1:
        return best_of(widths[0])
    needed = jnp.max(jnp.where(searched, trie.num_children(states), 0))
    return jax.lax.switch(jnp.searchsorted(jnp.array(widths[:-1]), needed), [
        functools.partial(best_of, width) for width in widths])


class _BeamState(NamedTuple):
    position: jax.Array  # int32[]
    alive_scores: jax.Array  # float32[batch, beams]: raw log-prob of each unfinished beam; -inf: empty slot
    alive_sequences: jax.Array  # int32[batch, beams, max_decode_len]
    alive_states: jax.Array  # int32[batch, beams]: trie state of each alive beam
    last_tokens: jax.Array  # int32[batch, beams]: the alive beams' last token (the next step_fn input)
    finished_scores: jax.Array  # float32[batch, beams]: final (penalised) scores, best first; -inf: empty slot
    finished_sequences: jax.Array  # int32[batch, beams, max_decode_len]
    cache: Any


def beam_search(
    *,
    step_fn: StepFn,
    cache: Any,
    batch_size: int,
    num_beams: int,
    max_decode_len: int,
    trie: Trie | None = None,
    eos_id: int = EOS_ID,
    length_penalty: float = 0.0,
    step_fn_returns_log_probs: bool = False,
    stop_early: bool = True,
    score_forced_eos: bool = True,
) -> BeamSearchResult:
    """Beam search for the `num_beams` best EOS-terminated sequences of each query, best first.

    Bookkeeping as t5x: alive beams (no EOS yet) and finished beams are kept apart, and finished beams
    compete for the final top `num_beams` across steps. Each step keeps the best `num_beams` alive
    continuations, EOS excluded, and merges each alive beam's EOS continuation into the finished set.
    Candidates are exact and small: without a trie, each beam's top num_beams + 1 tokens (one may be EOS)
    then the top num_beams over all beams; with a trie, each beam's allowed children (K of them, more
    near the root) then the top num_beams over all beams. Only beam 0 is alive at the start, so beams
    never duplicate, and the first step reads only beam 0's row of the model's output. The loop stops at
    `max_decode_len` or once no alive beam can still beat the worst finished one (exact: raw log-probs only
    decrease; with `length_penalty` alpha the bound uses the most favourable remaining length).

    With a trie the last step is at position `trie.max_length - 1`: there every alive beam holds a longest
    docid, whose only continuation is EOS, so that step only finishes the beams (no alive selection); and
    where every docid has that length (`trie.min_length == trie.max_length`) no earlier step looks at EOS,
    which the trie allows nowhere else. The model's step is traced once (the loop's body), the kinds of
    step (first, inner, last) are branches of a `lax.switch` after it.

    scores: sum of the tokens' log-probs (EOS included), divided by `brevity_penalty(alpha, length)` if
    `length_penalty` != 0. With a trie the scores are the model's log-likelihoods of valid docids only;
    slots without a result (fewer valid docids than beams) have score -inf and all-PAD sequences.
    `score_forced_eos=False` (trie only): an EOS that the trie forces (its prefix is a docid that no other
    docid extends, so EOS is its only allowed token) adds 0 to the score, the log-prob of a token the
    constraint leaves no alternative to; an EOS that competes with a longer docid still adds the model's
    log-prob. The last step then calls no model, since all its beams are forced: docids of L tokens take
    L model steps, not L + 1. With docids of one length the score is the log-likelihood of the docid's
    tokens without its end, the objective of searches over fixed-length semantic ids (STATIC's).
    Without a trie, a query with no finished beam at the end returns its alive beams (as t5x).
    `step_fn_returns_log_probs`: the step's output is used as log-probs as is (no log-softmax), for a
    step_fn that edits log-probs, e.g. HF-style logits processors that mask them after the log-softmax.
    `stop_early=False` always runs `max_decode_len` steps, or with a trie until its depth, after which no
    beam is alive (same results, since the stop is exact): for timing searches at one length, e.g. a
    random-init model, whose unconstrained search ends after ~2 steps.
    Jittable; `step_fn`, the sizes and `length_penalty` are static, `cache` and `trie` may be traced.
    """
    _check_arguments(trie=trie, eos_id=eos_id, max_decode_len=max_decode_len, batch_size=batch_size,
                     num_beams=num_beams)
    if not score_forced_eos and trie is None:
        raise ValueError("score_forced_eos=False needs a trie: without one no EOS is forced")
    batch, beams, length = batch_size, num_beams, max_decode_len
    rows = batch * beams
    _check_cache(cache, rows=rows, rows_are="batch_size * num_beams")
    alpha = float(length_penalty)
    # Every docid has the trie's depth: EOS is allowed only at the last step (`finish_all`), so the others need not
    # look at it; their EOS candidates would all be -inf.
    ends_only_at_last = trie is not None and trie.min_length == trie.max_length

    def final_score(log_prob: jax.Array, sequence_length: jax.Array | int) -> jax.Array:
        return log_prob if alpha == 0.0 else log_prob / brevity_penalty(alpha=alpha, length=sequence_length)

    def keep_searching(state: _BeamState) -> jax.Array:
        best_alive = state.alive_scores.max(axis=1)
        if alpha != 0.0:  # the largest penalty over the lengths an alive beam can still finish at
            largest = jnp.maximum(brevity_penalty(alpha=alpha, length=state.position + 1.0),
                                  brevity_penalty(alpha=alpha, length=float(length)))
            best_alive = best_alive / largest
        worst_finished = state.finished_scores.min(axis=1)
        done = (best_alive == NEG_INF) | (worst_finished >= best_alive)
        return (state.position < length) & ~(jnp.all(done) & stop_early)

    def finish(state: _BeamState, eos_log_probs: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Merges the first `sources` alive beams followed by EOS (log-probs float32[batch, sources]) into the
        finished beams: (finished scores, finished sequences)."""
        sources = eos_log_probs.shape[1]
        candidate_scores = final_score(state.alive_scores[:, :sources] + eos_log_probs, state.position + 1)
        candidate_sequences = state.alive_sequences[:, :sources].at[:, :, state.position].set(eos_id)
        finished_scores, picked = jax.lax.top_k(
            jnp.concatenate([state.finished_scores, candidate_scores], axis=1), beams)
        finished_sequences = jnp.take_along_axis(
            jnp.concatenate([state.finished_sequences, candidate_sequences], axis=1), picked[:, :, None], axis=1)
        return finished_scores, finished_sequences

    def eos_log_probs_of(logits: jax.Array, log_normalizer: jax.Array, states: jax.Array) -> jax.Array:
        """float32[n]: each row's log-prob of EOS (-inf where the trie forbids it, 0 where it forces it and
        forced EOS is not scored)."""
        eos_log_probs = logits[:, eos_id] - log_normalizer[:, 0]
        if trie is not None:
            allowed = trie.eos_states(states) != DEAD_STATE
            eos_log_probs = jnp.where(allowed, eos_log_probs, NEG_INF)
            if not score_forced_eos:
                eos_log_probs = jnp.where(allowed & (trie.num_children(states) == 1), 0.0, eos_log_probs)
        return eos_log_probs

    def normalized(logits: jax.Array) -> tuple[jax.Array, jax.Array]:
        return logits, _log_normalizer(logits, returns_log_probs=step_fn_returns_log_probs)

    def expand(state: _BeamState, logits: jax.Array, *, sources: int) -> tuple[_BeamState, jax.Array]:
        """One position after the model's step (logits float32[rows, vocab]): finishes and expands the first
        `sources` beams; returns the new state (cache not reordered) and each new beam's parent int32[batch, beams].
        sources=1 at position 0, where only beam 0 is alive: only its rows are normalised, and the root (the widest
        level) is expanded whole, one row per query."""
        position = state.position
        if sources < beams:  # only these rows matter
            logits = logits.reshape(batch, beams, -1)[:, :sources].reshape(batch * sources, -1)
        logits, log_normalizer = normalized(logits)
        vocab = logits.shape[1]
        source_scores = state.alive_scores[:, :sources]
        source_states = state.alive_states[:, :sources].reshape(batch * sources)
        if ends_only_at_last:  # no EOS before the last step: nothing finishes here
            finished_scores, finished_sequences = state.finished_scores, state.finished_sequences
        else:
            finished_scores, finished_sequences = finish(
                state, eos_log_probs_of(logits, log_normalizer, source_states).reshape(batch, sources))

        # Alive candidates: the best non-EOS continuations of the source beams.
        if trie is None:  # top num_beams + 1 per beam first (one may be EOS): no [rows, vocab] copy
            values, tokens = jax.lax.top_k(logits, min(beams + 1, vocab))
            values = jnp.where(tokens == eos_id, NEG_INF, source_scores.reshape(-1, 1) + values - log_normalizer)
            alive_scores, parents, tokens, next_states = _best(
                *(x.reshape(batch, sources, -1) for x in (values, tokens, jnp.zeros_like(tokens))), count=beams)
        else:
            alive_scores, parents, tokens, next_states = _best_continuations(
                logits, log_normalizer, source_states, row_scores=source_scores.reshape(-1), trie=trie,
                group_size=sources, count=beams, widths=_root_widths(trie) if sources == 1 else _inner_widths(trie),
                exclude_eos=True)
        alive_sequences = jnp.take_along_axis(state.alive_sequences, parents[:, :, None], axis=1)
        alive_sequences = alive_sequences.at[:, :, position].set(tokens)
        return state._replace(
            position=position + 1,
            alive_scores=alive_scores,
            alive_sequences=alive_sequences,
            alive_states=jnp.where(alive_scores > NEG_INF, next_states, DEAD_STATE),
            last_tokens=tokens,
            finished_scores=finished_scores,
            finished_sequences=finished_sequences,
        ), parents

    def finish_all(state: _BeamState, logits: jax.Array | None) -> tuple[_BeamState, jax.Array]:
        """Position trie.max_length - 1: every alive beam is a longest docid, whose only continuation is EOS; they
        all finish. logits: the model's step, or None where forced EOS is not scored (then no model step runs)."""
        if trie is None:
            raise ValueError("finish_all ends the beams at a trie's depth: it needs the trie")
        flat_states = state.alive_states.reshape(rows)
        if logits is None:  # every EOS here is forced
            eos_log_probs = jnp.where(trie.eos_states(flat_states) != DEAD_STATE, 0.0, NEG_INF)
        else:
            eos_log_probs = eos_log_probs_of(*normalized(logits), flat_states)
        finished_scores, finished_sequences = finish(state, eos_log_probs.reshape(batch, beams))
        return state._replace(position=state.position + 1, alive_scores=jnp.full_like(state.alive_scores, NEG_INF),
                              finished_scores=finished_scores, finished_sequences=finished_sequences), \
            jnp.broadcast_to(jnp.arange(beams), (batch, beams))

    # Positions 0 .. max_decode_len - 1, or with a trie up to its depth: `last` (where every alive beam finishes) is
    # a step of the loop if its EOS is scored (the model runs there), else a step after it without the model. The
    # model is traced once, in the loop; the steps' kinds are branches of a `lax.switch` after it.
    last = trie.max_length - 1 if trie is not None else None  # >= 1: every docid has a token before EOS
    branches: list[Callable[[_BeamState, jax.Array], tuple[_BeamState, jax.Array]]] = [
        functools.partial(expand, sources=1), functools.partial(expand, sources=beams)]
    if trie is not None and score_forced_eos:
        branches.append(finish_all)

    def search_step(state: _BeamState) -> _BeamState:
        logits, cache = _call_step_fn(step_fn, state.last_tokens.reshape(rows), state.position, state.cache)
        phase = jnp.minimum(state.position, 1)
        if len(branches) == 3:
            phase = jnp.where(state.position == last, 2, phase)
        state, parents = jax.lax.switch(phase, branches, state._replace(cache=None), logits)
        source_rows = (jnp.arange(batch)[:, None] * beams + parents).reshape(rows)
        return state._replace(cache=jax.tree_util.tree_map(lambda leaf: jnp.take(leaf, source_rows, axis=0), cache))

    initial_states = (trie.root_states(rows) if trie is not None else jnp.zeros((rows,), jnp.int32))
    empty_scores = jnp.full((batch, beams), NEG_INF, jnp.float32)
    empty_sequences = jnp.full((batch, beams, length), PAD_ID, jnp.int32)
    state = _BeamState(
        position=jnp.array(0, jnp.int32),
        alive_scores=empty_scores.at[:, 0].set(0.0),  # only beam 0 is alive: no duplicate beams
        alive_sequences=empty_sequences,
        alive_states=initial_states.reshape(batch, beams),
        last_tokens=jnp.full((batch, beams), PAD_ID, jnp.int32),
        finished_scores=empty_scores,
        finished_sequences=empty_sequences,
        cache=cache,
    )
    if last is None:  # no trie
        state = jax.lax.while_loop(keep_searching, search_step, state)
    elif score_forced_eos:
        state = jax.lax.while_loop(lambda s: keep_searching(s) & (s.position <= last), search_step, state)
    else:
        state = jax.lax.while_loop(lambda s: keep_searching(s) & (s.position < last), search_step, state)
        state = jax.lax.cond(keep_searching(state) & (state.position == last),
                             lambda s: finish_all(s, None)[0], lambda s: s, state)

    scores, sequences = state.finished_scores, state.finished_sequences
    if trie is None:
        none_finished = jnp.all(scores == NEG_INF, axis=1)
        scores = jnp.where(none_finished[:, None], final_score(state.alive_scores, state.position), scores)
        sequences = jnp.where(none_finished[:, None, None], state.alive_sequences, sequences)
    sequences = jnp.where((scores > NEG_INF)[:, :, None], sequences, PAD_ID)
    return BeamSearchResult(sequences=sequences, scores=scores)


class _SampleState(NamedTuple):
    position: jax.Array  # int32[]
    sequences: jax.Array  # int32[batch, max_decode_len]
    last_tokens: jax.Array  # int32[batch]
    trie_states: jax.Array  # int32[batch]
    log_probs: jax.Array  # float32[batch]
    finished: jax.Array  # bool[batch]
    cache: Any


def sample(
    *,
    step_fn: StepFn,
    cache: Any,
    rng: jax.Array,
    batch_size: int,
    max_decode_len: int,
    top_k: int = 10,
    temperature: float = 1.0,
    trie: Trie | None = None,
    eos_id: int = EOS_ID,
) -> SampleResult:
    """Top-k / temperature sampling of one sequence per row (repeat rows in the cache for several samples).

    Each step samples among the `top_k` most likely allowed tokens with probabilities proportional to
    exp(log_prob / temperature); temperature 0 is greedy decoding. `log_probs` is the model's
    log-likelihood of the sampled sequence (full-vocabulary log-softmax at temperature 1), as t5x's.
    Rows stop at EOS and are PAD-padded; the loop ends when every row has. With a trie every sequence is
    a valid docid (max_decode_len must cover the longest one). Jittable; `temperature` and `top_k` are static.
    """
    _check_arguments(trie=trie, eos_id=eos_id, max_decode_len=max_decode_len, batch_size=batch_size,
                     top_k=top_k)
    if not temperature >= 0.0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    batch, length = batch_size, max_decode_len
    _check_cache(cache, rows=batch, rows_are="batch_size")

    def keep_sampling(state: _SampleState) -> jax.Array:
        return (state.position < length) & ~jnp.all(state.finished)

    def sample_step(state: _SampleState) -> _SampleState:
        position = state.position
        logits, log_normalizer, cache = _normalized_step(step_fn, state.last_tokens, position, state.cache)

        if trie is None:
            values, tokens = jax.lax.top_k(logits, min(top_k, logits.shape[1]))
            values, next_states = values - log_normalizer, jnp.zeros_like(tokens)
        else:  # the top_k allowed tokens of each row
            values, _, tokens, next_states = _best_continuations(
                logits, log_normalizer, state.trie_states, row_scores=jnp.where(state.finished, NEG_INF, 0.0),
                trie=trie, group_size=1, count=top_k, widths=_any_level_widths(trie), exclude_eos=False)
        if temperature == 0.0:
            choice = jnp.argmax(values, axis=-1)
        else:
            choice = jax.random.categorical(jax.random.fold_in(rng, position), values / temperature, axis=-1)
        pick = lambda x: jnp.take_along_axis(x, choice[:, None], axis=1)[:, 0]  # noqa: E731
        value, token, next_state = pick(values), pick(tokens), pick(next_states)
        stuck = ~state.finished & (value == NEG_INF)  # no allowed continuation (cannot happen with a valid trie)
        token = jnp.where(state.finished | stuck, PAD_ID, token)
        return _SampleState(
            position=position + 1,
            sequences=state.sequences.at[:, position].set(token),
            last_tokens=token,
            trie_states=next_state,
            log_probs=state.log_probs + jnp.where(state.finished, 0.0, value),
            finished=state.finished | stuck | (token == eos_id),
            cache=cache,
        )

    state = _SampleState(
        position=jnp.array(0, jnp.int32),
        sequences=jnp.full((batch, length), PAD_ID, jnp.int32),
        last_tokens=jnp.full((batch,), PAD_ID, jnp.int32),
        trie_states=trie.root_states(batch) if trie is not None else jnp.zeros((batch,), jnp.int32),
        log_probs=jnp.zeros((batch,), jnp.float32),
        finished=jnp.zeros((batch,), bool),
        cache=cache,
    )
    state = jax.lax.while_loop(keep_sampling, sample_step, state)
    return SampleResult(sequences=state.sequences, log_probs=state.log_probs)


class SequenceScores(NamedTuple):
    log_probs: jax.Array  # float32[rows]: the model's log-likelihood of each sequence (full-vocabulary softmax)
    trie_log_probs: jax.Array  # float32[rows]: the same with each step's softmax over the trie's allowed tokens only


def score_sequences(*, step_fn: StepFn, cache: Any, sequences: jax.Array, trie: Trie) -> SequenceScores:
    """Teacher-forced log-likelihoods of given docid sequences, decoded step by step as beam search decodes them.

    sequences: int32[rows, length], EOS-terminated (PAD after; an all-PAD row scores 0). `trie_log_probs` renormalises
    every step over the trie's children of the prefix (`gr_vs_dense_limitations.txt` App. C: the constrained model's
    distribution over valid docids sums to 1), so exp(trie_log_probs) is the probability the trie-constrained model
    gives the docid; a sequence that is no docid gets NaN there. Jittable.
    """
    rows, length = sequences.shape
    _check_cache(cache, rows=rows, rows_are="the number of sequences")

    def step(carry, position):
        cache, states, total, trie_total = carry
        previous = jnp.where(position == 0, PAD_ID, sequences[:, jnp.maximum(position - 1, 0)])
        logits, log_normalizer, cache = _normalized_step(step_fn, previous, position, cache)
        token = sequences[:, position]
        live = (position == 0) | (previous != EOS_ID) & (previous != PAD_ID)
        live &= token != PAD_ID
        token_logit = jnp.take_along_axis(logits, token[:, None], axis=1)[:, 0]
        children, _, valid = trie.children(states, width=trie.max_fanout)
        allowed = jnp.where(valid, jnp.take_along_axis(logits, children, axis=1), -jnp.inf)
        on_trie = jnp.any(valid & (children == token[:, None]), axis=1)
        trie_step = jnp.where(on_trie, token_logit - jax.nn.logsumexp(allowed, axis=1), jnp.nan)
        total = total + jnp.where(live, token_logit - log_normalizer[:, 0], 0.0)
        trie_total = trie_total + jnp.where(live, trie_step, 0.0)
        states = jnp.where(live, trie.next_states(states, token), states)
        return (cache, states, total, trie_total), None

    zeros = jnp.zeros((rows,), jnp.float32)
    (_, _, total, trie_total), _ = jax.lax.scan(step, (cache, trie.root_states(rows), zeros, zeros),
                                                jnp.arange(length))
    return SequenceScores(log_probs=total, trie_log_probs=trie_total)
