"""tools/ranking_study: the variants' commands, resumption from finished runs, the table baselines on the WordNet
hypernym fixture, and the report."""
import json
import pathlib
import shlex

import pytest

from gr_jax.tools import ranking_study, wordnet_hypernyms


@pytest.fixture
def hypernyms(wordnet_dir, tmp_path):
    out = tmp_path / "hyp"
    wordnet_hypernyms.main(["--wordnet_dir", str(wordnet_dir), "--out_dir", str(out), "--root", "food.n.02",
                            "--dev_fraction", "0.5", "--seed", "1", "--in_context"])
    return out


class FakeRunner:
    """Records commands; a training run writes final metrics, a ranking evaluation its JSON."""

    def __init__(self):
        self.commands = []

    def __call__(self, argv, log, timeout):
        self.commands.append(list(argv))
        bindings = dict(a.split("=", 1)[1].split(" = ", 1) for a in argv if a.startswith("--gin_bindings="))
        if "gr_jax.train" in argv:
            model_dir = pathlib.Path(shlex.split(bindings["MODEL_DIR"])[0])
            model_dir.mkdir(parents=True)
            (model_dir / "config.gin").write_text("")
            (model_dir / "final_metrics.json").write_text(json.dumps({"eval/nDCG@10": 0.5, "eval/MRR@10": 0.25}))
        else:
            model_dir = pathlib.Path(argv[3].split("=", 1)[1]).parent
            split = shlex.split(bindings["RANKING_SPLIT"])[0]
            metrics = {"cvr": 0.1, "ndcg": 0.9, **{f"R@{k}": 0.8 for k in range(1, 6)}}
            (model_dir / f"ranking.{split}.7.json").write_text(json.dumps(metrics))
        return 0


def test_variants_run_once_and_baselines_score_the_same_candidates(hypernyms, tmp_path):
    out = tmp_path / "study"
    runner = FakeRunner()
    argv = ["--data_dir", str(hypernyms), "--out_dir", str(out), "--variants", "ntp,combined2", "--steps", "7",
            "--size", "p100k", "--baseline_dims", "4", "--baseline_steps", "20", "--gin.BATCH_SIZE=8"]
    results = ranking_study.main(argv, runner=runner)
    train = [c for c in runner.commands if "gr_jax.train" in c]
    assert len(train) == 2 and len(runner.commands) == 6  # 2 runs, each evaluated on dev and train
    combined = train[1]
    assert "--gin_file=ranking/combined.gin" in combined and "--gin_file=models/t5_1_1/p100k.gin" in combined
    assert combined.index("--gin_file=ranking/ranked_lists.gin") < combined.index("--gin_file=ranking/combined.gin")
    assert "--gin_bindings=TRAIN_STEPS = 7" in combined and combined[-1] == "--gin_bindings=BATCH_SIZE = 8"
    assert [v["ranking"]["dev"]["ndcg"] for v in results["variants"]] == [0.9, 0.9]
    # Two baselines (DE, CE) x two item weightings at n = 4, on both splits, with metrics in range.
    assert {(b["baseline"], b["weights"]) for b in results["baselines"]} == {
        ("DE", "ntp"), ("CE", "ntp"), ("DE", "frac2"), ("CE", "frac2")}
    for b in results["baselines"]:
        for split in ("dev", "train"):
            assert 0 <= b["ranking"][split]["cvr"] <= 1 and 0 < b["ranking"][split]["ndcg"] <= 1
    table = (out / "ranking_study.md").read_text()
    assert "| NTP (top-1) | 10.0 | 90.0 | 80.0 |" in table and "| 50.0 | 25.0 |" in table
    assert (out / "recall_by_k.dev.png").stat().st_size > 0
    # Again: nothing is trained or evaluated twice, and the baselines come from their cache.
    again = FakeRunner()
    ranking_study.main(argv, runner=again)
    assert again.commands == []


def test_the_decoder_only_family_trains_each_variant_at_its_matched_size(tmp_path):
    study = ranking_study.RankingStudy(data_dir="d", out_dir=tmp_path, variants=["trie2"], size="p2m", steps=8,
                                       input_length=160, target_length=24, family="decoder_only")
    command = study.train_command("trie2")
    files = [a.split("=", 1)[1] for a in command if a.startswith("--gin_file=")]
    assert files == ["experiments/study_cpu.gin", "ranking/ranked_lists.gin", "ranking/trie.gin",
                     "decoder_only/experiment.gin", "decoder_only/p2m.gin"]


def test_unknown_variants_are_refused(hypernyms, tmp_path):
    with pytest.raises(SystemExit):
        ranking_study.main(["--data_dir", str(hypernyms), "--out_dir", str(tmp_path), "--variants", "ntp,bogus"])
