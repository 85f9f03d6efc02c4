"""Fast start (issue #18): `import trustfl` and the CLI's argument parsing import nothing heavy, a run without DP
never imports dp_accounting, and the plain gradient path never imports torch._dynamo.

Each check runs in a fresh interpreter, since this test process has long imported everything.
"""
from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap

import pytest

HEAVY = ("dp_accounting", "scipy", "sklearn", "matplotlib")
CHECK = textwrap.dedent("""
    import sys
    def heavy(allow_torch=False):
        return sorted(m for m in sys.modules if (m == "torch" or m.startswith("torch.")) and not allow_torch
                      or m.startswith({heavy!r}))
""").format(heavy=HEAVY)


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHECK + textwrap.dedent(code), *args], capture_output=True,
                          text=True, timeout=300)


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_import_trustfl_imports_nothing_heavy():
    _ok(_run("""
        import trustfl
        assert not heavy(), heavy()[:10]
        assert trustfl.TrustFLError.__name__ == "TrustFLError" and callable(trustfl.register)
        @trustfl.register("dataset", "startup_probe")
        def probe():
            return None
        assert not heavy(), heavy()[:10]  # registering loads no component package
    """))


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["privacy", "--help"],
                                  ["privacy", "calibrate", "--help"]])
def test_cli_parser_and_help_import_nothing_heavy(argv):
    _ok(_run("""
        from trustfl.cli import build_parser, main
        build_parser()
        assert not heavy(), heavy()[:10]
        try:
            main(sys.argv[1:])
        except SystemExit as exc:
            assert exc.code == 0, exc.code
        assert not heavy(), heavy()[:10]
    """, *argv))


def test_component_packages_import_no_optional_heavy_dependency():
    """Loading every registered component (what a run does) imports torch, but no dp_accounting, scipy, sklearn or
    matplotlib: those are imported by the functions that use them."""
    _ok(_run("""
        import trustfl
        assert "dataset" in trustfl.kinds()
        assert not heavy(allow_torch=True), heavy(allow_torch=True)[:10]
    """))


def test_the_bundled_sets_load_without_scikit_learn():
    """The default data set and breast cancer are read from the files scikit-learn bundles; importing scikit-learn
    (scipy.stats behind it) would cost more than a second of every such run's start."""
    _ok(_run("""
        from trustfl.data import load_dataset
        for name in ("digits", "digits_canvas", "breast_cancer"):
            load_dataset(name, seed=0)
        assert not heavy(allow_torch=True), heavy(allow_torch=True)[:10]
    """))


def test_run_without_dp_imports_neither_dp_accounting_nor_dynamo(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('rounds = 2\n[data]\ndataset = "fedprox_synthetic"\nnum_clients = 5\npartition = {name = "natural"}'
                   '\noptions = {num_devices = 5, max_samples = 60}\n[model]\nname = "mlp"\nhidden = [8]\n'
                   '[cohort]\nsampler = "uniform"\nsize = 3\n[engine]\nexecutor = "vectorized"\n')
    _ok(_run("""
        from trustfl.cli import main
        assert main(["run", sys.argv[1], "--out", sys.argv[2], "--quiet"]) == 0
        loaded = [m for m in heavy(allow_torch=True) if not m.startswith("matplotlib")]  # plots: the run's end
        assert not loaded, loaded[:10]
        assert "torch._dynamo" not in sys.modules  # torch.func.grad's first call imports it (seconds)
    """, str(cfg), str(tmp_path / "run")))
    _ok(_run("""
        from trustfl.config.load import load_config
        from trustfl.experiment import run_experiment
        run_experiment(load_config(sys.argv[1]), sys.argv[2], progress=False, plots=False)
        assert not [m for m in heavy(allow_torch=True) if m.startswith("matplotlib")]  # no plots: no matplotlib
    """, str(cfg), str(tmp_path / "run_no_plots")))


@pytest.mark.parametrize("package", ["trustfl", "trustfl.core", "trustfl.privacy", "trustfl.privacy.analysis"])
def test_lazy_namespaces_resolve_every_public_name(package):
    module = importlib.import_module(package)
    for name in module.__all__:
        assert getattr(module, name) is not None, name
        assert name in dir(module)
    with pytest.raises(AttributeError):
        getattr(module, "no_such_name")


def test_batch_clipping_never_imports_dynamo(tmp_path):
    """CafCor's gradient method (mini-batch clipping) takes the per-client mean gradients by plain autograd: its
    first round costs what a later one does (torch.func.grad's first call would import torch._dynamo)."""
    _ok(_run("""
        import torch
        from trustfl.client.per_example import clipped_batch_mean
        from trustfl.models.zoo import build_model
        model = build_model("mlp", (6,), 3, 0, hidden=[4])
        params = {k: v.detach().unsqueeze(0).repeat(2, *([1] * v.dim())) for k, v in model.named_parameters()}
        batch = {"x": torch.randn(2, 5, 6), "y": torch.randint(0, 3, (2, 5))}
        clipped, norms = clipped_batch_mean(model, params, batch, torch.ones(2, 5), 0.5)
        assert bool((norms > 0).all())
        assert "torch._dynamo" not in sys.modules
    """))


def test_experiment_freezes_torch_objects_out_of_the_collector():
    """A process whose first import of torch is `trustfl.experiment`'s (a run starting up) moves the objects torch
    left to the collector's permanent generation (a full collection would walk them again: ~0.09 s each); objects
    made later are still collected. A process that imported torch before is left as it is."""
    _ok(_run("""
        import gc, weakref
        at_start = gc.get_freeze_count()  # CPython 3.12 starts with a few hundred frozen, 3.11 with none
        import trustfl.experiment
        assert gc.get_freeze_count() - at_start > len(gc.get_objects()), (gc.get_freeze_count(), at_start)
        class Node:
            pass
        a, b = Node(), Node()
        a.other, b.other = b, a  # a cycle made after the freeze
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None
    """))
    _ok(_run("""
        import gc
        at_start = gc.get_freeze_count()
        import torch
        import trustfl.experiment
        assert gc.get_freeze_count() == at_start, (gc.get_freeze_count(), at_start)
    """))
