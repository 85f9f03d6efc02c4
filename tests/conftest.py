import pytest

from trustfl.config.load import config_from_dict


def apply_overrides(data: dict, overrides: dict) -> dict:
    """Set ``overrides`` (``"client__lr": 0.1`` sets ``data["client"]["lr"]``) in the config dict ``data``."""
    for key, value in overrides.items():
        node = data
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return data


@pytest.fixture
def small_config():
    """A small, fast FedAvg experiment on digits (override keys per test)."""

    def make(**overrides):
        data = {
            "name": "small", "seed": 3, "rounds": 5,
            "data": {"dataset": "digits", "num_clients": 8, "partition": {"name": "dirichlet", "alpha": 1.0}},
            "model": {"name": "mlp", "hidden": [32]},
            "cohort": {"sampler": "uniform", "size": 5},
            "client": {"epochs": 1, "batch_size": 16, "lr": 0.1, "momentum": 0.5, "weight_decay": 1e-4},
            "engine": {"checkpoint_every": 0},
        }
        return config_from_dict(apply_overrides(data, overrides))

    return make


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for modules of small problems: avoids OpenMP spin-waits when the 2 cores are shared."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(params=["one_after_another", "on_threads"])
def draw_threads(request, monkeypatch):
    """Per-client draws made one after another, or forced onto two threads by ``trustfl.core.rng.run_draws``."""
    import torch

    import trustfl.core.rng as rng

    before = torch.get_num_threads()
    if request.param == "on_threads":
        monkeypatch.setattr(rng, "PARALLEL_DRAW_MIN", 0)
        torch.set_num_threads(2)
    yield request.param
    torch.set_num_threads(before)


def _devices() -> list[str]:
    import torch

    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=_devices())
def device(request):
    """Every device a test should run on: the CPU, and CUDA when this machine has it (``engine.device``)."""
    return request.param


@pytest.fixture(scope="session")
def fake_idx(tmp_path_factory):
    """A data directory with small seeded fake MNIST and Fashion-MNIST IDX files, for the shipped configs that read
    them (``tests.engine.shipped_configs.overrides`` points them here)."""
    from tests.engine.shipped_configs import write_fake_idx

    path = tmp_path_factory.mktemp("idx_data")
    write_fake_idx(path)
    return path
