"""The paper's non-generative rankers over a lookup table of item embeddings (Rozonoyer et al., Sec. 6, Fig. 4).

Queries and documents are items of one table E float[num_items, n] (WordNet: every synset is both).

    dual encoder (Eq. 13)   S(q, d) = <E(q), E(d)>, rows kept on the unit sphere (projected after every step);
                            L = -(1/B) sum_i lambda(r_i) log softmax_j(S(q_i, d_j) / tau)_i over the batch's
                            documents, tau = 0.05
    cross encoder (Eq. 14)  f(q, d) = MLP(concat(E(q), E(d))), 3 hidden ReLU layers of width 2n, a scalar out;
                            L = -sum_i [ lambda(r_i) / sum_j lambda(r_j) log sigmoid(f(q_i, d_i))
                                         + (1/B) log sigmoid(-f(q_i, d_rho(i))) ], rho a random permutation

Training examples are (query item, document item, lambda(r)) triples, one per ranked document of a query
(`gr_jax.ranking.targets` gives lambda). Optimisers as the paper's: SGD (lr 1.0, momentum 0.9) for the dual
encoder, AdamW (lr 1e-3, weight decay 1e-3) for the cross encoder, whose weights start N(0, 1 / (2n)) with zero
biases. `score(params, queries, documents)` scores pairs int[...] for the ranking metrics
(`gr_jax.ranking.metrics`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

Array = jax.Array


class _Table(nn.Module):
    num_items: int
    dim: int

    @nn.compact
    def __call__(self, items: Array) -> Array:
        table = self.param("embedding", nn.initializers.normal(1.0), (self.num_items, self.dim))
        return jnp.take(table, items, axis=0)


class _CrossEncoderNet(nn.Module):
    num_items: int
    dim: int

    @nn.compact
    def __call__(self, queries: Array, documents: Array) -> Array:
        table = _Table(self.num_items, self.dim, name="table")
        x = jnp.concatenate([table(queries), table(documents)], axis=-1)
        init = nn.initializers.normal((1.0 / (2 * self.dim)) ** 0.5)  # N(0, 1/(2n)): variance 1/(2n)
        for i in range(3):
            x = nn.relu(nn.Dense(2 * self.dim, kernel_init=init, name=f"hidden_{i}")(x))
        return nn.Dense(1, kernel_init=init, name="out")(x)[..., 0]


def _apply(module: nn.Module, params: Any, *inputs: Array) -> Array:
    """`module`'s output for `inputs`: flax types `apply` as maybe (output, state), which it is only with `mutable`."""
    return cast(Array, module.apply({"params": params}, *inputs))


def _unit_rows(params: Any) -> Any:
    table = params["embedding"]
    return {**params, "embedding": table / jnp.maximum(jnp.linalg.norm(table, axis=-1, keepdims=True), 1e-12)}


@dataclasses.dataclass(frozen=True)
class DualEncoderTable:
    """Eq. 13's dual encoder over a lookup table (see the module docstring)."""
    num_items: int
    dim: int
    temperature: float = 0.05
    learning_rate: float = 1.0
    momentum: float = 0.9

    @property
    def module(self) -> _Table:
        return _Table(self.num_items, self.dim)

    def init(self, rng: Array) -> Any:
        return _unit_rows(self.module.init(rng, jnp.zeros((1,), jnp.int32))["params"])

    def optimizer(self) -> optax.GradientTransformation:
        return optax.sgd(self.learning_rate, momentum=self.momentum)

    def loss(self, params, queries: Array, documents: Array, weights: Array, rng: Array) -> Array:
        """queries, documents int[B], weights float[B] (lambda(r_i)) -> Eq. 13."""
        del rng
        q = _apply(self.module, params, queries)
        d = _apply(self.module, params, documents)
        logits = q @ d.T / self.temperature  # [B (queries), B (documents)]
        log_p = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(weights * jnp.diagonal(log_p))

    def after_step(self, params) -> Any:
        return _unit_rows(params)

    def score(self, params, queries: Array, documents: Array) -> Array:
        q = _apply(self.module, params, queries)
        d = _apply(self.module, params, documents)
        return jnp.sum(q * d, axis=-1)


@dataclasses.dataclass(frozen=True)
class CrossEncoderTable:
    """Eq. 14's MLP cross encoder over a lookup table (see the module docstring)."""
    num_items: int
    dim: int
    learning_rate: float = 1e-3
    weight_decay: float = 1e-3

    @property
    def module(self) -> _CrossEncoderNet:
        return _CrossEncoderNet(self.num_items, self.dim)

    def init(self, rng: Array) -> Any:
        zeros = jnp.zeros((1,), jnp.int32)
        return self.module.init(rng, zeros, zeros)["params"]

    def optimizer(self) -> optax.GradientTransformation:
        return optax.adamw(self.learning_rate, weight_decay=self.weight_decay)

    def loss(self, params, queries: Array, documents: Array, weights: Array, rng: Array) -> Array:
        """Eq. 14: weighted positives over sum(lambda), and each query against a permuted batch's document."""
        positive = _apply(self.module, params, queries, documents)
        shuffled = documents[jax.random.permutation(rng, documents.shape[0])]
        negative = _apply(self.module, params, queries, shuffled)
        positive_term = jnp.sum(weights * jax.nn.log_sigmoid(positive)) / jnp.maximum(jnp.sum(weights), 1e-12)
        return -(positive_term + jnp.mean(jax.nn.log_sigmoid(-negative)))

    def after_step(self, params) -> Any:
        return params

    def score(self, params, queries: Array, documents: Array) -> Array:
        return _apply(self.module, params, queries, documents)


def train(ranker, *, queries: np.ndarray, documents: np.ndarray, weights: np.ndarray, steps: int, batch_size: int,
          seed: int = 0) -> Any:
    """Trains `ranker` (`DualEncoderTable` or `CrossEncoderTable`) on the triples int[N], int[N], float[N] (examples
    of zero weight are left out), batches drawn uniformly with replacement from one seeded generator; returns the
    parameters."""
    keep = np.asarray(weights) > 0
    queries, documents, weights = (np.asarray(a)[keep] for a in (queries, documents, weights))
    if not len(queries):
        raise ValueError("no training triple has a positive weight")
    optimizer = ranker.optimizer()
    rng = jax.random.PRNGKey(seed)
    params = ranker.init(rng)
    state = optimizer.init(params)

    @jax.jit
    def step(params, state, q, d, w, key):
        loss, grads = jax.value_and_grad(ranker.loss)(params, q, d, w, key)
        updates, state = optimizer.update(grads, state, params)
        return ranker.after_step(optax.apply_updates(params, updates)), state, loss

    sampler = np.random.default_rng(seed)
    for i in range(steps):
        rows = sampler.integers(0, len(queries), size=batch_size)
        params, state, _ = step(params, state, jnp.asarray(queries[rows], jnp.int32),
                                jnp.asarray(documents[rows], jnp.int32), jnp.asarray(weights[rows], jnp.float32),
                                jax.random.fold_in(rng, i))
    return params
