"""Regression with the generalised engine: FedAvg on scikit-learn's diabetes set with the ``mse`` objective.

Runs the four configs of ``configs/regression/`` (linear model, MLP 10-32-1, linear + DP-SGD at ε = 3, linear
under a Gaussian Byzantine attack with CWTM) and the attacked run with the plain mean, for 3 seeds each, and
reports test MSE, MAE and R² (targets standardised: a constant predictor scores MSE ≈ 1, R² ≈ 0) beside the
centralised least-squares fit on the same split. Hyper-parameters are the configs' own (no tuning: the runs are
not a method comparison, except mean vs CWTM, which share every setting).

Run: ``.venv/bin/python benchmarks/regression.py`` (about a minute); writes ``benchmarks/regression.md`` and
``benchmarks/regression_r2.png``.
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from sklearn.linear_model import LinearRegression  # noqa: E402
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score  # noqa: E402

from trustfl.config.load import load_config  # noqa: E402
from trustfl.data import load_dataset  # noqa: E402
from trustfl.experiment import run_experiment  # noqa: E402
from trustfl.report.plots import plot_comparison  # noqa: E402

SEEDS = (0, 1, 2)
RUNS = [
    ("FedAvg, linear", "diabetes_linear", []),
    ("FedAvg, MLP 10-32-1", "diabetes_mlp", []),
    ("FedAvg + DP-SGD (ε = 3), linear", "diabetes_dpsgd", []),
    ("2/12 Byzantine (Gaussian), mean", "diabetes_robust", ['aggregator={name="mean"}']),
    ("2/12 Byzantine (Gaussian), CWTM", "diabetes_robust", []),
]


def _ms(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def main() -> None:
    out = HERE / "out" / "regression"
    lines = ["# Regression: FedAvg with the `mse` objective on diabetes", "",
             "Command: `.venv/bin/python benchmarks/regression.py` (writes this file and `regression_r2.png`). "
             "scikit-learn's diabetes set, seeded 80/20 split, features and target standardised with the training "
             "split's statistics; 10 clients (12 with the attack), IID; 30 rounds; final values after round 30, "
             f"mean ± std over seeds {list(SEEDS)}.", "",
             "| run | test MSE | test MAE | test R² |", "|---|---|---|---|"]
    ref = {"mse": [], "mae": [], "r2": []}
    for seed in SEEDS:
        ds = load_dataset("diabetes", seed=seed)
        pred = LinearRegression().fit(ds.train_x.numpy(), ds.train_y.numpy()).predict(ds.test_x.numpy())
        y = ds.test_y.numpy()
        ref["mse"].append(mean_squared_error(y, pred))
        ref["mae"].append(mean_absolute_error(y, pred))
        ref["r2"].append(r2_score(y, pred))
    lines.append(f"| centralised least squares (reference) | {_ms(ref['mse'])} | {_ms(ref['mae'])} | "
                 f"{_ms(ref['r2'])} |")
    curves = {}
    for label, config, extra in RUNS:
        finals = {"mse": [], "mae": [], "r2": []}
        seeds_rows = []
        for seed in SEEDS:
            cfg = load_config(ROOT / f"configs/regression/{config}.toml",
                              extra + [f"seed={seed}", "engine.checkpoint_every=0"])
            rows = run_experiment(cfg, out / f"{config}-{len(extra)}-seed{seed}", progress=False).rows
            seeds_rows.append(rows)
            for k in finals:
                finals[k].append(rows[-1][k])
        lines.append(f"| {label} | {_ms(finals['mse'])} | {_ms(finals['mae'])} | {_ms(finals['r2'])} |")
        curves[label] = [(seeds_rows[0][i]["round"], statistics.mean(r[i]["r2"] for r in seeds_rows))
                         for i in range(len(seeds_rows[0]))]
        print(lines[-1], flush=True)
    plot_comparison(curves, "test R² (mean of 3 seeds)", "FedAvg regression on diabetes", HERE / "regression_r2.png")
    lines += ["", "![R² curves](regression_r2.png)", ""]
    (HERE / "regression.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
