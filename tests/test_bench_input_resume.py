"""The input-resume benchmark on the fixture corpus: states saved while driving the pipeline are restored (not
re-read), and the extrapolated re-read times follow from the measured ones."""
import pytest

from gr_jax.tools.bench import input_resume


def test_input_resume_bench_restores_both_states_and_extrapolates_the_reread(spm_data_dir):
    line = input_resume.run(data_dir=str(spm_data_dir), name="bench_resume", row="firstp_labeled", scheme="naive",
                            batch_size=4, input_length=16, target_length=12, far=40, near=10, skip=20, repeats=1)
    assert line["mixture"] == "bench_resume.firstp_labeled.naive"
    assert line["resume_far_over_near"] == pytest.approx(line["resume_far_s"] / line["resume_near_s"])
    assert line["state_bytes_near"] > 0 and line["state_bytes_far"] > 0
    for prefix in ("old_skip", "reread"):
        per_batch = (line[f"{prefix}_s"] - line[f"{prefix}_0_s"]) / 20
        assert line[f"{prefix}_far_extrapolated_s"] == pytest.approx(line[f"{prefix}_0_s"] + 40 * per_batch)
    with pytest.raises(SystemExit, match="0 < --near"):
        input_resume.run(data_dir=str(spm_data_dir), name="bench_resume", row="firstp_labeled", scheme="naive",
                         batch_size=4, input_length=16, target_length=12, far=10, near=10, skip=20, repeats=1)
