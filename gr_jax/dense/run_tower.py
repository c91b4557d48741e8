"""A dense run's trained query tower as a tower: the same network and tokenizer, its weights read from the run.

The generative models take a pretrained tower as their encoder (`gr_jax.tower_encoder`) and GDR as its query
encoder. Starting them from a fine-tuned dense run rather than the zero-shot weights hands them what that run learnt
about the queries (docs/quality.md): gin `ENCODER_TOWER = @run_tower.DenseRunTower()` with
`run_tower.DenseRunTower.tower = @towers.MiniLMTower()` and `.model_dir = 'DENSE_RUN'`
(gin_configs/encoders/dense_run.gin).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Optional

import flax.linen as nn
from flax import traverse_util

from gr_jax import checkpoints
from gr_jax.dense.towers import Tokenizer, Tower
from gr_jax.run_dir import RunDir


def kept_step(model_dir: str) -> int:
    """The step model selection kept in the run `model_dir` (its selection.json)."""
    path = RunDir.of(model_dir).selection
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no model selection record, so no kept step; give the step explicitly")
    step = json.loads(path.read_text()).get("best_step")
    if step is None:
        raise ValueError(f"{path}: model selection kept no step yet")
    return step


def tower_params_from_run(*, model_dir: str, step: int, abstract: Any) -> Any:
    """The query tower of the dense run `model_dir` at `step` (its `checkpoints/` or `best/`), shaped and placed as
    `abstract` (`jax.ShapeDtypeStruct`s with shardings): the shared tower (`tower`) or, with separate towers,
    `query_tower`."""
    run_dir = RunDir.of(model_dir)
    for directory in (run_dir.checkpoints, run_dir.best):
        if not (directory / str(step)).is_dir():
            continue
        checkpointer = checkpoints.Checkpointer(directory, max_to_keep=None)
        try:
            saved = checkpointer.saved_params(step)
            name = "tower" if any(p.startswith("tower/") for p in saved) else "query_tower"
            wanted = {f"{name}/{path}" for path in traverse_util.flatten_dict(abstract, sep="/")}
            missing = sorted(wanted - set(saved))
            if missing:
                raise ValueError(f"{directory / str(step)}: the dense run's {name} lacks {len(missing)} parameters of "
                                 f"this query tower (e.g. {missing[0]}): another tower?")
            return checkpointer.restore_params(step, abstract_params={name: abstract})[name]
        finally:
            checkpointer.close()
    raise FileNotFoundError(f"no checkpoint of step {step} in {run_dir.checkpoints} or {run_dir.best}: the dense "
                            f"run's query tower is read from there")


@dataclasses.dataclass(frozen=True, kw_only=True)
class DenseRunTower:
    """`tower` (the network the dense run trained: the same spec, e.g. `MiniLMTower()`) with the weights of the
    dense run `model_dir` at `step` (None: the step its model selection kept)."""
    tower: Tower
    model_dir: str
    step: Optional[int] = None

    @property
    def hidden_size(self) -> int:
        return self.tower.hidden_size

    def for_data(self, *, data_dir: str) -> DenseRunTower:
        return dataclasses.replace(self, tower=self.tower.for_data(data_dir=data_dir))

    def module(self) -> nn.Module:
        return self.tower.module()

    def tokenizer(self, *, data_dir: str) -> Tokenizer:
        return self.tower.tokenizer(data_dir=data_dir)

    def input_vocabulary_dir(self) -> Optional[str]:
        return self.tower.input_vocabulary_dir()

    def load_params(self, *, abstract: Any) -> Any:
        step = self.step if self.step is not None else kept_step(self.model_dir)
        return tower_params_from_run(model_dir=self.model_dir, step=step, abstract=abstract)
