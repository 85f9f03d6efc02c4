"""Write the example's own data set: ``sensors.csv``, 600 rows from 6 sites (a natural partition by ``site``).

Each row holds 4 sensor readings and a label ``ok`` / ``fault``; every site has its own offset (non-i.i.d.
features), so a client's data is its site's. Run from the repository root:

    .venv/bin/python examples/custom/make_data.py            # writes examples/custom/sensors.csv
    .venv/bin/python examples/custom/make_data.py OUT.csv    # or another path
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np


def write(path: Path, rows_per_site: int = 100, sites: int = 6, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["site", "temp", "vibration", "current", "pressure", "status"])
        for site in range(sites):
            offset = rng.normal(0.0, 0.5, size=4)
            fault = rng.random(rows_per_site) < 0.4
            x = rng.normal(0.0, 1.0, size=(rows_per_site, 4)) + offset
            x[fault] += np.array([1.5, 2.0, -1.0, 0.5])          # faults shift the readings
            for row, bad in zip(x, fault):
                out.writerow([f"site-{site}", *np.round(row, 4), "fault" if bad else "ok"])
    return path


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("sensors.csv")
    print(f"wrote {write(target)}")
