"""The references a speed benchmark measures trustfl against compute what they claim to.

A ratio against a reference that computes something else means nothing: until 2026-11-28 the per-client QuAFL
loop of ``benchmarks/quafl_speed.py`` gave every client (and the server) views of one parameter vector, so its 100
clients trained one shared model. These tests load the benchmark module from its file.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def quafl_speed():
    import sys
    sys.path.insert(0, str(BENCHMARKS))  # the module imports its sibling cpu_info
    try:
        spec = importlib.util.spec_from_file_location("quafl_speed_under_test", BENCHMARKS / "quafl_speed.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def federation(quafl_speed):
    fed, _ = quafl_speed.build(quafl_speed.trustfl_config(32, False, False), 32, False)  # synthetic data
    return fed


def test_the_loop_gives_every_client_its_own_model(quafl_speed, federation):
    fed = federation
    loop = quafl_speed.LoopQuAFL(fed.train_data.tensors["x"], fed.train_data.tensors["y"],
                                 [fed.client_rows[c] for c in range(quafl_speed.N)], fed.initial_params, 32)
    storages = {p.untyped_storage().data_ptr() for m in [loop.server, *loop.clients] for p in m.parameters()}
    assert len(storages) == quafl_speed.N + 1  # one vector of its own per model (the parameters are views of it)
    start = fed.initial_params.clone()
    steps = sum(loop.round() for _ in range(3))
    assert steps > 0
    assert torch.equal(fed.initial_params, start)  # the loop never writes the vector it started from
    models = torch.stack([torch.nn.utils.parameters_to_vector(c.parameters()).detach() for c in loop.clients])
    assert torch.unique(models, dim=0).shape[0] > 1  # polled clients moved apart from the others


def test_the_lean_bound_computes_the_loops_models(quafl_speed, federation):
    """Same draws in the same order, so the same steps: the server models agree to float rounding."""
    assert quafl_speed.lean_vs_loop(federation, 32, rounds=3) <= 1e-5
