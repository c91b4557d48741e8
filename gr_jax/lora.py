"""LoRA (Hu et al. 2022): low-rank adapters beside a network's projection kernels, the base kernels frozen.

Why: the scaling-law paper trains LLaMA-2 7B-70B generative retrievers with LoRA; full fine-tuning holds optimizer
state for every parameter. A kernel W [in..., out...] (the leading `in_axes` axes contracted with the input) gains
A [in..., rank] and B [rank, out...]; the layer computes x.W + (alpha / rank) (x.A).B, factored, so training never
forms the [in, out] update and the weight gradient reaches only A and B. B starts at zero: an adapted network
starts as its base. `merge` folds the adapters into the kernels for inference.

The adapters are parameters named `{kernel}_lora_a` / `{kernel}_lora_b` beside their kernel, with the logical axes
of the kernel's input or output side and `LORA_RANK` (replicated). `LoraConfig.frozen_pattern` is the regex of
every other parameter, for the trainer (`Trainer(frozen=)`: no gradient, no update and no optimizer state reach
them).
"""
from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any, Optional, cast

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array

LORA_RANK = "lora_rank"  # the logical axis of an adapter's rank (replicated: rank is small)
_ADAPTER = re.compile(r"(.+)_lora_([ab])")

# The kernels both networks name alike: attention's query/key/value/out and the gated MLP's wi_0/wi_1/wo.
ATTENTION_AND_MLP = ("query", "key", "value", "out", "wi_0", "wi_1", "wo")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """rank r and alpha (the update is scaled by alpha / r, as in the paper and PEFT); `targets`: the kernel names
    that get adapters (a subset of `ATTENTION_AND_MLP`); `also_trained`: regexes of '/'-joined parameter paths
    trained in full beside the adapters, as PEFT's `modules_to_save` (a run whose docid tokens are new rows of a
    pretrained vocabulary trains `token_embedder` and `output`, or the new rows could never be learned)."""
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = ATTENTION_AND_MLP
    also_trained: tuple[str, ...] = ()

    def __post_init__(self):
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {self.rank}")
        object.__setattr__(self, "targets", tuple(self.targets))  # gin gives lists; configs hash
        object.__setattr__(self, "also_trained", tuple(self.also_trained))
        unknown = sorted(set(self.targets) - set(ATTENTION_AND_MLP))
        if unknown or not self.targets:
            raise ValueError(f"LoRA targets {list(self.targets)}: each must be one of {list(ATTENTION_AND_MLP)}")
        for pattern in self.also_trained:
            re.compile(pattern)

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def frozen_pattern(self) -> str:
        """Regex fully matching the '/'-joined path of every parameter that is neither an adapter nor
        `also_trained`."""
        trained = "|".join([r"(?:.*/)?[^/]+_lora_[ab]", *(f"(?:{pattern})" for pattern in self.also_trained)])
        return f"(?!(?:{trained})$).*"


Adapter = Optional[tuple[Array, Array]]


def adapter(module: nn.Module, name: str, *, lora: Optional[LoraConfig], shape: Sequence[int],
            axes: Sequence[str], in_axes: int, dtype: Any) -> Adapter:
    """The adapter (A, B) of `module`'s kernel `name` [shape] (logical `axes`, the first `in_axes` contracted with
    the input), or None when `lora` is None or does not target `name`. A is drawn as PEFT draws it (Kaiming-uniform
    over the input side), B is zero."""
    if lora is None or name not in lora.targets:
        return None
    shape, axes = tuple(shape), tuple(axes)
    a_init = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform", in_axis=tuple(range(in_axes)),
                                              out_axis=in_axes)
    a = module.param(f"{name}_lora_a", nn.with_logical_partitioning(a_init, axes[:in_axes] + (LORA_RANK,)),
                     shape[:in_axes] + (lora.rank,), dtype)
    b_init = nn.with_logical_partitioning(nn.initializers.zeros, (LORA_RANK,) + axes[in_axes:])
    b = module.param(f"{name}_lora_b", b_init, (lora.rank,) + shape[in_axes:], dtype)
    # `param` unboxes (unbox=True): it returns the arrays, which flax types as the init's LogicallyPartitioned box.
    return cast(Array, a), cast(Array, b)


def delta(x: Array, adapter: Adapter, *, lora: Optional[LoraConfig], in_axes: int, dtype: Any) -> Optional[Array]:
    """(alpha / r) (x.A).B [..., out...] for x [..., in...], or None without an adapter."""
    if adapter is None or lora is None:
        return None
    a, b = adapter
    low = jnp.tensordot(x.astype(dtype), a.astype(dtype), axes=in_axes)
    return (jnp.tensordot(low, b.astype(dtype), axes=1) * lora.scale).astype(dtype)


def add(y: Array, update: Optional[Array]) -> Array:
    return y if update is None else y + update


def merge(params: Mapping[str, Any], *, lora: LoraConfig) -> dict[str, Any]:
    """The base network's parameters with every adapter folded into its kernel, W + (alpha / r) A.B, in the
    kernel's dtype (a scanned stack's kernels [layers, in..., out...] merge layer by layer)."""
    merged: dict[str, Any] = {}
    for name, value in params.items():
        if _ADAPTER.fullmatch(name):
            continue
        if isinstance(value, Mapping):
            merged[name] = merge(value, lora=lora)
        elif f"{name}_lora_a" in params:
            a, b = (params[f"{name}_lora_{x}"].astype(jnp.float32) for x in "ab")
            product = functools.partial(jnp.tensordot, axes=1)  # A [in..., r] . B [r, out...]
            stacked = a.ndim + b.ndim - 2 > value.ndim  # a scanned stack's leading layers axis
            update = jax.vmap(product)(a, b) if stacked else product(a, b)
            merged[name] = (value.astype(jnp.float32) + lora.scale * update).astype(value.dtype)
        else:
            merged[name] = value
    return merged
