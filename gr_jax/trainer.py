"""Sharded training state and jitted train/eval steps (t5x's design on jax.jit with explicit shardings).

Shapes first: `jax.eval_shape` of the initialiser gives the boxed abstract state, whose logical axis names map to
NamedShardings through the one rules table; the real initialiser is then jitted with those `out_shardings`, so
parameters are born on their devices. The train step donates the state.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Optional, Protocol, Sequence

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gr_jax import metrics as metrics_lib
from gr_jax import optimizers
from gr_jax import partitioning
from gr_jax.metrics import AnyMetric, LastValue

Array = jax.Array


class TrainableModel(Protocol):
    """What the trainer needs of a model (an encoder-decoder, a dual encoder, GDR's, or a new family's)."""

    def init(self, rng: Array, *, input_length: int, target_length: int) -> Mapping[str, Any]:
        """Boxed variables ({"params": ...}) for inputs and targets of these lengths; the trainer traces it under
        `jax.eval_shape` for shapes and shardings before it runs it."""
        ...

    def loss_fn(self, params: Any, batch: Mapping[str, Array], dropout_rng: Optional[Array]
                ) -> tuple[Array, Mapping[str, AnyMetric]]:
        """(the summed loss, its metrics: `gr_jax.metrics`, its 'loss' an `Average` whose count the gradients
        are divided by); no dropout when `dropout_rng` is None."""
        ...


@flax.struct.dataclass
class TrainState:
    step: Array
    params: Any
    opt_state: Any


class Trainer:
    """Owns the mesh, shardings and compiled steps for one model/optimizer pair.

    Batches are global int32 arrays [batch_size, length] (seqio EncDecFeatureConverter features) split over the
    'data' mesh axis. With `num_microbatches > 1`, gradients are accumulated over equal slices of the batch and
    normalised by the loss's total count (target tokens: the summed loss weights; or queries), so without dropout
    the update equals the single-batch one. With dropout it cannot: microbatch i draws its masks from
    fold_in(step key, i), so the masks differ from the single batch's (same distribution, another draw).

    `frozen` (a regex fully matching '/'-joined parameter paths: LoRA's base, a frozen tower) makes those parameters
    constants of the step: never differentiated, never updated, without optimizer state (`optimizers.freeze`), and
    left out of what a checkpoint keeps (`saved_params`; `with_frozen` puts them back).
    """

    def __init__(self, *, model: TrainableModel, optimizer: optax.GradientTransformation, mesh: Mesh,
                 input_length: int, target_length: int, batch_size: int, num_microbatches: int = 1,
                 learning_rate_fn: Optional[Callable[[Array], Array]] = None,
                 rules: Sequence[tuple[str, Any]] = partitioning.LOGICAL_AXIS_RULES, frozen: Optional[str] = None):
        if batch_size % num_microbatches:
            raise ValueError(f"batch_size {batch_size} is not divisible by num_microbatches {num_microbatches}")
        data_size = mesh.shape["data"]
        if (batch_size // num_microbatches) % data_size:
            raise ValueError(f"microbatch size {batch_size // num_microbatches} is not divisible by the "
                             f"'data' mesh axis ({data_size} devices)")
        self.model = model
        self.optimizer = optimizer if frozen is None else optimizers.freeze(optimizer, frozen)
        self.frozen = frozen
        self.mesh = mesh
        self.rules = tuple(rules)
        self.input_length = input_length
        self.target_length = target_length
        self.batch_size = batch_size
        self.num_microbatches = num_microbatches
        self.learning_rate_fn = learning_rate_fn

        with self.sharding_context():
            abstract = jax.eval_shape(self._init_boxed, jax.random.PRNGKey(0))
        self.state_shardings = partitioning.logical_shardings(abstract, mesh=mesh, rules=self.rules)
        self.abstract_state = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), partitioning.strip_boxes(abstract),
            self.state_shardings)
        # bool per parameter: whether the step differentiates and updates it (all but `frozen`).
        self._trained = None if frozen is None else optimizers.trained_mask(self.abstract_state.params, frozen)
        self.batch_sharding = partitioning.batch_sharding(mesh)
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self._init = jax.jit(lambda rng: partitioning.strip_boxes(self._init_boxed(rng)),
                             out_shardings=self.state_shardings)
        self._train_step = jax.jit(self._train_step_impl, in_shardings=(self.state_shardings, self.batch_sharding,
                                                                         self.replicated),
                                   out_shardings=(self.state_shardings, self.replicated), donate_argnums=(0,))
        self._eval_step = jax.jit(self._eval_step_impl,
                                  in_shardings=(self.state_shardings.params, self.batch_sharding),
                                  out_shardings=self.replicated)

    def sharding_context(self):
        """Mesh and logical rules in scope, so activation constraints inside the network resolve."""
        return partitioning.partitioning_context(mesh=self.mesh, rules=self.rules)

    # --- State ----------------------------------------------------------------------------------------------

    def _init_boxed(self, rng: Array) -> TrainState:
        params = self.model.init(rng, input_length=self.input_length, target_length=self.target_length)["params"]
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=self.optimizer.init(params))

    def init_state(self, rng: Array, *, given: Optional[Mapping[str, Any]] = None) -> TrainState:
        """The initial state of `rng`. given: top-level parameter subtrees already made (pretrained weights on this
        trainer's shardings, shaped as `abstract_state.params[name]`) that replace the initialiser's: their random
        values are never computed (the compiled initialiser drops them; for a pretrained tower replicated on many
        devices, that is most of the work), and every other value is the one `init_state(rng)` gives."""
        with self.sharding_context():
            if not given:
                return self._init(rng)
            self._check_given(given)
            return jax.jit(self._init_with, out_shardings=self.state_shardings)(rng, dict(given))

    def _init_with(self, rng: Array, given: dict[str, Any]) -> TrainState:
        state = partitioning.strip_boxes(self._init_boxed(rng))
        return state.replace(params={**state.params, **given})

    def _check_given(self, given: Mapping[str, Any]) -> None:
        abstract = self.abstract_state.params
        for name, subtree in given.items():
            if name not in abstract:
                raise ValueError(f"given parameters {name!r}: the model has no such subtree (it has "
                                 f"{sorted(abstract)})")
            want = {partitioning.path_str(p): (a.shape, a.dtype) for p, a in jax.tree.leaves_with_path(abstract[name])}
            got = {partitioning.path_str(p): (a.shape, a.dtype) for p, a in jax.tree.leaves_with_path(subtree)}
            if want != got:
                wrong = min(path for path in want.keys() | got.keys() if want.get(path) != got.get(path))
                raise ValueError(f"given parameters {name!r} are not shaped as the model's {name!r} (e.g. {wrong}: "
                                 f"{got.get(wrong, 'absent')} given, {want.get(wrong, 'absent')} expected)")

    def param_count(self, *, trained_only: bool = False) -> int:
        """The model's parameters; `trained_only`: those the step updates (all but `frozen`)."""
        params = self._split(self.abstract_state.params)[0] if trained_only else self.abstract_state.params
        return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))

    # --- Steps ----------------------------------------------------------------------------------------------

    def _split(self, params) -> tuple[Any, Any]:
        """(the trained parameters, the frozen ones), each the full tree with None where the other's are."""
        if self._trained is None:
            return params, None
        return (jax.tree.map(lambda trained, p: p if trained else None, self._trained, params),
                jax.tree.map(lambda trained, p: None if trained else p, self._trained, params))

    def saved_params(self, params: Any) -> Any:
        """What a checkpoint keeps of `params` (concrete or abstract): without `frozen`, all of them; with it, only
        the trained ones, the frozen subtrees dropped (a LoRA checkpoint holds the adapters; the base is the run's
        own reference, `with_frozen`)."""
        if self._trained is None:
            return params
        trained = traverse_util.flatten_dict(self._trained, sep="/")
        return traverse_util.unflatten_dict({name: leaf for name, leaf in traverse_util.flatten_dict(
            params, sep="/").items() if trained[name]}, sep="/")

    def with_frozen(self, saved: Any, *, base: Any) -> Any:
        """The full parameters: `saved` (as `saved_params` kept them) with the frozen ones taken from `base`."""
        if self._trained is None:
            return saved
        trained = traverse_util.flatten_dict(self._trained, sep="/")
        kept = traverse_util.flatten_dict(saved, sep="/")
        missing = sorted(name for name, is_trained in trained.items() if is_trained and name not in kept)
        if missing:
            raise ValueError(f"the saved parameters lack trained ones, e.g. {missing[:3]}")
        base_leaves = traverse_util.flatten_dict(base, sep="/")
        full = {name: kept[name] if is_trained else base_leaves[name] for name, is_trained in trained.items()}
        return traverse_util.unflatten_dict(full, sep="/")

    def _merge(self, trained: Any, frozen: Any) -> Any:
        if self._trained is None:
            return trained
        return jax.tree.map(lambda is_trained, t, f: t if is_trained else f, self._trained, trained, frozen)

    def _grads(self, params, batch, dropout_rng):
        """(gradients of the trained parameters: the tree with None at frozen ones, which are never
        differentiated; metrics)."""
        params, frozen = self._split(params)
        grad_fn = jax.value_and_grad(lambda trained, *args: self.model.loss_fn(self._merge(trained, frozen), *args),
                                     has_aux=True)
        if self.num_microbatches == 1:
            (_, metrics), grads = grad_fn(params, batch, dropout_rng)
            return grads, metrics

        def split(x):  # [batch, ...] -> [micro, batch/micro, ...]; slice i takes rows i, i+micro, ...
            x = x.reshape((x.shape[0] // self.num_microbatches, self.num_microbatches) + x.shape[1:])
            return jnp.swapaxes(x, 0, 1)

        micro = jax.tree.map(split, batch)

        def body(carry, inputs):
            grads_acc, metrics_acc = carry
            index, mb = inputs
            (_, metrics), grads = grad_fn(params, mb, jax.random.fold_in(dropout_rng, index))
            return (jax.tree.map(jnp.add, grads_acc, grads), metrics_lib.merge(metrics_acc, metrics)), None

        zeros_grads = jax.tree.map(jnp.zeros_like, params)
        zeros_metrics = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype),
                                     jax.eval_shape(lambda: grad_fn(params, jax.tree.map(lambda x: x[0], micro),
                                                                    dropout_rng)[0][1]))
        (grads, metrics), _ = jax.lax.scan(body, (zeros_grads, zeros_metrics),
                                           (jnp.arange(self.num_microbatches), micro))
        return grads, metrics

    def _train_step_impl(self, state: TrainState, batch: Mapping[str, Array], rng: Array):
        dropout_rng = jax.random.fold_in(rng, state.step)
        grads, metrics = self._grads(state.params, batch, dropout_rng)
        # Loss sums -> gradient of the mean loss per target token (per query) over the whole (accumulated) batch.
        count = jnp.maximum(metrics_lib.loss_count(metrics), 1.0)
        grads = jax.tree.map(lambda g: g / count, grads)
        trained, frozen = self._split(state.params)
        # Frozen parameters: zero gradients for the optimizer (which gives them no update), then kept as they are.
        updates, opt_state = self.optimizer.update(
            self._merge(grads, jax.tree.map(jnp.zeros_like, frozen)), state.opt_state, state.params)
        params = self._merge(optax.apply_updates(trained, self._split(updates)[0]), frozen)
        metrics = dict(metrics, grad_norm=LastValue(value=optax.tree.norm(grads)))
        if self.learning_rate_fn is not None:
            metrics["learning_rate"] = LastValue(value=self.learning_rate_fn(state.step))
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics

    def _eval_step_impl(self, params, batch: Mapping[str, Array]):
        return self.model.loss_fn(params, batch, None)[1]

    def _to_global(self, batch: Mapping[str, np.ndarray]) -> dict[str, Array]:
        return partitioning.host_batch_to_global(dict(batch), mesh=self.mesh)

    def train_step(self, state: TrainState, batch: Mapping[str, np.ndarray], rng: Array
                   ) -> tuple[TrainState, dict[str, Array]]:
        """One optimizer update; `state` is donated (do not reuse it)."""
        with self.sharding_context():
            return self._train_step(state, self._to_global(batch), rng)

    def eval_step(self, params, batch: Mapping[str, np.ndarray]) -> dict[str, Array]:
        with self.sharding_context():
            return self._eval_step(params, self._to_global(batch))

    def evaluate_loss(self, params, batches: Iterator[Mapping[str, np.ndarray]]) -> dict[str, float]:
        """Token-level loss/accuracy over a finite stream of batches (padding rows carry zero weight)."""
        total: Optional[dict] = None
        for batch in batches:
            metrics = jax.device_get(self.eval_step(params, batch))
            total = metrics if total is None else metrics_lib.merge(total, metrics)
        if total is None:
            raise ValueError("evaluate_loss got no batches")
        return metrics_lib.summarize(total)

    def trace_train_step(self, state: Any, batch: Mapping[str, Any], rng: Any) -> jax.stages.Traced:
        """The traced train step (its jaxpr), for counting its operations in benchmarks."""
        with self.sharding_context():
            return self._train_step.trace(state, batch, rng)

    def lower_train_step(self, state: Any, batch: Mapping[str, Any], rng: Any):
        """Lowered (not compiled) train step, for cost analysis in benchmarks."""
        with self.sharding_context():
            return self._train_step.lower(state, batch, rng)


def summarize_steps(pending: Sequence[Mapping[str, Any]], *, seconds: float,
                    tokens_per_batch: int) -> dict[str, float]:
    """The training metrics of the steps since the last report, each merged over the steps by its own reduction
    (`gr_jax.metrics`: the loss per target token, the last step's learning rate and gradient norm), and steps and
    tokens per second."""
    if not pending:
        return {}
    summary = metrics_lib.summarize(metrics_lib.merge_steps(jax.device_get(list(pending))))
    summary["steps_per_second"] = len(pending) / seconds
    summary["tokens_per_second"] = len(pending) * tokens_per_batch / seconds
    return summary
