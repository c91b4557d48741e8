"""A dense run's query tower as a tower (gr_jax/dense/run_tower.py): its weights are the run's, read at the given
or the kept step, and a run without them is a clear error."""
import json

import jax
import numpy as np
import pytest

from gr_jax import checkpoints
from gr_jax import network
from gr_jax.dense.run_tower import DenseRunTower
from gr_jax.dense.towers import T5EncoderTower
from gr_jax.partitioning import strip_boxes
from gr_jax.run_dir import RunDir


def _tower() -> T5EncoderTower:
    return T5EncoderTower(config=network.T5Config(vocab_size=64, emb_dim=16, num_heads=2, num_encoder_layers=1,
                                                  num_decoder_layers=1, head_dim=8, mlp_dim=32))


def _abstract(tower):
    ids = np.ones((2, 4), np.int32)
    shapes = jax.eval_shape(lambda: tower.module().init(jax.random.PRNGKey(0), ids, ids > 0,
                                                        method="token_states"))["params"]
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), strip_boxes(shapes))


def _save_dense_run(model_dir, *, steps: dict[int, float], name: str = "tower"):
    """A dense run's checkpoints: at each step, every tower parameter filled with that step's value."""
    tower = _tower()
    checkpointer = checkpoints.Checkpointer(RunDir.of(model_dir).checkpoints, max_to_keep=None, asynchronous=False)
    try:
        for step, value in steps.items():
            params = jax.tree.map(lambda a: np.full(a.shape, value, a.dtype), _abstract(tower))
            checkpointer.save(step, state={"params": {name: params, "document_projection": np.zeros(3)}},
                              input_state={}, force=True)
    finally:
        checkpointer.close()
    return tower


@pytest.mark.parametrize("name", ["tower", "query_tower"])
def test_the_weights_are_the_dense_runs_at_the_kept_or_given_step(tmp_path, name):
    tower = _save_dense_run(tmp_path / "dense", steps={100: 1.5, 200: -2.0}, name=name)
    (tmp_path / "dense" / "selection.json").write_text(json.dumps({"split": "valid", "metric": "MRR@10",
                                                                   "best_step": 100, "best_value": 0.4,
                                                                   "history": [[100, 0.4], [200, 0.3]]}))
    abstract = _abstract(tower)
    kept = DenseRunTower(tower=tower, model_dir=str(tmp_path / "dense")).load_params(abstract=abstract)
    given = DenseRunTower(tower=tower, model_dir=str(tmp_path / "dense"), step=200).load_params(abstract=abstract)
    assert jax.tree.structure(kept) == jax.tree.structure(abstract)
    for leaf in jax.tree.leaves(kept):
        np.testing.assert_array_equal(np.asarray(leaf), 1.5)
    for leaf in jax.tree.leaves(given):
        np.testing.assert_array_equal(np.asarray(leaf), -2.0)
    wrapped = DenseRunTower(tower=tower, model_dir="unused")
    assert wrapped.hidden_size == tower.hidden_size and wrapped.input_vocabulary_dir() is None


def test_a_run_without_the_step_or_a_selection_is_a_clear_error(tmp_path):
    tower = _save_dense_run(tmp_path / "dense", steps={100: 1.0})
    abstract = _abstract(tower)
    with pytest.raises(FileNotFoundError, match="selection.json: no model selection record"):
        DenseRunTower(tower=tower, model_dir=str(tmp_path / "dense")).load_params(abstract=abstract)
    with pytest.raises(FileNotFoundError, match="no checkpoint of step 300"):
        DenseRunTower(tower=tower, model_dir=str(tmp_path / "dense"), step=300).load_params(abstract=abstract)
