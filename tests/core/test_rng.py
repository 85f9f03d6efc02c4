"""Derived generators and ``run_draws``: same streams whether the draws run on threads or one after another."""
from __future__ import annotations

import multiprocessing
import threading

import pytest
import torch

import trustfl.core.rng as rng
from trustfl.core.rng import make_generator, run_draws


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _draws(out: dict[str, torch.Tensor], threads: set[int], fail: int | None = None):
    """One draw per client ``i``: its own generator, one tensor per name in order, into row ``i``."""
    gens = [make_generator(3, i, "noise") for i in range(next(iter(out.values())).shape[0])]

    def draw(i: int) -> None:
        threads.add(threading.get_ident())
        if i == fail:
            raise ValueError(f"draw {i} failed")
        for z in out.values():
            torch.randn(z.shape[1:], generator=gens[i], dtype=z.dtype, out=z[i])

    return [lambda i=i: draw(i) for i in range(len(gens))]


def _reference(m: int) -> dict[str, torch.Tensor]:
    out = {"w": torch.empty(m, 300, 250), "b": torch.empty(m, 7, dtype=torch.float64)}
    for i in range(m):
        gen = make_generator(3, i, "noise")
        for z in out.values():
            z[i] = torch.randn(z.shape[1:], generator=gen, dtype=z.dtype)
    return out


def test_threads_draw_every_client_stream_exactly(two_threads):
    m = 6
    out = {"w": torch.empty(m, 300, 250), "b": torch.empty(m, 7, dtype=torch.float64)}
    threads: set[int] = set()
    run_draws(_draws(out, threads), sum(z.numel() for z in out.values()), "cpu")
    assert threading.get_ident() not in threads  # above the size limit they ran on the pool
    want = _reference(m)
    assert all(torch.equal(out[k], want[k]) for k in out)


@pytest.mark.parametrize("case", ["small", "one_thread", "meta_device"])
def test_small_or_single_threaded_draws_stay_on_the_calling_thread(two_threads, case):
    m = 3
    out = {"w": torch.empty(m, 300, 250), "b": torch.empty(m, 7, dtype=torch.float64)}
    numel, device = sum(z.numel() for z in out.values()), "cpu"
    if case == "small":
        numel = rng.PARALLEL_DRAW_MIN - 1
    elif case == "one_thread":
        torch.set_num_threads(1)
    else:
        device = "meta"  # any device but the CPU: its kernels run in parallel already
    threads: set[int] = set()
    run_draws(_draws(out, threads), numel, device)
    assert threads == {threading.get_ident()}
    want = _reference(m)
    assert all(torch.equal(out[k], want[k]) for k in out)


def test_a_failed_draw_is_raised_after_every_other_draw_finished(two_threads):
    m = 5
    out = {"w": torch.zeros(m, 300, 250), "b": torch.zeros(m, 7, dtype=torch.float64)}
    with pytest.raises(ValueError, match="draw 2 failed"):
        run_draws(_draws(out, set(), fail=2), rng.PARALLEL_DRAW_MIN, "cpu")
    want = _reference(m)
    for i in (0, 1, 3, 4):
        assert torch.equal(out["w"][i], want["w"][i]) and torch.equal(out["b"][i], want["b"][i])
    assert not out["w"][2].any()


def _child_draws(queue) -> None:
    m = 4
    out = {"w": torch.empty(m, 300, 250), "b": torch.empty(m, 7, dtype=torch.float64)}
    torch.set_num_threads(2)
    threads: set[int] = set()
    run_draws(_draws(out, threads), sum(z.numel() for z in out.values()), "cpu")
    assert threading.get_ident() not in threads
    torch.set_num_threads(1)  # OpenMP's threads do not survive a fork either: the checks below stay on this one
    want = _reference(m)
    queue.put(all(torch.equal(out[k], want[k]) for k in out))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_a_forked_child_draws_on_its_own_pool(two_threads):
    out = {"w": torch.empty(2, 300, 250)}
    run_draws(_draws(out, set()), out["w"].numel(), "cpu")  # the parent's pool now exists
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_draws, args=(queue,))
    child.start()
    child.join(30)
    hung = child.is_alive()
    if hung:
        child.kill()
    assert not hung, "the forked child waited on its parent's pool threads, which a fork does not copy"
    assert child.exitcode == 0 and queue.get(timeout=5)
