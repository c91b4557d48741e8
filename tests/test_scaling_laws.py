"""Scaling-law fits: the paper's published T5 CGL points give its Table 1; planted laws are recovered; plots."""
import numpy as np
import pytest

from gr_jax.scaling.laws import DATA_SIZE, INFERENCE, JOINT, MODEL_SIZE, fit_law, plot_fit, r_squared

# Cai et al. 2025: T5-small..XXL non-embedding parameters and their CGL (the authors' code), Table 1's T5 row.
T5_PARAMETERS = [44_057_088, 198_229_248, 704_769_024, 2_818_699_264, 11_274_422_272]
T5_CGL = [0.003732, 0.003647, 0.003617, 0.003582, 0.003569]


def test_the_papers_t5_points_give_its_table_1():
    fit = fit_law(MODEL_SIZE, T5_PARAMETERS, T5_CGL)
    # Table 1: alpha 0.40, lambda 0.00356, R^2 0.996 (gamma is poorly determined by five points: not compared).
    assert fit.parameters["alpha"] == pytest.approx(0.40, abs=0.03)
    assert fit.parameters["lambda"] == pytest.approx(0.00356, abs=2e-5)
    assert fit.r2 == pytest.approx(0.996, abs=0.001)
    # The fit is at least as good as the published (rounded) parameters on the same points.
    published = MODEL_SIZE(np.array(T5_PARAMETERS, float), [2.26e-2, 0.40, 0.00356])
    assert fit.r2 >= r_squared(T5_CGL, published)


@pytest.mark.parametrize("form,truth", [(MODEL_SIZE, [3e4, 0.6, 0.2]), (DATA_SIZE, [50.0, 0.9, 0.05]),
                                        (INFERENCE, [1e6, 0.3, 0.1])])
def test_planted_single_input_laws_are_recovered(form, truth):
    x = np.geomspace(1e5, 1e9, 7)
    y = form(x, truth)
    fit = fit_law(form, x, y, restarts=20)
    np.testing.assert_allclose([fit.parameters[p] for p in form.parameters], truth, rtol=1e-3)
    assert fit.r2 == pytest.approx(1.0, abs=1e-9)


def test_planted_joint_law_is_recovered_on_a_grid():
    p, d = np.meshgrid(np.geomspace(1e5, 2e7, 5), np.geomspace(2e3, 1e4, 5))
    x = np.stack([p.ravel(), d.ravel()], axis=1)
    truth = [300.0, 0.5, 50.0, 0.7, 0.1]
    noisy = JOINT(x, truth) * (1 + 0.001 * np.random.default_rng(0).normal(size=len(x)))
    fit = fit_law(JOINT, x, noisy)
    np.testing.assert_allclose([fit.parameters[k] for k in ("alpha", "beta", "delta")], [0.5, 0.7, 0.1], rtol=0.1)
    assert fit.r2 > 0.99


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="positive"):
        fit_law(MODEL_SIZE, [0.0, 1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="at least as many"):
        fit_law(MODEL_SIZE, [1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="shape"):
        fit_law(JOINT, [1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0, 5.0])


def test_plots_are_written(tmp_path):
    pytest.importorskip("matplotlib")
    fit = fit_law(MODEL_SIZE, T5_PARAMETERS, T5_CGL, restarts=5)
    path = plot_fit(fit, tmp_path / "model.png", xlabel="non-embedding parameters", ylabel="CGL",
                    labels=["small", "base", "large", "xl", "xxl"])
    assert (tmp_path / "model.png").stat().st_size > 1000 and path.endswith("model.png")
    p, d = np.meshgrid([1e5, 1e6, 1e7], [1e3, 1e4])
    x = np.stack([p.ravel(), d.ravel()], axis=1)
    joint = fit_law(JOINT, x, JOINT(x, [300.0, 0.5, 50.0, 0.7, 0.1]), restarts=5)
    plot_fit(joint, tmp_path / "joint.png", xlabel="P", ylabel="CGL")
    assert (tmp_path / "joint.png").stat().st_size > 1000
