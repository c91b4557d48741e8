"""The training loop's periodic actions, each on its own (fake checkpointer, writer and retriever), and the flat loop
with an action plugged in from outside."""
import dataclasses
import json
import math
import types

import numpy as np
import pytest

from gr_jax import actions
from gr_jax.evaluator import RetrievalEvaluator
from gr_jax.metrics import Average, LastValue
from gr_jax.retrievers import Ranking


class FakeCheckpointer:
    """Records saves as orbax's manager would keep them: never twice for one step."""

    def __init__(self):
        self.saved: dict[int, dict] = {}
        self.directory = "/fake/checkpoints"

    def save(self, step, *, state, input_state, input_iterator=None, force=False):
        if step in self.saved:
            return False
        self.saved[step] = {"state": state, "input_state": input_state, "force": force,
                            "input_iterator": input_iterator}
        return True

    def latest_step(self):
        return max(self.saved, default=None)

    def wait_until_finished(self):
        pass


class FakeWriter:
    def __init__(self):
        self.scalars: dict[int, dict] = {}

    def write_scalars(self, step, scalars):
        self.scalars.setdefault(step, {}).update(scalars)

    def flush(self):
        pass


class ScoreTableRetriever:
    """Ranks by a fixed score per (params, query, docid): params is a dict docid -> score shared by all queries."""

    def __init__(self, params=None):
        self.params = params

    def with_params(self, params):
        return ScoreTableRetriever(params)

    def rank(self, queries, *, k):
        order = sorted(self.params, key=lambda docid: -self.params[docid])[:k]
        return Ranking(ids=[list(order) for _ in queries], scores=[[self.params[d] for d in order] for _ in queries],
                       seconds=1.0)


def _run(tmp_path, *, start_step=0, start_batch=0):
    built = types.SimpleNamespace(checkpointer=FakeCheckpointer(),
                                  trainer=types.SimpleNamespace(abstract_state=types.SimpleNamespace(params=None)),
                                  checkpoint_state=lambda state: state,  # nothing frozen
                                  read_params=lambda checkpointer, step: checkpointer.restore_params(
                                      step, abstract_params=None),
                                  experiment=types.SimpleNamespace(model_dir=str(tmp_path), seed=7, batch_size=4),
                                  input_fingerprint=lambda: {"vocabulary": "ab12"})
    return actions.TrainingRun(built=built, writer=FakeWriter(), start_step=start_step, start_batch=start_batch)


def _progress(step, *, summary=None, last=False, params=None):
    return actions.TrainingProgress(step=step, state=types.SimpleNamespace(params=params), summary=summary or {},
                                    last=last)


def test_stop_on_non_finite_loss_raises_naming_the_last_good_checkpoint(tmp_path):
    run = _run(tmp_path)
    with pytest.raises(actions.NonFiniteLossError, match=r"^non-finite training metrics at step 2: loss=nan\. "
                                                         r"Training stopped; no checkpoint was saved before it\.$"):
        actions.StopOnNonFiniteLoss()(run, _progress(2, summary={"loss": math.nan, "grad_norm": 1.0}))
    run.built.checkpointer.save(4, state=None, input_state={})
    guard = actions.StopOnNonFiniteLoss()
    assert guard.every_steps is None and guard.due(3, last=False)  # at every report
    assert guard(run, _progress(5, summary={"loss": 2.0, "grad_norm": 1.0})) is False
    for bad in (math.nan, math.inf):
        with pytest.raises(actions.NonFiniteLossError,
                           match=rf"step 6: grad_norm={bad}\..*last good checkpoint \(step 4\)"):
            guard(run, _progress(6, summary={"loss": 1.0, "grad_norm": bad}))


def test_write_train_metrics_writes_every_report_and_keeps_the_last(tmp_path):
    run, writer = _run(tmp_path), actions.WriteTrainMetrics()
    writer(run, _progress(2, summary={"loss": 3.0}))
    writer(run, _progress(4, summary={"loss": 2.5, "token_accuracy": 0.25}))
    writer(run, _progress(5, summary={}))  # nothing accumulated since the last report: nothing written
    assert run.writer.scalars == {2: {"train/loss": 3.0}, 4: {"train/loss": 2.5, "train/token_accuracy": 0.25}}
    assert writer.report() == {"train/loss": 2.5, "train/token_accuracy": 0.25}


def test_save_checkpoint_every_n_steps_at_the_last_and_where_training_stopped(tmp_path):
    run = _run(tmp_path, start_step=10, start_batch=30)  # resumed: batches_consumed counts from the input position
    save = actions.SaveCheckpoint(every_steps=4)
    assert [step for step in range(11, 20) if save.due(step, last=step == 19)] == [12, 16, 19]
    for step in (12, 16):
        assert save(run, _progress(step)) is False
    save.end(run, _progress(17))  # stopped early at step 17: saved there, forced
    save.end(run, _progress(17))  # never twice
    saved = run.built.checkpointer.saved
    assert sorted(saved) == [12, 16, 17] and saved[17]["force"] and not saved[12]["force"]
    assert [saved[s]["input_state"] for s in (12, 16, 17)] == [
        {"batches_consumed": b, "seed": 7, "batch_size": 4, "num_processes": 1, "inputs": {"vocabulary": "ab12"}}
        for b in (32, 36, 37)]
    assert all(saved[s]["input_iterator"] is None for s in saved)  # a plain iterator has no state to save
    with pytest.raises(ValueError, match="every_steps must be >= 1"):
        actions.SaveCheckpoint(every_steps=0)


class CountingBatches:
    """A checkpointable input (`checkpoints.CheckpointableInput`) that only counts."""

    def __init__(self, start):
        self.batches_consumed = start

    def __next__(self):
        self.batches_consumed += 1
        return self.batches_consumed

    def save_input_state(self, directory):
        raise AssertionError("the fake checkpointer never calls it")

    def restore_input_state(self, directory):
        raise AssertionError("the fake checkpointer never calls it")


def test_save_checkpoint_hands_a_checkpointable_input_over_at_the_step_position(tmp_path):
    run = dataclasses.replace(_run(tmp_path, start_step=10, start_batch=30), batches=CountingBatches(30))
    save = actions.SaveCheckpoint(every_steps=2)
    for _ in range(2):
        next(run.batches)
    save(run, _progress(12))
    saved = run.built.checkpointer.saved[12]
    assert saved["input_iterator"] is run.batches and saved["input_state"]["batches_consumed"] == 32
    for _ in range(3):  # one batch more than the two steps since: that state would resume one batch late
        next(run.batches)
    with pytest.raises(RuntimeError, match="consumed 35 batches at step 14, expected 34"):
        save(run, _progress(14))


QUERIES = [("q1", "a"), ("q2", "b")]
QRELS = {"q1": {"d2": 1}, "q2": {"d3": 1}}


def test_evaluate_retrieval_periodically_and_at_the_end_with_the_reported_params(tmp_path):
    run = _run(tmp_path)
    chosen = {}  # the state the final evaluation reports, once an action chose one (model selection)
    evaluate = actions.EvaluateRetrieval(retriever=ScoreTableRetriever(),
                                         evaluator=RetrievalEvaluator(queries=QUERIES, qrels=QRELS, k=3),
                                         split="dev", every_steps=5, reported=lambda run: chosen.get("state"))
    assert [s for s in range(1, 16) if evaluate.due(s, last=s == 15)] == [5, 10]  # the last step is `end`'s
    evaluate(run, _progress(5, params={"d1": 3.0, "d2": 2.0, "d3": 1.0}))
    assert evaluate.report()["eval/MRR@10"] == pytest.approx((1 / 2 + 1 / 3) / 2)
    assert run.writer.scalars[5]["eval/MRR@10"] == evaluate.report()["eval/MRR@10"]
    assert (tmp_path / "run.dev.5.trec").read_text().splitlines()[0] == "q1 Q0 d1 1 3.0 gr_jax-5"
    chosen["state"] = (8, {"d2": 1.0, "d3": 0.5})  # e.g. model selection's best state
    evaluate.end(run, _progress(15, params={"d1": 3.0, "d2": 2.0, "d3": 1.0}))
    assert evaluate.report()["eval/MRR@10"] == pytest.approx((1 + 1 / 2) / 2) and (tmp_path / "run.dev.8.trec").exists()
    assert not actions.EvaluateRetrieval(retriever=None, evaluator=None, split="dev", every_steps=0).due(
        5, last=False)


def test_select_model_keeps_the_best_stops_on_patience_and_resumes_stopped(tmp_path, monkeypatch):
    best_saves = []

    class BestCheckpointer(FakeCheckpointer):
        def save(self, step, **kwargs):
            best_saves.append(step)
            return super().save(step, **kwargs)

        def restore_params(self, step, *, abstract_params):
            return self.saved[step]["state"].params

    monkeypatch.setattr(actions.checkpoints, "Checkpointer", lambda *args, **kwargs: BestCheckpointer())
    run = _run(tmp_path)

    def select():
        return actions.SelectModel(retriever=ScoreTableRetriever(),
                                   evaluator=RetrievalEvaluator(queries=QUERIES, qrels=QRELS, k=3), split="valid",
                                   metric="MRR@10", every_steps=2, patience=2)

    action = select()
    assert action.start(run) is False
    good, worse = {"d2": 2.0, "d3": 1.0, "d1": 0.0}, {"d1": 3.0, "d2": 2.0, "d3": 1.0}
    assert action(run, _progress(2, params=worse)) is False
    assert action(run, _progress(4, params=good)) is False  # a new best: kept
    assert action(run, _progress(6, params=worse)) is False
    assert action(run, _progress(8, params=worse)) is True  # two evaluations without improvement: stop
    assert best_saves == [2, 4]
    saved = json.loads((tmp_path / "selection.json").read_text())
    assert (saved["best_step"], saved["stopped"], [s for s, _ in saved["history"]]) == (4, True, [2, 4, 6, 8])
    action.end(run, _progress(8, params=worse))
    assert action.best_state(run) == (4, good)
    assert action.report()["select/best_step"] == 4 and action.report()["select/stopped_at"] == 8
    # A run resumed from its step-8 checkpoint has nothing left to train.
    assert select().start(_run(tmp_path, start_step=8)) is True
    with pytest.raises(ValueError, match="needs periodic evaluation"):
        actions.SelectModel(retriever=None, evaluator=None, split="valid", metric="MRR@10", every_steps=0)


@pytest.mark.parametrize("order", ["select_first", "final_first"])
def test_the_final_evaluation_ranks_with_the_selected_state_whatever_the_actions_order(tmp_path, monkeypatch, order):
    """Actions share nothing mutable: the final evaluation asks model selection for its best state, so the list
    [select, final] and [final, select] end alike; each reports what it found."""

    class BestCheckpointer(FakeCheckpointer):
        def restore_params(self, step, *, abstract_params):
            return self.saved[step]["state"].params

    monkeypatch.setattr(actions.checkpoints, "Checkpointer", lambda *args, **kwargs: BestCheckpointer())
    run = _run(tmp_path)
    evaluator = RetrievalEvaluator(queries=QUERIES, qrels=QRELS, k=3)
    select = actions.SelectModel(retriever=ScoreTableRetriever(), evaluator=evaluator, split="valid",
                                 metric="MRR@10", every_steps=2)
    final = actions.EvaluateRetrieval(retriever=ScoreTableRetriever(), evaluator=evaluator, split="dev",
                                      reported=select.best_state)
    listed = [select, final] if order == "select_first" else [final, select]
    good, worse = {"d2": 2.0, "d3": 1.0, "d1": 0.0}, {"d1": 3.0, "d2": 2.0, "d3": 1.0}
    for action in listed:
        action.start(run)
    select(run, _progress(2, params=good))
    select(run, _progress(4, params=worse))
    for action in listed:
        action.end(run, _progress(4, params=worse))
    assert final.report()["eval/MRR@10"] == pytest.approx((1 + 1 / 2) / 2)  # the step-2 state's ranking
    assert (tmp_path / "run.dev.2.trec").exists() and not (tmp_path / "run.dev.4.trec").exists()
    assert select.report() == {"select/best_step": 2, "select/best_MRR@10": pytest.approx(0.75),
                               "select/stopped_at": 4}


class StopAt(actions.Action):
    """A plugged-in action: records the steps it saw and stops training at `step`."""

    def __init__(self, *, every_steps, step):
        self.every_steps, self.step, self.seen, self.ended = every_steps, step, [], None

    def __call__(self, run, progress):
        self.seen.append((progress.step, sorted(progress.summary)))
        return progress.step >= self.step

    def end(self, run, progress):
        self.ended = progress.step


def test_the_loop_reports_to_actions_and_stops_when_one_says_so(tmp_path):
    """The flat loop with a fake trainer: reports where an action is due or every `report_every_steps`, stops after
    the step an action asks it to, and ends every action once."""
    steps = []

    class FakeTrainer:
        def train_step(self, state, batch, rng):
            steps.append(batch)
            return state, {"loss": Average(total=2.0, count=4.0), "z_loss": Average(total=0.0, count=4.0),
                           "token_accuracy": Average(total=1.0, count=4.0),
                           "sequence_accuracy": Average(total=1.0, count=2.0), "learning_rate": LastValue(value=0.1),
                           "grad_norm": LastValue(value=1.0)}

    from gr_jax import training
    experiment = types.SimpleNamespace(batch_size=4, seed=0)
    run = _run(tmp_path, start_step=2, start_batch=2)
    experiment.model_dir = run.built.experiment.model_dir
    run.built.experiment, run.built.trainer = experiment, FakeTrainer()
    run.built.train_batches = lambda *, start_batch: iter(range(start_batch, 10**6))  # batch i is the number i
    run.built.tokens_per_batch = 20
    plugged = StopAt(every_steps=3, step=9)
    writer = actions.WriteTrainMetrics()
    _, report = training.training_loop(run=run, state=np.zeros(()), num_train_steps=20, report_every_steps=5,
                                       actions=[writer, plugged], progress=False)
    assert steps == list(range(2, 9))  # resumed at batch 2, stopped after step 9
    assert [step for step, _ in plugged.seen] == [3, 6, 9] and plugged.ended == 9
    assert sorted(run.writer.scalars) == [3, 5, 6, 9]  # reports: the plugged action's steps and every 5th
    assert run.writer.scalars[5]["train/loss"] == pytest.approx(0.5)  # summed loss / summed weight
    assert report["train/steps_per_second"] > 0


def test_the_progress_bar_counts_computed_steps(tmp_path, monkeypatch):
    """The bar showed 30/30 while the devices still computed: each update now follows the wait for a step's result
    (the step's own, or a report's fetch of all pending ones), with one step left in flight, and it ends at the
    steps run."""
    from gr_jax import training
    events = []

    class FakeTrainer:
        def train_step(self, state, batch, rng):
            events.append(("dispatched", batch))
            return state, {"loss": Average(total=batch, count=1.0), "learning_rate": LastValue(value=0.1),
                           "grad_norm": LastValue(value=1.0)}

    class Bar:
        def __init__(self, *, initial, **kwargs):
            self.n = initial

        def update(self, n):
            self.n += n
            events.append(("shown", self.n))

        def set_postfix(self, **kwargs):
            pass

        def close(self):
            pass

    monkeypatch.setattr(training.tqdm, "tqdm", Bar)
    monkeypatch.setattr(training.jax, "block_until_ready",
                        lambda metrics: events.append(("computed", int(metrics["loss"].total))) or metrics)
    fetch = training.summarize_steps
    monkeypatch.setattr(training, "summarize_steps", lambda pending, **kwargs: events.append(
        ("reported", [int(m["loss"].total) for m in pending])) or fetch(pending, **kwargs))
    run = _run(tmp_path)
    run.built.experiment, run.built.trainer = types.SimpleNamespace(batch_size=4, seed=0), FakeTrainer()
    run.built.experiment.model_dir = str(tmp_path)
    run.built.train_batches = lambda *, start_batch: iter(range(1, 10**6))  # step i trains on batch i
    run.built.tokens_per_batch = 20
    training.training_loop(run=run, state=np.zeros(()), num_train_steps=5, report_every_steps=3, actions=[],
                           progress=True)
    assert events == [("dispatched", 1), ("dispatched", 2), ("computed", 1), ("shown", 1),
                      ("dispatched", 3), ("computed", 2), ("shown", 2), ("reported", [1, 2, 3]), ("shown", 3),
                      ("dispatched", 4), ("dispatched", 5), ("computed", 4), ("shown", 4), ("reported", [4, 5]),
                      ("shown", 5)]
