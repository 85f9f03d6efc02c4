"""engine.max_clients_per_batch = "auto" and the refusal of a cohort whose messages cannot fit (issue #14)."""
import subprocess
import sys

import pytest
import torch

from trustfl.config.build import build_federation
from trustfl.config.load import config_from_dict
from trustfl.core import memory
from trustfl.engine import chunking
from trustfl.engine.executors import VectorizedExecutor
from trustfl.engine.sync import initial_state, run_round
from trustfl.errors import ConfigError


def _fed(chunk, size=12, **client):
    return build_federation(config_from_dict({
        "seed": 3, "rounds": 2, "data": {"dataset": "digits", "num_clients": 24},
        "model": {"name": "mlp", "hidden": [32]}, "cohort": {"sampler": "uniform", "size": size},
        "client": {"batch_size": 16, **client}, "engine": {"max_clients_per_batch": chunk, "checkpoint_every": 0}}),
        quiet=True)


def test_activation_count_of_an_mlp_is_its_leaf_outputs():
    fed = _fed(0)
    example = fed.train_data.gather(torch.tensor([0]))
    acts = chunking.activation_numel(fed.model, fed.layout.unflatten(fed.initial_params), example,
                                     fed.objective.forward)
    assert acts == 32 + 32 + 10  # Linear(64, 32), ReLU, Linear(32, 10) for one example


def test_group_size_and_bytes_per_client_arithmetic():
    per = chunking.bytes_per_client(1000, 50, 8, materialised=False)
    assert per == 4 * (chunking.PARAMETER_COPIES * 1000 + chunking.ACTIVATION_COPIES * 8 * 50)
    assert chunking.bytes_per_client(1000, 50, 8, materialised=True) == per + 4 * 8 * 1000
    assert chunking.group_size(100, per, free=int(10 * per / chunking.GROUP_SHARE)) == 10
    assert chunking.group_size(100, per, free=0) == 1  # never less than one client
    assert chunking.group_size(3, per, free=10 ** 12) == 3  # never more than the cohort
    # on the CPU a group's step activations are also capped (CafCor's CNN: 15,230 per example, 7.8 MB per client)
    acts = chunking.activation_bytes(15_230, 32)
    assert acts == 4 * chunking.ACTIVATION_COPIES * 32 * 15_230
    assert chunking.group_size(100, per, 10 ** 12, acts) == chunking.CPU_GROUP_ACTIVATIONS // acts == 17
    assert chunking.group_size(100, per, 10 ** 12, chunking.CPU_GROUP_ACTIVATIONS * 2) == 1
    assert chunking.group_size(100, per, 10 ** 12, chunking.activation_bytes(1594, 32)) == 100  # the MLP: no cap


def test_auto_chunks_a_cohort_that_does_not_fit_and_agrees_with_one_batch(monkeypatch):
    whole = _fed(0)
    state_w, rows_w = initial_state(whole), []
    for _ in range(2):
        state_w, m = run_round(whole, state_w)
        rows_w.append(m["train_loss"])
    auto = _fed("auto")
    executor = auto.executor
    monkeypatch.setattr(memory, "free_memory", lambda device: 0)
    state_a = initial_state(auto)
    sizes = []
    original = VectorizedExecutor.group_size

    def spy(self, job, plans, cohort):
        size = original(self, job, plans, cohort)
        per_client, _ = next(iter(self._per_client.values()))
        sizes.append(size)
        assert per_client > 4 * auto.layout.numel * chunking.PARAMETER_COPIES
        return size
    monkeypatch.setattr(VectorizedExecutor, "group_size", spy)
    for r in range(2):
        state_a, m = run_round(auto, state_a)
        assert m["train_loss"] == pytest.approx(rows_w[r], rel=1e-5)
    assert sizes == [1, 1]  # no free memory: one client at a time
    torch.testing.assert_close(state_a.params, state_w.params, rtol=1e-5, atol=1e-6)
    assert executor.max_clients_per_batch == "auto"


def test_auto_with_ample_memory_is_the_whole_cohort():
    fed = _fed("auto")
    state = initial_state(fed)
    plans_seen = []
    original = fed.executor.group_size
    fed.executor.group_size = lambda job, plans, cohort: plans_seen.append(original(job, plans, cohort)) or \
        plans_seen[-1]
    run_round(fed, state)
    assert plans_seen == [12]


def test_a_fixed_group_that_cannot_fit_is_refused_before_it_trains(monkeypatch):
    """engine.max_clients_per_batch = 0 (the whole cohort) or N: when the group's stacked parameters and their
    gradients, beside the cohort's messages, exceed the free memory, the round stops before any step (a MemoryError
    the run loop reports as a one-line ResourceError) instead of failing, or on an overcommitting machine being
    killed, inside it. 12 clients × 2,410 parameters: messages 115,680 bytes, a group of 12 twice that again."""
    monkeypatch.setattr(memory, "free_memory", lambda device: 300_000)
    whole = _fed(0)
    steps = []
    monkeypatch.setattr(whole.executor, "run", lambda *a, **k: steps.append(1) or VectorizedExecutor.run(
        whole.executor, *a, **k))
    with pytest.raises(MemoryError, match="allocate 347040 bytes"):
        run_round(whole, initial_state(whole))
    assert steps == [1]  # refused inside the executor, before its first group trained
    fours = _fed(4)  # 115,680 + 2 · 4 · 2,410 · 4 = 192,800 bytes
    state, _ = run_round(fours, initial_state(fours))
    assert state.round == 1


def test_a_cohort_whose_messages_cannot_fit_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"`cohort.size`: a round of 100 clients .* 100 x 1000 float32"):
        chunking.check_cohort_fits(100, 1000, "cpu", "cohort.size", free=int(4 * 100 * 1000 / 0.5))
    chunking.check_cohort_fits(100, 1000, "cpu", "cohort.size", free=int(4 * 100 * 1000 / 0.3))  # fits
    assert chunking.expected_cohort("uniform", 50, 80, 0.0) == 50
    assert chunking.expected_cohort("all", 50, 0, 0.0) == 50
    assert 10 < chunking.expected_cohort("poisson", 1000, 0, 0.01) <= 1000


def test_a_cohort_whose_gram_matrices_cannot_fit_is_refused_for_pairwise_rules_only():
    """Krum with cohort.size = 300,000 trained the whole round before its 360 GB Gram product failed; a rule that
    forms the n×n Gram matrix (Krum, CAF, MDA, the geometric median, NNM before any rule) is now refused when the run
    is built. 1,000 clients of 10 parameters: 40 KB of messages, 24 MB of Gram matrices, 10 MB free."""
    import trustfl
    from trustfl.aggregate.base import PreAggregated

    with pytest.raises(ConfigError, match=r"`cohort.size`: a round of 1000 clients needs the 1000 x 1000 float64 "
                                          r"Gram matrices .*\(24.0 MB beside the messages' 0.0 MB\), more than the "
                                          r"10.0 MB free on cpu; use at most about 644 clients per round"):
        chunking.check_cohort_fits(1000, 10, "cpu", "cohort.size", free=10_000_000, pairwise=True)
    chunking.check_cohort_fits(1000, 10, "cpu", "cohort.size", free=10_000_000)  # the messages alone fit
    chunking.check_cohort_fits(600, 10, "cpu", "cohort.size", free=10_000_000, pairwise=True)
    mean, nnm = trustfl.build("aggregator", "mean"), trustfl.build("pre_aggregator", "nnm", f=1)
    assert trustfl.build("aggregator", "krum", f=1).pairwise and not mean.pairwise
    assert PreAggregated((nnm,), mean).pairwise and not PreAggregated((trustfl.build(
        "pre_aggregator", "bucketing", bucket_size=2),), mean).pairwise


def test_bad_settings_are_refused_with_the_key_path():
    for value in ("x", -1, 2.5, True):
        with pytest.raises(ConfigError, match="engine.max_clients_per_batch"):
            config_from_dict({"engine": {"max_clients_per_batch": value}})
    with pytest.raises(ConfigError, match="max_clients_per_batch"):
        VectorizedExecutor("many")


def test_the_cli_refuses_a_cohort_too_large_for_this_machine_in_one_line(tmp_path):
    cfg = tmp_path / "huge.toml"
    cfg.write_text('[data]\ndataset = "digits"\nnum_clients = 1000\n[cohort]\nsampler = "uniform"\nsize = 1000\n'
                   '[model]\nname = "mlp"\nhidden = [8000, 8000]\n')
    out = subprocess.run([sys.executable, "-m", "trustfl", "validate", str(cfg)], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "`cohort.size`" in lines[0] and "Traceback" not in out.stderr


def test_the_server_takes_a_cohorts_messages_without_copying_them():
    from trustfl.engine.round_parts import stack_rows
    messages = torch.randn(5, 7)
    stacked, shaped = stack_rows(list(messages), 7, messages)
    assert stacked.data_ptr() == messages.data_ptr() and shaped == [True] * 5  # the matrix itself
    reordered = [messages[i] for i in (1, 0, 2, 3, 4)]
    stacked, _ = stack_rows(reordered, 7, messages)  # not its rows in order: a stacked copy, same values
    assert stacked.data_ptr() != messages.data_ptr()
    torch.testing.assert_close(stacked, torch.stack(reordered), rtol=0, atol=0)
    mixed = list(messages[:4]) + [torch.randn(7)]  # a row from elsewhere (e.g. a crafted message)
    stacked, _ = stack_rows(mixed, 7, messages)
    torch.testing.assert_close(stacked, torch.stack(mixed), rtol=0, atol=0)
    short = list(messages[:4])  # a prefix of the matrix's rows is not the matrix
    stacked, _ = stack_rows(short, 7, messages)
    assert stacked.shape == (4, 7) and stacked.data_ptr() != messages.data_ptr()


def test_screening_keeps_finite_rows_of_the_right_width():
    from trustfl.engine import round_parts
    x = torch.randn(50, 9)
    x[3, 2], x[17, 0], x[49, 8] = float("nan"), float("inf"), -float("inf")
    x[20] = torch.finfo(torch.float32).max  # huge but finite: accepted
    assert round_parts.screen(x, 9).tolist() == [i not in (3, 17, 49) for i in range(50)]
    assert round_parts.screen(x, 8).tolist() == [False] * 50  # another model's width


def test_chunked_messages_are_written_into_one_matrix():
    fed = _fed(4, size=10)
    state = initial_state(fed)
    from trustfl.engine.round_parts import admit, broadcast, cohort_context, sample_cohort
    from trustfl.client.state import ClientStateStore
    plans, _, _ = admit(fed, 0, sample_cohort(fed, 0), {})
    received, _ = broadcast(fed, state, 0, len(plans))
    ctx = cohort_context(fed, 0, plans, received, ClientStateStore.from_state_dict({}))
    chunked = fed.executor.run(fed.local_job(), plans, ctx)
    whole = VectorizedExecutor(0).run(fed.local_job(), plans, ctx)
    assert chunked.updates.shape == whole.updates.shape == (10, fed.layout.numel)
    assert chunked.updates.is_contiguous() and chunked.num_steps == whole.num_steps
    torch.testing.assert_close(chunked.updates, whole.updates, rtol=1e-5, atol=1e-7)
