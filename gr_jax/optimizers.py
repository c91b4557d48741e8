"""Learning-rate schedules and optimizers (optax) with T5 / t5x defaults.

All schedules map the optimizer step `count` (0 for the first update, as optax counts) to a learning
rate; all start their linear warm-up at 0, so the very first update is a no-op, exactly as t5x's
`linear_warmup` factor. Plain functions with keyword-only arguments: gin binds them at the entry points.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn
from flax.core import meta

OPTIMIZERS = ("adafactor", "adamw")


def _check_schedule_args(*, peak: float, warmup_steps: int) -> None:
    if not peak > 0:
        raise ValueError(f"peak learning rate must be > 0, got {peak}")
    if warmup_steps < 0:
        raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")


def warmup_constant(*, peak: float, warmup_steps: int) -> optax.Schedule:
    """`peak * min(1, step / warmup_steps)`: linear warm-up from 0, then constant (T5 fine-tuning)."""
    _check_schedule_args(peak=peak, warmup_steps=warmup_steps)
    if warmup_steps == 0:
        return optax.constant_schedule(peak)
    return optax.warmup_constant_schedule(init_value=0.0, peak_value=peak, warmup_steps=warmup_steps)


def warmup_rsqrt(*, peak: float, warmup_steps: int) -> optax.Schedule:
    """`peak * min(1, step / w) * sqrt(w / max(step, w))`: linear warm-up to `peak`, then `peak * sqrt(w / step)`.

    This is t5x's `create_learning_rate_scheduler(factors='constant * linear_warmup *
    rsqrt_normalized_decay', base_learning_rate=peak, warmup_steps=w)`. The T5 paper's pre-training
    schedule, `1 / sqrt(max(step, 10^4))` (t5x's 'constant * rsqrt_decay'), is the same decay
    (`peak = 1 / sqrt(w)`) but holds `peak` during the first `w` steps instead of ramping up to it.
    """
    _check_schedule_args(peak=peak, warmup_steps=warmup_steps)
    if warmup_steps < 1:
        raise ValueError("warmup_rsqrt needs warmup_steps >= 1: the decay is relative to the warm-up length")

    def schedule(count):
        step = jnp.asarray(count, jnp.float32)
        warmup = jnp.float32(warmup_steps)
        return peak * jnp.minimum(1.0, step / warmup) * jnp.sqrt(warmup / jnp.maximum(step, warmup))

    return schedule


def linear_decay(*, peak: float, warmup_steps: int, total_steps: int, end_value: float = 0.0) -> optax.Schedule:
    """Linear warm-up from 0 to `peak`, then linear decay to `end_value` at `total_steps` (held after)."""
    _check_schedule_args(peak=peak, warmup_steps=warmup_steps)
    if total_steps <= warmup_steps:
        raise ValueError(f"total_steps ({total_steps}) must exceed warmup_steps ({warmup_steps})")
    if end_value < 0:
        raise ValueError(f"end_value must be >= 0, got {end_value}")
    decay = optax.linear_schedule(init_value=peak, end_value=end_value, transition_steps=total_steps - warmup_steps)
    if warmup_steps == 0:
        return decay
    warmup = optax.linear_schedule(init_value=0.0, end_value=peak, transition_steps=warmup_steps)
    return optax.join_schedules([warmup, decay], boundaries=[warmup_steps])


def decay_matrices_only(params: Any) -> Any:
    """Weight-decay mask: decay parameters with >= 2 dims (kernels, embeddings), not norm scales or biases."""
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


# How Adafactor factors a second moment along each logical axis (t5x's `adafactor.standard_logical_factor_rules`):
# 'row' and 'column' dimensions become the rows and columns of the factored matrix, 'batch' dimensions (scanned
# layers) are split into one parameter per layer (`per_layer`), 'none' leaves the parameter unfactored.
ADAFACTOR_FACTOR_RULES: Mapping[str, str] = {
    "embed": "row", "vocab": "column", "mlp": "column", "heads": "column", "kv_heads": "column", "kv": "column",
    "relpos_buckets": "none", "layers": "batch", "lora_rank": "none"}
FACTOR_DIMS = ("row", "column", "batch", "none")


def _is_box(x) -> bool:
    return isinstance(x, meta.AxisMetadata)


@dataclasses.dataclass(frozen=True)
class MatrixView:
    """How the factored stage sees one parameter: transposed by `permutation` and reshaped to `shape`
    ([rows, columns], or flat [size] to keep it unfactored). `shape=None` leaves it as it is."""
    permutation: tuple[int, ...] = ()
    shape: Optional[tuple[int, ...]] = None

    def to_view(self, x):
        return x if self.shape is None else jnp.transpose(x, self.permutation).reshape(self.shape)

    def from_view(self, x, *, like_shape: tuple[int, ...]):
        if self.shape is None:
            return x
        inverse = tuple(np.argsort(self.permutation).tolist())
        return jnp.transpose(x.reshape([like_shape[i] for i in self.permutation]), inverse)


def matrix_view(*, path: str, names: tuple, shape: tuple[int, ...], rules: Mapping[str, str],
                min_dim_size_to_factor: int = 128) -> MatrixView:
    """The `MatrixView` of a parameter with logical axis `names` (see `ADAFACTOR_FACTOR_RULES`). A 'batch' axis
    (scanned layers) must have been split off first (`per_layer`, as `make_optimizer` does). An unfactored
    parameter keeps its own shape, so its full second moment is sharded as it is, where optax's shape rule would
    not factor it either (a second-largest dimension below `min_dim_size_to_factor`: LoRA's adapters, whose rank
    is small); only where that rule would factor it is it seen as one vector."""
    dims = []
    for name in names:
        if name not in rules:
            raise ValueError(f"{path}: logical axis {name!r} (of {names}) has no Adafactor factoring rule; add it to "
                             f"factor_rules {dict(rules)}")
        if rules[name] not in FACTOR_DIMS:
            raise ValueError(f"factor_rules[{name!r}] = {rules[name]!r}: use one of {FACTOR_DIMS}")
        dims.append(rules[name])
    rows = [i for i, d in enumerate(dims) if d == "row"]
    columns = [i for i, d in enumerate(dims) if d == "column"]
    if "batch" in dims:
        raise ValueError(f"{path}: the batch axis of {names} reaches the factoring: wrap the optimizer in per_layer")
    if len(shape) < 2:
        return MatrixView()  # optax never factors a vector
    if not rows or not columns or "none" in dims:
        if sorted(shape)[-2] < min_dim_size_to_factor:
            return MatrixView()
        return MatrixView(permutation=tuple(range(len(shape))), shape=(math.prod(shape),))
    permutation = (*rows, *columns)
    view = (math.prod(shape[i] for i in rows), math.prod(shape[i] for i in columns))
    if permutation == tuple(range(len(shape))) and view == tuple(shape):
        return MatrixView()
    return MatrixView(permutation=permutation, shape=view)


@flax.struct.dataclass
class ViewedState:
    inner: Any
    views: Any = flax.struct.field(pytree_node=False)  # a tuple of MatrixView per parameter leaf (static)


def factor_by_logical_axes(inner: optax.GradientTransformation, *, rules: Mapping[str, str],
                           min_dim_size_to_factor: int = 128) -> optax.GradientTransformation:
    """`inner` (optax's factored second moments) applied to each parameter seen as the matrix its logical axes make.

    The axis names are read when `init` gets the boxed parameters (`nn.with_logical_partitioning`, as the
    `Trainer` initialises); the views are kept in the state's static tree structure, so the jitted, restored and
    resharded state carries them. Leaves without names keep their shape (optax's rule).
    """
    def views_of(params) -> tuple:
        leaves = jax.tree_util.tree_leaves_with_path(params, is_leaf=_is_box)
        views = []
        for path, leaf in leaves:
            if isinstance(leaf, nn.LogicallyPartitioned):
                views.append(matrix_view(path=jax.tree_util.keystr(path), names=tuple(leaf.names),
                                         shape=tuple(np.shape(leaf.value)), rules=rules,
                                         min_dim_size_to_factor=min_dim_size_to_factor))
            else:
                views.append(MatrixView())
        return tuple(views)

    def apply_views(tree, views):
        """The leaves (boxes unboxed where viewed: a view's rank differs from the box's names) seen as `views`."""
        leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_box)
        if len(leaves) != len(views):
            raise ValueError(f"the optimizer state has views of {len(views)} parameters, got {len(leaves)}")
        viewed = [leaf if view.shape is None else view.to_view(leaf.value if _is_box(leaf) else leaf)
                  for leaf, view in zip(leaves, views)]
        return jax.tree_util.tree_unflatten(treedef, viewed)

    def init(params):
        views = views_of(params)
        return ViewedState(inner=inner.init(apply_views(params, views)), views=views)

    def update(updates, state, params=None):
        viewed_params = None if params is None else apply_views(params, state.views)
        viewed, inner_state = inner.update(apply_views(updates, state.views), state.inner, viewed_params)
        leaves, treedef = jax.tree_util.tree_flatten(updates)
        out = [view.from_view(u, like_shape=np.shape(leaf)) for u, leaf, view
               in zip(jax.tree_util.tree_leaves(viewed), leaves, state.views)]
        return jax.tree_util.tree_unflatten(treedef, out), ViewedState(inner=inner_state, views=state.views)

    return optax.GradientTransformation(init, update)


@dataclasses.dataclass(frozen=True)
class LayerSplit:
    """How `per_layer` sees one parameter: whole (`axis` None), or split along its 'batch' axis into `size` leaves."""
    axis: Optional[int] = None
    size: int = 0


@flax.struct.dataclass
class PerLayerState:
    inner: Any
    splits: Any = flax.struct.field(pytree_node=False)  # a tuple of LayerSplit per parameter leaf (static)


def per_layer(inner: optax.GradientTransformation, *, rules: Mapping[str, str]) -> optax.GradientTransformation:
    """`inner` with every layer of a scanned stack as a parameter of its own, as the unscanned network has them.

    A parameter whose logical axes include one the `rules` call 'batch' (a scanned stack's 'layers') is split along
    it into one leaf per layer before `inner` sees it and its updates are stacked back: Adafactor's per-block
    update clipping and parameter scale, and the weight-decay mask (`ndim >= 2`), then act per layer, so a scanned
    run's updates are the unscanned run's. The names are read from the boxed parameters `init` gets and kept in the
    state's static structure (as `factor_by_logical_axes`); leaves without names are left whole.
    """
    def split_of(path, leaf) -> LayerSplit:
        if not isinstance(leaf, nn.LogicallyPartitioned):
            return LayerSplit()
        batch = [i for i, name in enumerate(leaf.names) if name is not None and rules.get(name) == "batch"]
        if len(batch) > 1:
            raise ValueError(f"{jax.tree_util.keystr(path)}: more than one batch axis in {tuple(leaf.names)}")
        return LayerSplit(axis=batch[0], size=int(np.shape(leaf.value)[batch[0]])) if batch else LayerSplit()

    def split(tree, splits):
        leaves, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_box)
        out = []
        for leaf, how in zip(leaves, splits):
            if how.axis is None:
                out.append(leaf)
            elif _is_box(leaf):
                names = tuple(n for i, n in enumerate(leaf.names) if i != how.axis)
                out.append(tuple(dataclasses.replace(leaf, value=jnp.take(leaf.value, i, axis=how.axis), names=names)
                                 for i in range(how.size)))
            else:
                out.append(tuple(jnp.take(leaf, i, axis=how.axis) for i in range(how.size)))
        return jax.tree_util.tree_unflatten(treedef, out)

    def init(params):
        leaves = jax.tree_util.tree_leaves_with_path(params, is_leaf=_is_box)
        splits = tuple(split_of(path, leaf) for path, leaf in leaves)
        return PerLayerState(inner=inner.init(split(params, splits)), splits=splits)

    def update(updates, state, params=None):
        treedef = jax.tree_util.tree_structure(updates)
        split_params = None if params is None else split(params, state.splits)
        new, inner_state = inner.update(split(updates, state.splits), state.inner, split_params)
        # jaxlib ships no stub of its PyTreeDef, whose methods mypy then cannot see: hence the ignore.
        parts = treedef.flatten_up_to(new)  # type: ignore[attr-defined]
        merged = [part if how.axis is None else jnp.stack(part, axis=how.axis)
                  for part, how in zip(parts, state.splits)]
        return jax.tree_util.tree_unflatten(treedef, merged), PerLayerState(inner=inner_state, splits=state.splits)

    return optax.GradientTransformation(init, update)


def make_optimizer(
    *,
    name: str = "adafactor",
    learning_rate: optax.Schedule | float,
    weight_decay: float = 0.0,
    clip_norm: float | None = None,
    # Adafactor (Shazeer & Stern 2018), defaults of t5x's `adafactor.Adafactor` and optax.
    decay_rate: float = 0.8,
    clipping_threshold: float | None = 1.0,
    multiply_by_parameter_scale: bool = True,
    factored: bool = True,
    min_dim_size_to_factor: int = 128,
    factor_rules: Optional[Mapping[str, str]] = ADAFACTOR_FACTOR_RULES,
    # AdamW.
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay_mask: Callable | None = decay_matrices_only,
    learning_rate_scales: Mapping[str, float] | None = None,
) -> optax.GradientTransformation:
    """The training optimizer, optionally preceded by global-norm gradient clipping.

    'adafactor' is T5's: factored second moments with decay `1 - (step + 1) ** -0.8`, update clipping
    at RMS 1.0, no momentum, and `multiply_by_parameter_scale=True` (t5x's default, which the T5
    paper's constant 1e-3 fine-tuning rate assumes: the step is relative to each parameter block's
    RMS, floored at 1e-3; set False to make `learning_rate` an absolute step size).
    Which dimensions a second moment is factored over comes from the parameters' logical axis names, as t5x's
    `factor_map` (`factor_rules`, see `factor_by_logical_axes`): an attention kernel [embed, heads, kv] is factored
    as the matrix [embed, heads * kv] although its trailing dimension (64) is below `min_dim_size_to_factor`,
    which optax's shape rule would leave unfactored (4.8B extra floats at XXL). Parameters without names (plain
    Flax modules, or `init` called on unboxed arrays) and `factor_rules=None` keep optax's rule.
    `weight_decay` there is t5x's `weight_decay_rate`: `param -= weight_decay * param` every step,
    not scaled by the learning rate.

    'adamw' is decoupled weight decay (Loshchilov & Hutter) as in optax:
    `param -= lr * (adam_update + weight_decay * param)`.

    Weight decay applies where `weight_decay_mask(params)` is True (default: tensors with >= 2 dims).

    `learning_rate_scales` (regex on the '/'-joined parameter path -> factor; the first pattern that fully matches
    wins) multiplies those parameters' updates, i.e. their learning rate: e.g. `{'tower/.*': 0.02}` fine-tunes a
    pretrained tower at 1/50 of the rate of the layers trained from scratch beside it (GDR's MiniLM query encoder).
    """
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0 or None, got {clip_norm}")
    if name == "adafactor":
        # optax.adafactor's chain, with its first stage (the factored second moments) seeing each parameter as the
        # matrix its logical axes make; the later stages are per block or per element, so they see the parameters.
        second_moments = optax.scale_by_factored_rms(factored=factored, decay_rate=decay_rate,
                                                     min_dim_size_to_factor=min_dim_size_to_factor)
        if factor_rules is not None:
            second_moments = factor_by_logical_axes(second_moments, rules=factor_rules,
                                                    min_dim_size_to_factor=min_dim_size_to_factor)
        stages = [second_moments]
        if clipping_threshold is not None:
            stages.append(optax.clip_by_block_rms(clipping_threshold))
        stages.append(optax.scale_by_learning_rate(learning_rate, flip_sign=False))
        if multiply_by_parameter_scale:
            stages.append(scale_by_param_rms())
        if weight_decay:
            stages.append(optax.add_decayed_weights(weight_decay, mask=weight_decay_mask))
        optimizer = optax.chain(*stages, optax.scale(-1.0))
    else:
        optimizer = optax.adamw(
            learning_rate=learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=weight_decay_mask
        )
    if factor_rules is not None:
        optimizer = per_layer(optimizer, rules=factor_rules)
    if learning_rate_scales:
        optimizer = optax.chain(optimizer, scale_by_path(learning_rate_scales))
    if clip_norm is None:
        return optimizer
    return optax.chain(optax.clip_by_global_norm(clip_norm), optimizer)


class _NoState(NamedTuple):
    pass


def scale_by_param_rms(min_scale: float = 1e-3) -> optax.GradientTransformation:
    """`optax.scale_by_param_block_rms` in one pass over each parameter: updates times `max(rms(param), min_scale)`.

    optax's version (`numerics.safe_root_mean_squares`) reads every parameter twice to keep the RMS differentiable
    at 0, which an update never needs; t5x's Adafactor reads it once. Same values; 0.11 GB less memory traffic per
    step of the 9.64M-parameter model of docs/performance.md."""
    def update(updates, state, params=None):
        if params is None:
            raise ValueError("scale_by_param_rms needs the parameters")
        return jax.tree.map(lambda u, p: u * jnp.maximum(jnp.sqrt(jnp.mean(jnp.square(p))), min_scale).astype(u.dtype),
                            updates, params), state

    return optax.GradientTransformation(optax.init_empty_state, update)


def freeze(optimizer: optax.GradientTransformation, pattern: str) -> optax.GradientTransformation:
    """`optimizer` for the parameters whose '/'-joined path `pattern` does not fully match; those it does match get
    no update, no weight decay and no optimizer state (`optax.multi_transform` to `set_to_zero`): LoRA's frozen
    base holds no state. A pattern that matches no parameter, or every parameter, is an error (`Trainer(frozen=)`
    builds this and also skips their gradients)."""
    return optax.multi_transform({"trained": optimizer, "frozen": optax.set_to_zero()},
                                 lambda params: jax.tree.map(lambda trained: "trained" if trained else "frozen",
                                                             trained_mask(params, pattern)))


def trained_mask(params: Any, pattern: str) -> Any:
    """bool per parameter (boxed or not): False where `pattern` fully matches its '/'-joined path. A pattern that
    matches none or all of them is an error (a typo would silently train everything, or nothing)."""
    compiled = re.compile(pattern)
    names = jax.tree_util.tree_map_with_path(lambda path, _: path_name(path), params, is_leaf=_is_box)
    leaves = jax.tree.leaves(names)
    frozen_count = sum(1 for name in leaves if compiled.fullmatch(name))
    if not frozen_count:
        raise ValueError(f"frozen parameters {pattern!r} match no parameter (e.g. {leaves[:3]})")
    if frozen_count == len(leaves):
        raise ValueError(f"frozen parameters {pattern!r} match every parameter: nothing would train")
    return jax.tree.map(lambda name: compiled.fullmatch(name) is None, names)


def path_name(path) -> str:
    """A parameter's '/'-joined path (`frozen` and `scale_by_path` match their regexes against it)."""
    return "/".join(str(getattr(key, "key", getattr(key, "name", key))) for key in path)


def scale_by_path(scales: Mapping[str, float]) -> optax.GradientTransformation:
    """Multiplies each update by the factor of the first regex of `scales` that fully matches its '/'-joined
    parameter path (1 where none does). A pattern that matches no parameter is an error (a typo would otherwise
    silently train everything at the full rate)."""
    patterns = [(re.compile(pattern), float(factor)) for pattern, factor in scales.items()]
    for pattern, factor in patterns:
        if factor < 0:
            raise ValueError(f"learning-rate scale of {pattern.pattern!r} must be >= 0, got {factor}")

    def factor_of(path) -> float:
        name = path_name(path)
        return next((factor for pattern, factor in patterns if pattern.fullmatch(name)), 1.0)

    def init(params):
        # A frozen parameter (`freeze`: a MaskedNode here) still counts as matched: a scale for a tower that a run
        # then freezes is moot, not a typo.
        names = [path_name(path) for path, _ in jax.tree_util.tree_leaves_with_path(
            params, is_leaf=lambda leaf: isinstance(leaf, optax.MaskedNode))]
        unused = [p.pattern for p, _ in patterns if not any(p.fullmatch(name) for name in names)]
        if unused:
            raise ValueError(f"learning_rate_scales patterns {unused} match no parameter (e.g. {names[:3]})")
        return _NoState()

    def update(updates, state, params=None):
        del params
        return jax.tree_util.tree_map_with_path(lambda path, u: u * factor_of(path), updates), state

    return optax.GradientTransformation(init, update)
