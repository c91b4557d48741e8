"""Power-law fits of retrieval quality against model size, data size and inference compute (Cai et al. 2025).

    model size      (Eq. 6)   L(P)    = (gamma / P)^alpha + lambda
    data size       (Eq. 7)   L(D)    = (eta / D)^beta + lambda
    joint           (Eq. 8)   L(P, D) = ((gamma / P)^(alpha / beta) + eta / D)^beta + delta
    inference       (Eq. 12)  MR(C)   = (mu / C)^sigma + lambda

P: non-embedding parameters, D: training (query, identifier) pairs, C: inference FLOPs per query, L: CGL (or any
loss), MR@k = 1 - Recall@k. Fitting follows the authors' code: scipy `least_squares` on the linear-scale residuals
f(x) - y, unweighted, from `restarts` random starts (the scale constant uniform in [1, 1e4], the exponent in
[0.1, 2], the offset in [-1, 1]), keeping the start with the best R^2 = 1 - SS_res / SS_tot on the linear scale.
Our one change: scale constants (gamma, eta, mu) are fitted as their log10, so they stay positive and a constant
far below the starting range (the paper's gamma = 2.26e-2) is one step of the optimiser away, not many.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Optional

import numpy as np

# A form's function of (x float64[n, inputs], parameters in the form's order, scale constants as themselves).
FormFunction = Callable[[np.ndarray, Sequence[float]], np.ndarray]


@dataclasses.dataclass(frozen=True)
class LawForm:
    """A scaling-law form: its parameters in order, which are scale constants (fitted as log10), the initial draw
    range of each, and how many inputs (columns of x) it takes."""
    name: str
    equation: str
    parameters: tuple[str, ...]
    scales: tuple[str, ...]
    initial: Mapping[str, tuple[float, float]]
    inputs: int
    function: FormFunction

    def __call__(self, x: np.ndarray, values: Sequence[float]) -> np.ndarray:
        return self.function(_columns(x, self.inputs), values)


def _columns(x, inputs: int) -> np.ndarray:
    x = np.asarray(x, np.float64)
    x = x[:, None] if x.ndim == 1 else x
    if x.ndim != 2 or x.shape[1] != inputs:
        raise ValueError(f"expected x of shape [n, {inputs}], got {np.shape(x)}")
    if not (x > 0).all():
        raise ValueError("scaling-law inputs (parameters, pairs, FLOPs) must be positive")
    return x


def _single(x, v):
    scale, exponent, offset = v
    return (scale / x[:, 0]) ** exponent + offset


def _joint(x, v):
    gamma, alpha, eta, beta, delta = v
    return ((gamma / x[:, 0]) ** (alpha / beta) + eta / x[:, 1]) ** beta + delta


_SINGLE_RANGES = {"scale": (1.0, 1e4), "exponent": (0.1, 2.0), "offset": (-1.0, 1.0)}


def _single_form(name: str, equation: str, scale: str, exponent: str, offset: str) -> LawForm:
    return LawForm(name=name, equation=equation, parameters=(scale, exponent, offset), scales=(scale,),
                   initial={scale: _SINGLE_RANGES["scale"], exponent: _SINGLE_RANGES["exponent"],
                            offset: _SINGLE_RANGES["offset"]}, inputs=1, function=_single)


MODEL_SIZE = _single_form("model_size", "L(P) = (gamma/P)^alpha + lambda", "gamma", "alpha", "lambda")
DATA_SIZE = _single_form("data_size", "L(D) = (eta/D)^beta + lambda", "eta", "beta", "lambda")
INFERENCE = _single_form("inference", "MR(C) = (mu/C)^sigma + lambda", "mu", "sigma", "lambda")
JOINT = LawForm(name="joint", equation="L(P,D) = ((gamma/P)^(alpha/beta) + eta/D)^beta + delta",
                parameters=("gamma", "alpha", "eta", "beta", "delta"), scales=("gamma", "eta"),
                initial={"gamma": (1.0, 1e4), "alpha": (0.1, 2.0), "eta": (1.0, 1e4), "beta": (0.1, 2.0),
                         "delta": (-1.0, 1.0)}, inputs=2, function=_joint)
FORMS: dict[str, LawForm] = {f.name: f for f in (MODEL_SIZE, DATA_SIZE, JOINT, INFERENCE)}


def r_squared(y: np.ndarray, predicted: np.ndarray) -> float:
    """1 - SS_res / SS_tot on the linear scale."""
    y = np.asarray(y, np.float64)
    total = float(np.sum((y - y.mean()) ** 2))
    residual = float(np.sum((y - np.asarray(predicted, np.float64)) ** 2))
    return 1.0 - residual / total if total > 0 else (1.0 if residual == 0 else -math.inf)


@dataclasses.dataclass(frozen=True)
class Fit:
    """A fitted law: `parameters` by name, R^2, and the points it was fitted to."""
    form: LawForm
    parameters: dict[str, float]
    r2: float
    x: np.ndarray
    y: np.ndarray
    restarts: int

    def predict(self, x) -> np.ndarray:
        return self.form(x, [self.parameters[p] for p in self.form.parameters])

    def to_json(self) -> dict:
        return {"form": self.form.name, "equation": self.form.equation, "parameters": self.parameters,
                "r2": self.r2, "points": len(self.y), "restarts": self.restarts,
                "x": np.asarray(self.x).tolist(), "y": np.asarray(self.y).tolist()}


def fit_law(form: LawForm, x, y, *, restarts: int = 50, seed: int = 0) -> Fit:
    """Least squares from `restarts` random starts (see the module docstring); the best R^2 wins. Needs at least as
    many points as the form has parameters (as many: the fit is exactly determined, R^2 = 1)."""
    from scipy.optimize import least_squares
    x = _columns(x, form.inputs)
    y = np.asarray(y, np.float64)
    if y.shape != (x.shape[0],) or not np.isfinite(y).all():
        raise ValueError(f"y must be {x.shape[0]} finite values, got shape {y.shape}")
    if len(y) < len(form.parameters):
        raise ValueError(f"{form.name}: {len(form.parameters)} parameters need at least as many points, got {len(y)}")
    is_scale = np.array([p in form.scales for p in form.parameters])

    def values(theta):
        theta = np.array(theta, np.float64)
        theta[is_scale] = 10.0 ** theta[is_scale]
        return theta

    def residuals(theta):
        with np.errstate(all="ignore"):
            out = form.function(x, values(theta)) - y
        return np.where(np.isfinite(out), out, 1e6)

    rng = np.random.default_rng(seed)
    best: Optional[tuple[float, np.ndarray]] = None
    for _ in range(restarts):
        start = np.array([rng.uniform(*form.initial[p]) for p in form.parameters])
        start[is_scale] = np.log10(start[is_scale])
        try:
            result = least_squares(residuals, start, method="lm" if len(y) >= len(start) else "trf",
                                   x_scale="jac", max_nfev=20000)
        except ValueError:
            continue
        with np.errstate(all="ignore"):
            predicted = form.function(x, values(result.x))
        if not np.isfinite(predicted).all():
            continue
        score = r_squared(y, predicted)
        if best is None or score > best[0]:
            best = (score, result.x)
    if best is None:
        raise RuntimeError(f"{form.name}: no restart of {restarts} converged to finite predictions")
    fitted = values(best[1])
    return Fit(form=form, parameters={p: float(v) for p, v in zip(form.parameters, fitted)}, r2=float(best[0]),
               x=x if form.inputs > 1 else x[:, 0], y=y, restarts=restarts)


def plot_fit(fit: Fit, path, *, xlabel: str, ylabel: str, title: str = "", labels: Optional[Sequence] = None) -> str:
    """A PNG of the points and the fitted curve on log-log axes, the fitted parameters and R^2 in the legend.
    Single-input forms only (the joint form: one curve per distinct D, drawn against P)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(6, 4.2))
    legend = ", ".join(f"{p}={_short(v)}" for p, v in fit.parameters.items()) + f", R²={fit.r2:.3f}"
    if fit.form.inputs == 1:
        grid = np.geomspace(fit.x.min(), fit.x.max(), 200)
        axes.scatter(fit.x, fit.y, color="C0", zorder=3, label="measured")
        if labels is not None:
            for xi, yi, label in zip(fit.x, fit.y, labels):
                axes.annotate(str(label), (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
        axes.plot(grid, fit.predict(grid), color="C1", label=f"{fit.form.equation}\n{legend}")
    else:
        for i, d in enumerate(np.unique(fit.x[:, 1])):
            at = fit.x[:, 1] == d
            ps = np.geomspace(fit.x[at, 0].min(), fit.x[at, 0].max(), 100)
            axes.scatter(fit.x[at, 0], fit.y[at], color=f"C{i}", zorder=3, label=f"D={d:g}")
            axes.plot(ps, fit.predict(np.stack([ps, np.full_like(ps, d)], axis=1)), color=f"C{i}")
        axes.plot([], [], color="k", label=f"{fit.form.equation}\n{legend}")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    if title:
        axes.set_title(title)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return str(path)


def _short(value: float) -> str:
    return f"{value:.3g}" if 1e-3 <= abs(value) < 1e4 else f"{value:.3e}"
