"""Why FedSC ≈ FedAvg+SC on the small setting: the geometry of the representations round by round.

For each algorithm (``fedavg_sc``, ``fedsc``, ``centralized_sc``) on configs/fedsc/digits_canvas_1class.toml (seed 0,
unchanged otherwise) this script runs the rounds itself and, after selected rounds, measures on the training split
(no augmentation) with the global model:

- ``‖z‖``: the mean norm of the projector output z, and ``‖z̄‖`` the norm of its mean over all examples;
- ``centred trace``: Tr Cov(z), the energy of what varies from one example to another;
- ``uncentred erank``: exp(entropy) of the normalised eigenvalues of R = E[z zᵀ] (1 = every z on one line);
- ``inter/intra``: Σ_j q_j Tr(R_j R_{−j}) / Σ_j q_j ‖R_j‖²_F over the clients' (clipped, √μ) matrices R_j: 1 when
  every client's matrix is the same;
- ``train loss``: the round's mean local loss (−0.5 is the value of the SC loss when every z is one unit vector).

Three settings: the config as shipped (He-normal weights with zero biases, a 1-pixel shift that keeps the digit in
its canvas), the same with the 2-pixel shift it had before benchmarks/fedsc_shift.md, and the earliest one
(``model.init = "default"``, ``recipe.augment.shift_mode = "crop"``, 2 pixels), where every federated run stays at
the SC loss's trivial point.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fedsc_geometry.py --out benchmarks/fedsc_geometry.md``.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trustfl.config.build import build_federation  # noqa: E402
from trustfl.config.load import load_config  # noqa: E402
from trustfl.engine.sync import initial_state, run_round  # noqa: E402
from trustfl.objectives.spectral import norm_clip  # noqa: E402

CONFIG = ROOT / "configs/fedsc/digits_canvas_1class.toml"
REPORT = (1, 2, 5, 10, 20, 40, 60)
SETTINGS = {"as shipped (init he, shift keep 1)": [],
            "before fedsc_shift.md (init he, shift keep 2)": ["recipe.augment.shift=2"],
            "earlier setting (init default, shift crop 2)": ['model.init="default"', 'recipe.augment.shift_mode="crop"',
                                                             "recipe.augment.shift=2"]}


def geometry(fed, flat: torch.Tensor, mu: float) -> dict[str, float]:
    params = fed.layout.unflatten(flat)
    x = fed.train_data.tensors["x"]
    with torch.no_grad():
        z = fed.objective.forward(fed.model, params, {"x": x})
        per_client = []
        for c in range(fed.num_clients):
            zc = norm_clip(z[fed.client_rows[c]], math.sqrt(mu))
            per_client.append(zc.T @ zc / zc.shape[0])
    r = z.T @ z / z.shape[0]
    ev = torch.linalg.eigvalsh(r).clamp(min=0)
    p = ev / ev.sum()
    out = {"norm": float(z.norm(dim=1).mean()), "mean_norm": float(z.mean(0).norm()),
           "centred_trace": float((z - z.mean(0)).square().sum(1).mean()),
           "erank": float(torch.exp(-(p * (p + 1e-12).log()).sum()))}
    if len(per_client) > 1:
        rs = torch.stack(per_client)
        total = rs.sum(0)
        j = len(per_client)
        inter = sum(float((rs[i] * (total - rs[i]) / (j - 1)).sum()) for i in range(j)) / j
        intra = sum(float(rs[i].square().sum()) for i in range(j)) / j
        out["inter_intra"] = inter / intra
    return out


def trace(algorithm: str, seed: int, overrides: list[str]) -> list[dict]:
    cfg = load_config(CONFIG, [f'algorithm="{algorithm}"', f"seed={seed}", *overrides])
    fed = build_federation(cfg, quiet=True)
    mu = float(cfg.recipe.get("mu", 4.0))
    state = initial_state(fed)
    rows = [{"round": 0, **geometry(fed, state.params, mu), "loss": float("nan")}]
    for r in range(cfg.rounds):
        state, metrics = run_round(fed, state)
        if r + 1 in REPORT:
            rows.append({"round": r + 1, **geometry(fed, state.params, mu), "loss": metrics["train_loss"]})
            print(algorithm, rows[-1], file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="also write the record (markdown) here")
    args = parser.parse_args()
    command = "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fedsc_geometry.py" + (f" --out {args.out}" if args.out
                                                                                   else "")
    lines = [f"`{command}`", "", "# FedSC small setting: the representations' geometry by round", "",
             f"configs/fedsc/digits_canvas_1class.toml, seed {args.seed}, global model after each listed round, "
             "training split without augmentation. Columns: see the script's docstring.", ""]
    for setting, overrides in SETTINGS.items():
        for algorithm in ("fedavg_sc", "fedsc", "centralized_sc"):
            rows = trace(algorithm, args.seed, overrides)
            lines += [f"## {algorithm}, {setting}", "",
                      "| round | ‖z‖ | ‖z̄‖ | centred trace | uncentred erank | inter/intra | train loss |",
                      "|---|---|---|---|---|---|---|"]
            for row in rows:
                ratio = f"{row['inter_intra']:.3f}" if "inter_intra" in row else "—"
                loss = "—" if math.isnan(row["loss"]) else f"{row['loss']:.4f}"
                lines.append(f"| {row['round']} | {row['norm']:.3f} | {row['mean_norm']:.3f} | "
                             f"{row['centred_trace']:.4f} | {row['erank']:.2f} | {ratio} | {loss} |")
            lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
