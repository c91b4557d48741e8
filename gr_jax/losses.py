"""Training losses as functions of the model's outputs, configured in one place (`Experiment.loss`, gin).

A loss receives one `Outputs` per forward pass of a training batch (teacher-forced logits and decoder states, each
target token's logits column and weight) and returns a summed loss with metrics that carry their reduction
(`gr_jax.metrics`: the loss an `Average` over its target tokens), so that gradient accumulation and multi-device
reduction normalise by the true number of target tokens. Losses:
  * `TokenCrossEntropy`: cross entropy of the target tokens plus t5x's z-loss (the default);
  * `ConsistencyRegularised`: an objective over two dropout passes plus NCI's consistency regulariser between them.
A new objective (a contrastive loss) is one new class here and a gin binding; soft targets (SToICaL) come with the
batch and every cross entropy here reads them.

Everything is computed in float32 from logits (log space); masked logits are the network's finite NEG_INF, so no
term is inf - inf and padding positions are zeroed by the weights, never by multiplying an inf.

Consistency (NCI, Wang et al. 2022, Sec. 3.4; R-Drop): the same batch goes through the network twice with
different dropout masks, and the two passes are pulled together at every valid target position, either
  * 'symmetric_kl': 1/2 [KL(p1 || p2) + KL(p2 || p1)] of the two output distributions (R-Drop's form), or
  * 'contrastive':  NCI's Eq. 5, a softmax over the batch: the decoder state of pass 1 must pick out its own pass-2
    state among the states of all other examples (and vice versa), as `Rdrop_loss="Contrast"` in NCI's code.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Optional, Protocol

import jax
import jax.numpy as jnp

from gr_jax import metrics as metrics_lib
from gr_jax.metrics import Average
from gr_jax.network import NEG_INF

Array = jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Outputs:
    """One teacher-forced pass over a batch, as a loss sees it.

    logits: float32[batch, length, columns]; states: the decoder's final states [batch, length, embed] (None where
    the pass kept none: `EncoderDecoderModel.score_candidates`);
    columns: int32[batch, length], the logits column of each target token (the head's `target_columns`);
    weights: float32[batch, length]; invalid: bool[batch, length], weighted targets the head cannot score.
    Soft targets (SToICaL's trie-marginalised y(r, t), `gr_jax.ranking`), when the batch has them:
    soft_columns int32[batch, length, K] and soft_mass float32[batch, length, K] (summing to 1 at every weighted
    position); None: the target is one-hot on `columns`.
    """
    logits: Array
    states: Optional[Array]
    columns: Array
    weights: Array
    invalid: Array
    soft_columns: Optional[Array] = None
    soft_mass: Optional[Array] = None


class Loss(Protocol):
    """`(passes) -> (summed loss, metrics)`; `num_passes` forward passes per training batch, each with its
    own dropout key (evaluation without dropout gives one pass)."""

    num_passes: int

    def __call__(self, passes: Sequence[Outputs]) -> tuple[Array, dict[str, metrics_lib.AnyMetric]]: ...


def loss_over_passes(loss: Loss, outputs: Callable[[Optional[Array]], Outputs],
                     dropout_rng: Optional[Array]) -> tuple[Array, dict[str, metrics_lib.AnyMetric]]:
    """`loss` of `loss.num_passes` teacher-forced passes, `outputs(key)` each with its own dropout key, or of one
    pass without dropout (`outputs(None)`) when `dropout_rng` is None: any generative model's `loss_fn`."""
    if dropout_rng is None:
        return loss([outputs(None)])
    keys = [dropout_rng] if loss.num_passes == 1 else list(jax.random.split(dropout_rng, loss.num_passes))
    return loss([outputs(key) for key in keys])


def cross_entropy_with_z_loss(logits: Array, targets: Array, *, z_loss: float) -> tuple[Array, Array]:
    """Token-level cross entropy plus t5x's z-loss (keeps log Z near 0, which stabilises bfloat16 training).

    logits: float32[..., vocab], targets: int32[...] -> (total loss [...], z-loss part [...]).
    The gradient is written out, as t5x's `cross_entropy_with_logits` does: `softmax * (1 + 2 z log Z) - one_hot`
    in one pass over the logits, where autodiff of the gather scatters into a zero tensor of their size and
    exponentiates in passes of its own (3 logits-sized passes of T5.1.1 small's step, whose 32k vocabulary makes
    the logits its largest activation).
    """
    return _cross_entropy(logits.astype(jnp.float32), targets, float(z_loss))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _cross_entropy(logits: Array, targets: Array, z_loss: float) -> tuple[Array, Array]:
    return _cross_entropy_forward(logits, targets, z_loss)[0]


def _cross_entropy_forward(logits, targets, z_loss):
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    z = z_loss * jnp.square(log_z)
    return (log_z - target_logit + z, z), (logits, targets, log_z)


def _cross_entropy_backward(z_loss, residuals, cotangents):
    logits, targets, log_z = residuals
    d_loss, d_z = cotangents  # [...] each: the total loss and its z-loss part are both outputs
    d_log_z = d_loss + 2.0 * z_loss * log_z * (d_loss + d_z)
    probs = jnp.exp(logits - log_z[..., None])
    is_target = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1) == targets[..., None]
    return d_log_z[..., None] * probs - jnp.where(is_target, d_loss[..., None], 0.0), None


_cross_entropy.defvjp(_cross_entropy_forward, _cross_entropy_backward)


def soft_cross_entropy_with_z_loss(logits: Array, columns: Array, mass: Array, *,
                                   z_loss: float) -> tuple[Array, Array]:
    """Cross entropy against a soft target plus t5x's z-loss: -sum_k mass_k log p(columns_k) + z_loss log^2 Z.

    logits: float32[..., vocab]; columns int32[..., K] and mass float32[..., K], the target's support and its
    probabilities (mass 0 on padding slots) -> (total loss [...], z-loss part [...]). One-hot mass on the target
    column gives `cross_entropy_with_z_loss` exactly.
    """
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logits = jnp.take_along_axis(logits, columns, axis=-1)
    mass = mass.astype(jnp.float32)
    z = z_loss * jnp.square(log_z)
    return log_z * jnp.sum(mass, axis=-1) - jnp.sum(jnp.where(mass > 0, mass * target_logits, 0.0), axis=-1) + z, z


def symmetric_kl(logits_a: Array, logits_b: Array) -> Array:
    """1/2 [KL(p_a || p_b) + KL(p_b || p_a)] per position: float32[..., vocab] x 2 -> float32[...], >= 0.

    Uses the identity 1/2 sum_v (p_a - p_b)(log p_a - log p_b): every term is >= 0 (log is increasing), so
    rounding can never make the sum negative, and columns masked in both passes contribute exactly 0.
    """
    log_a = jax.nn.log_softmax(logits_a.astype(jnp.float32), axis=-1)
    log_b = jax.nn.log_softmax(logits_b.astype(jnp.float32), axis=-1)
    return 0.5 * jnp.sum((jnp.exp(log_a) - jnp.exp(log_b)) * (log_a - log_b), axis=-1)


def contrastive_consistency(states_a: Array, states_b: Array, valid: Array, *, temperature: float = 1.0) -> Array:
    """NCI's Eq. 5 per position: float32[batch, length].

    states_a, states_b: [batch, length, embed], the decoder's final states of the two passes (what the output layer
    reads); valid: bool[batch, length], the positions with a target. At each position t, the 2 * batch states are
    compared by scaled dot product <z, z'> / (embed * temperature) (NCI scales states by embed^-1/2 before their dot
    product); each state's positive is the other pass of the same example, its negatives are every other valid state
    of that position in both passes (itself excluded). The value at (i, t) is the mean of the two directions'
    cross entropies; invalid positions are 0. A position with one valid example has no negative: its value is 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    batch, _, embed = states_a.shape
    z = jnp.concatenate([states_a, states_b], axis=0).astype(jnp.float32)  # [2B, L, d]
    ok = jnp.concatenate([valid, valid], axis=0)  # [2B, L]
    sim = jnp.einsum("itd,jtd->tij", z, z) / (embed * temperature)  # [L, 2B, 2B]
    rows = jnp.arange(2 * batch)
    allowed = ok.T[:, None, :] & (rows[:, None] != rows[None, :])[None]  # [L, 2B (query), 2B (candidate)]
    sim = jnp.where(allowed, sim, NEG_INF)
    positive = (rows + batch) % (2 * batch)  # the other pass of the same example
    positive_sim = jnp.take_along_axis(sim, jnp.broadcast_to(positive[None, :, None], sim.shape[:2] + (1,)),
                                       axis=-1)[..., 0]
    per_state = jax.nn.logsumexp(sim, axis=-1) - positive_sim  # [L, 2B]
    per_state = jnp.where(ok.T, per_state, 0.0)
    return (0.5 * (per_state[:, :batch] + per_state[:, batch:])).T  # [B, L]


def target_cross_entropy(out: Outputs, *, z_loss: float) -> tuple[Array, Array]:
    """Each position's cross entropy plus t5x's z-loss (total [batch, length], z-loss part [batch, length]) against
    `out`'s soft targets where it has them, else one-hot on its columns; NaN where the target is invalid (a weighted
    NaN makes the loss NaN rather than train on a token the head cannot score). Unweighted."""
    if out.soft_columns is None:
        token_loss, z = cross_entropy_with_z_loss(out.logits, out.columns, z_loss=z_loss)
    else:
        if out.soft_mass is None:
            raise ValueError("Outputs has soft_columns without their soft_mass")
        token_loss, z = soft_cross_entropy_with_z_loss(out.logits, out.soft_columns, out.soft_mass, z_loss=z_loss)
    return jnp.where(out.invalid, jnp.nan, token_loss), z


@dataclasses.dataclass(frozen=True)
class TokenCrossEntropy:
    """Cross entropy of every weighted target token plus t5x's z-loss (`z_loss` = 1e-4, t5x's default): against
    the one-hot target column, or against the batch's soft targets where it has them (SToICaL's y(r, t)). A weight
    other than 1 scales a token's term (SToICaL's item weight lambda(r)); the trainer divides by the summed weight.

    Metrics (`gr_jax.metrics`): loss and z_loss per target token (count: the summed weights), token_accuracy, and
    sequence_accuracy (every weighted token right: exact match of the docid) per query with a target. A weighted
    invalid target makes the loss NaN.
    """
    z_loss: float = 1e-4
    num_passes = 1

    def __call__(self, passes: Sequence[Outputs]) -> tuple[Array, dict[str, metrics_lib.AnyMetric]]:
        (out,) = passes
        token_loss, z = target_cross_entropy(out, z_loss=self.z_loss)
        weights = out.weights
        correct = (jnp.argmax(out.logits, axis=-1) == out.columns).astype(jnp.float32)
        seq_correct = jnp.all((correct > 0) | (weights == 0), axis=-1).astype(jnp.float32)
        has_target = (jnp.sum(weights, axis=-1) > 0).astype(jnp.float32)
        loss, tokens, sequences = jnp.sum(token_loss * weights), jnp.sum(weights), jnp.sum(has_target)
        metrics: dict[str, metrics_lib.AnyMetric] = {
            "loss": Average(total=loss, count=tokens),
            "z_loss": Average(total=jnp.sum(z * weights), count=tokens),
            "token_accuracy": Average(total=jnp.sum(correct * weights), count=tokens),
            "sequence_accuracy": Average(total=jnp.sum(seq_correct * has_target), count=sequences),
        }
        return loss, metrics


class ConsistencyMeasure(Protocol):
    """Per-position disagreement of two passes, float32[batch, length] (>= 0)."""

    def __call__(self, a: Outputs, b: Outputs) -> Array: ...


@dataclasses.dataclass(frozen=True)
class SymmetricKL:
    """R-Drop's measure: the symmetric KL divergence of the two passes' output distributions (`symmetric_kl`)."""

    def __call__(self, a: Outputs, b: Outputs) -> Array:
        return symmetric_kl(a.logits, b.logits)


@dataclasses.dataclass(frozen=True)
class ContrastiveStates:
    """NCI's Eq. 5 (`contrastive_consistency`): each decoder state must pick out its other pass within the batch."""
    temperature: float = 1.0

    def __post_init__(self):
        if not self.temperature > 0.0:
            raise ValueError(f"consistency temperature must be > 0, got {self.temperature}")

    def __call__(self, a: Outputs, b: Outputs) -> Array:
        if a.states is None or b.states is None:
            raise ValueError("ContrastiveStates compares the passes' decoder states: these Outputs have none")
        return contrastive_consistency(a.states, b.states, a.weights > 0, temperature=self.temperature)


@dataclasses.dataclass(frozen=True)
class ConsistencyRegularised:
    """NCI's consistency regulariser (Wang et al. 2022, Sec. 3.4): the batch runs twice with independent dropout
    masks; the loss is the two passes' mean `objective` plus `weight` x the `measure` summed over the weighted
    target positions (NCI: weight 0.15). Metrics add `consistency_loss` (the unweighted sum, per target token) and
    keep pass 1's accuracy. Given one pass (evaluation, no dropout) it is the objective alone.
    """
    weight: float
    measure: ConsistencyMeasure = SymmetricKL()
    objective: Loss = TokenCrossEntropy()
    num_passes = 2

    def __post_init__(self):
        if not callable(self.measure):
            raise ValueError(f"consistency measure must be one of SymmetricKL(), ContrastiveStates() or another "
                             f"ConsistencyMeasure, got {self.measure!r}")
        if not self.weight >= 0.0:
            raise ValueError(f"consistency weight must be >= 0, got {self.weight}")
        if self.objective.num_passes != 1:
            raise ValueError("the consistency regulariser's objective must take one pass per call")

    def __call__(self, passes: Sequence[Outputs]) -> tuple[Array, dict[str, metrics_lib.AnyMetric]]:
        if len(passes) == 1:
            return self.objective(passes)
        a, b = passes
        loss_a, metrics = self.objective([a])
        loss_b, metrics_b = self.objective([b])
        per_position = self.measure(a, b)
        consistency = jnp.sum(jnp.where(a.weights > 0, per_position * a.weights, 0.0))
        total = 0.5 * (loss_a + loss_b) + self.weight * consistency
        tokens = metrics_lib.loss_count(metrics)
        metrics = dict(metrics, loss=Average(total=total, count=tokens),
                       consistency_loss=Average(total=consistency, count=tokens))
        if "z_loss" in metrics:
            z_a, z_b = metrics["z_loss"], metrics_b["z_loss"]
            if not isinstance(z_a, Average) or not isinstance(z_b, Average):
                raise TypeError(f"the objective's z_loss must be a metrics.Average, got {type(z_a).__name__}")
            metrics["z_loss"] = Average(total=0.5 * (z_a.total + z_b.total), count=z_a.count)
        return total, metrics
