"""Robust-HDP Table 3 from formulas: Σ_i w_i² σ_i² / (p η²) at e = 1 (FMNIST, E = 200) with σ_i² from Eq. 3 + Eq. 7.

Setting (the paper's Table 3 and the authors' code): N_i = 2400, K = 1, c = 3, δ = 1e-4, E = 200, the code's ε and
batch lists, z_i = compute_z(ε_i, N_i, b_i) rounded to 2 decimals. The metric does not depend on η or p (both cancel).

The z values are pinned below (computed with ``trustfl.privacy.analysis.rhdp.compute_z``, the paper's bisection,
~90 s for all of them); the slow test recomputes them. Reference: the paper's Table 3, within 2% (or ±0.01 for
the tiny Oracle values, which the paper prints with 2 decimals: 0.07 vs our 0.076). Not reproducible and skipped:
Dist6 (all rows; the paper probably used another ε list) and minimum-ε Dist8 (3.7% off).
"""
import pytest

from trustfl.aggregate.noise_aware import (aggregate_noise_metric, dpfedavg_weights, oracle_weights,
                                           update_noise_variance, weiavg_weights)

N, CLIP, EPOCHS, ROUNDS, DELTA = 2400, 3.0, 1, 200, 1e-4
BATCHES = [32, 64, 16, 32, 16, 16, 16, 32, 32, 64, 32, 64, 16, 128, 16, 64, 32, 64, 16, 16]
EPS = {
    "Dist1": [2.81, 1.69, 1.74, 1.46, 2.43, 0.85, 2.87, 1.62, 2.16, 1.88, 2.73, 0.97, 1.84, 1.81, 2.57, 1.45, 1.91,
              1.56, 2.02, 2.29],
    "Dist2": [5.45, 1.0, 1.15, 0.2, 4.52, 4.88, 0.98, 0.2, 1.05, 0.93, 1.0, 0.21, 0.21, 1.27, 0.89, 1.17, 0.96, 0.89,
              1.04, 0.84],
    "Dist3": [2.2, 3.66, 0.2, 1.65, 0.9, 0.64, 1.09, 1.86, 2.1, 2.79, 2.21, 3.49, 1.18, 4.41, 0.33, 3.42, 2.2, 2.88,
              0.87, 1.15],
    "Dist4": [0.57, 0.66, 0.42, 3.97, 3.27, 0.45, 0.55, 2.58, 1.82, 0.64, 0.19, 2.38, 0.34, 0.44, 0.47, 0.5, 0.56,
              0.51, 0.68, 0.19],
    "Dist5": [0.95, 1.5, 0.2, 0.74, 0.46, 0.37, 0.54, 0.82, 0.91, 1.17, 0.95, 1.43, 0.57, 1.78, 0.25, 1.41, 0.95,
              1.21, 0.45, 0.56],
    "Dist6": [0.5, 0.46, 0.39, 0.44, 0.21, 0.36, 0.19, 0.51, 1.12, 0.2, 0.49, 0.19, 0.19, 0.2, 0.2, 0.18, 0.61, 0.15,
              0.38, 0.53],
    "Dist7": [0.26, 0.82, 0.55, 0.78, 0.98, 0.63, 0.6, 0.26, 0.41, 0.6, 0.74, 0.84, 0.5, 0.25, 0.43, 0.93, 0.37,
              0.56, 0.94, 0.22],
    "Dist8": [0.2, 0.2, 0.19, 0.44, 0.21, 0.19, 0.19, 0.51, 0.62, 0.2, 0.2, 0.19, 0.19, 0.2, 0.2, 0.18, 0.61, 0.17,
              0.38, 0.53],
    "Dist9": [0.45, 0.25, 0.22, 0.31, 0.28, 0.36, 0.29, 0.29, 0.23, 0.27, 0.48, 0.28, 0.42, 0.46, 0.44, 0.26, 0.25,
              0.21, 0.21, 0.26],
}
# (z_i per client, z(min_j ε_j, b) per batch size b)
Z = {
    "Dist1": ([2.78, 6.19, 3.07, 5.05, 2.29, 6.02, 1.99, 4.58, 3.51, 5.6, 2.85, 10.53, 2.92, 8.17, 2.18, 7.15, 3.93,
               6.67, 2.69, 2.41], {16: 6.02, 32: 8.48, 64: 11.97, 128: 16.91}),
    "Dist2": ([1.62, 10.22, 4.51, 39.84, 1.4, 1.33, 5.25, 39.84, 6.91, 10.97, 7.25, 51.74, 25.88, 11.46, 5.76, 8.78,
               7.54, 11.44, 4.96, 6.09], {16: 28.18, 32: 39.84, 64: 56.34, 128: 79.67}),
    "Dist3": ([3.45, 3.06, 28.18, 4.5, 5.69, 7.92, 4.74, 4.03, 3.6, 3.89, 3.44, 3.19, 4.4, 3.62, 15.18, 3.24, 3.45,
               3.78, 5.88, 4.51], {16: 28.18, 32: 39.84, 64: 56.34, 128: 79.67}),
    "Dist4": ([12.52, 15.32, 11.97, 2.07, 1.79, 11.18, 9.18, 2.99, 4.11, 15.79, 44.15, 4.5, 14.74, 32.27, 10.71,
               20.13, 12.74, 19.74, 7.47, 31.22], {16: 31.22, 32: 44.15, 64: 62.44, 128: 88.29}),
    "Dist5": ([7.61, 6.93, 28.18, 9.7, 10.94, 13.56, 9.35, 8.78, 7.94, 8.78, 7.61, 7.25, 8.87, 8.3, 20.3, 7.35, 7.61,
               8.51, 11.18, 9.02], {16: 28.18, 32: 39.84, 64: 56.34, 128: 79.67}),
    "Dist6": ([14.24, 21.85, 12.87, 16.15, 25.88, 13.93, 31.22, 13.97, 6.5, 56.34, 14.53, 62.44, 31.22, 79.67, 28.18,
               71.07, 11.72, 211.79, 13.21, 9.52], {16: 105.9, 32: 149.78, 64: 211.79, 128: 299.56}),
    "Dist7": ([27.41, 12.39, 9.18, 9.22, 5.25, 8.04, 8.43, 27.41, 17.31, 16.82, 9.7, 12.11, 10.08, 57.37, 11.69,
               10.97, 19.16, 18.0, 5.46, 24.06], {16: 24.06, 32: 34.02, 64: 48.11, 128: 68.03}),
    "Dist8": ([39.84, 56.34, 31.22, 16.15, 25.88, 31.22, 31.22, 13.97, 11.53, 56.34, 39.84, 62.44, 31.22, 79.67,
               28.18, 71.07, 11.72, 84.69, 13.21, 9.52], {16: 42.35, 32: 59.88, 64: 84.69, 128: 119.76}),
    "Dist9": ([15.8, 40.57, 24.06, 22.83, 17.88, 13.93, 17.25, 24.39, 31.93, 37.16, 14.82, 35.74, 11.97, 30.89,
               11.43, 38.75, 28.69, 51.74, 25.88, 19.39], {16: 25.88, 32: 36.59, 64: 51.74, 128: 73.17}),
}
DISTS = [f"Dist{k}" for k in range(1, 10)]
PAPER = {  # Table 3, Dist1 … Dist9
    "weiavg": [1.02, 1.89, 0.92, 3.22, 4.58, 28.29, 9.85, 48.15, 34.91],
    "dpfedavg": [1.27, 16.94, 16.28, 26.87, 25.64, 70.71, 18.50, 85.70, 43.20],
    "min_eps": [4.68, 103.91, 103.91, 127.18, 103.91, 1868.45, 74.41, 241.37, 87.15],
    "oracle": [0.27, 0.47, 0.07, 0.64, 0.39, 7.60, 2.25, 13.81, 5.93],
}
SPEC = {  # our recomputation with the code's lists (a regression target for every cell, Dist6 included)
    "weiavg": [1.03, 1.89, 0.92, 3.23, 4.59, 27.74, 9.87, 48.07, 34.87],
    "dpfedavg": [1.28, 16.91, 16.19, 26.74, 25.55, 67.12, 18.60, 85.48, 43.17],
    "min_eps": [4.69, 102.93, 102.93, 126.35, 102.93, 1453.79, 75.03, 232.47, 86.81],
    "oracle": [0.27, 0.48, 0.08, 0.65, 0.39, 7.63, 2.28, 13.85, 6.02],
}
NOT_REPRODUCIBLE = {(row, "Dist6") for row in PAPER} | {("min_eps", "Dist8")}


def table3_row(dist: str, z: list[float], z_min: dict[int, float]) -> dict[str, float]:
    """The four formula rows of Table 3 for one distribution (η = 1, p = 1: both cancel)."""
    var = update_noise_variance(z, BATCHES, N, EPOCHS, 1.0, CLIP, 1)
    var_min = update_noise_variance([z_min[b] for b in BATCHES], BATCHES, N, EPOCHS, 1.0, CLIP, 1)
    sizes = dpfedavg_weights([N] * len(BATCHES))
    return {"weiavg": aggregate_noise_metric(weiavg_weights(EPS[dist]), var, 1, 1.0),
            "dpfedavg": aggregate_noise_metric(sizes, var, 1, 1.0),
            "min_eps": aggregate_noise_metric(sizes, var_min, 1, 1.0),
            "oracle": aggregate_noise_metric(oracle_weights(var), var, 1, 1.0)}


def check_against_paper(rows: dict[str, dict[str, float]]) -> None:
    for j, dist in enumerate(DISTS):
        for row, ref in PAPER.items():
            ours = rows[dist][row]
            assert ours == pytest.approx(SPEC[row][j], abs=0.006, rel=1e-3), (row, dist)
            if (row, dist) in NOT_REPRODUCIBLE:
                continue
            assert abs(ours - ref[j]) <= max(0.02 * ref[j], 0.01), (row, dist, ours, ref[j])


def test_table3_formula_rows_match_the_paper():
    check_against_paper({d: table3_row(d, *Z[d]) for d in DISTS})


def test_table3_ordering_oracle_below_every_baseline():
    for d in DISTS:
        r = table3_row(d, *Z[d])
        assert r["oracle"] < r["weiavg"] < r["dpfedavg"] < r["min_eps"], d


@pytest.mark.slow
def test_table3_with_recomputed_noise_multipliers():
    """Recompute every z with the privacy package's compute_z (Illinois secant, ~40 s; the pinned values came from
    the paper's bisection, so a z on a rounding boundary may differ by 0.01, and Dist6's ε = 0.15 by 0.04)."""
    rhdp = pytest.importorskip("trustfl.privacy.analysis.rhdp")
    rows = {}
    for d in DISTS:
        z = [rhdp.compute_z(e, N, b, EPOCHS, ROUNDS, DELTA, method="secant") for e, b in zip(EPS[d], BATCHES)]
        z_min = {b: rhdp.compute_z(min(EPS[d]), N, b, EPOCHS, ROUNDS, DELTA, method="secant")
                 for b in (16, 32, 64, 128)}
        # rel: near ε's floor (0.146 at order 64) ε(z) is flat, so |ε − target| <= 1e-6 pins z less tightly
        assert z == pytest.approx(Z[d][0], abs=0.0101, rel=5e-4)
        assert z_min == pytest.approx(Z[d][1], abs=0.0101, rel=5e-4)
        rows[d] = table3_row(d, z, z_min)
    check_against_paper(rows)
