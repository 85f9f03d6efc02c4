"""Privacy–utility trade-off of the three DP placements on digits, from one command.

For ε ∈ {0.5, 1, 3, 8, ∞} (δ = 1e-5) it runs configs/dp/{dpsgd,ldp,cdp}_digits.toml:
- sample-level DP-SGD: each client's noise multiplier calibrated by the engine for its own schedule;
- local DP (user level): clip + Gaussian noise on each update, z calibrated for `rounds` Gaussian compositions;
- central DP (DP-FedAvg): clip on clients, noise z·C on the server's sum, z calibrated likewise.
ε = ∞ runs the same pipeline without noise. Writes benchmarks/dp_tradeoff.md and benchmarks/dp_tradeoff.png.

Run: ``.venv/bin/python benchmarks/dp_tradeoff.py`` (about 10 minutes on 2 cores).
"""
from __future__ import annotations

import math
import sys
import tempfile
import time
from pathlib import Path

import torch

from trustfl.config.load import load_config
from trustfl.experiment import run_experiment
from trustfl.privacy.analysis.gaussian import calibrate_noise_multiplier

EPSILONS = (0.5, 1.0, 3.0, 8.0, math.inf)
DELTA = 1e-5
HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parent / "configs" / "dp"


def overrides(placement: str, eps: float, rounds: int) -> list[str]:
    if placement == "sample":
        return [f"client.dp.epsilon={eps}"] if math.isfinite(eps) else ["client.dp.mode=\"off\""]
    z = calibrate_noise_multiplier(eps, DELTA, 1.0, rounds) if math.isfinite(eps) else 0.0
    budget = [f"client.dp.epsilon={eps}"] if math.isfinite(eps) else ["client.dp.epsilon=0.0"]
    if placement == "local":
        return budget + [f"client_stages=[{{name=\"clip_l2\", max_norm=1.0}}, {{name=\"gaussian_noise\", "
                         f"noise_multiplier={z}, sensitivity=1.0}}]"]
    return budget + [f"server_stages=[{{name=\"central_gaussian_noise\", noise_multiplier={z}, clip_norm=1.0}}]"]


def main() -> None:
    torch.set_num_threads(1)
    files = {"sample": "dpsgd_digits.toml", "local": "ldp_digits.toml", "central": "cdp_digits.toml"}
    results: dict[tuple[str, float], dict] = {}
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for placement, fname in files.items():
            base = load_config(CONFIGS / fname)
            for eps in EPSILONS:
                cfg = load_config(CONFIGS / fname, overrides(placement, eps, base.rounds))
                res = run_experiment(cfg, Path(tmp) / f"{placement}-{eps}", progress=False)
                spent = res.summary.get("epsilon") or {}
                results[(placement, eps)] = {"acc": res.summary["final_accuracy"],
                                             "eps_max": max(spent.values()) if spent else math.inf,
                                             "time": res.summary["wall_time_s"]}
                print(f"{placement:8s} eps={eps:<5} accuracy={res.summary['final_accuracy']:.4f} "
                      f"eps_spent_max={results[(placement, eps)]['eps_max']:.3f} "
                      f"({res.summary['wall_time_s']:.1f} s)", file=sys.stderr, flush=True)
    lines = ["# Privacy–utility trade-off on digits (issue #3)", "",
             "Command: `.venv/bin/python benchmarks/dp_tradeoff.py` "
             f"(total {time.time() - start:.0f} s on 2 cores, one thread). Final test accuracy after the configured "
             "rounds; δ = 1e-5; ε is per client (sample level: example-level DP of each client's data; local and "
             "central: user-level DP of each client's whole contribution). Configs: configs/dp/dpsgd_digits.toml "
             "(10 clients, logreg, Poisson batches), configs/dp/ldp_digits.toml and configs/dp/cdp_digits.toml "
             "(50 clients, logreg, updates clipped to C = 1).", "",
             "| placement | " + " | ".join(f"ε = {e:g}" if math.isfinite(e) else "ε = ∞" for e in EPSILONS) + " |",
             "|---|" + "---|" * len(EPSILONS)]
    for placement in files:
        lines.append(f"| {placement} | " + " | ".join(f"{results[(placement, e)]['acc']:.3f}" for e in EPSILONS)
                     + " |")
    lines += ["", "Largest ε spent by any client (from the ledgers; the budget is the column's ε):", "",
              "| placement | " + " | ".join(f"{e:g}" for e in EPSILONS) + " |", "|---|" + "---|" * len(EPSILONS)]
    for placement in files:
        lines.append(f"| {placement} | " + " | ".join(
            "—" if not math.isfinite(results[(placement, e)]["eps_max"])
            else f"{results[(placement, e)]['eps_max']:.3f}"
            for e in EPSILONS) + " |")
    (HERE / "dp_tradeoff.md").write_text("\n".join(lines) + "\n")
    from trustfl.report.plots import plot_comparison
    xs = {e: (e if math.isfinite(e) else 16.0) for e in EPSILONS}
    plot_comparison({p: [(xs[e], results[(p, e)]["acc"]) for e in EPSILONS] for p in files}, "test accuracy",
                    "digits: accuracy vs ε (∞ plotted at 16)", HERE / "dp_tradeoff.png",
                    xlabel="ε")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
