"""Mini-batch clipping (``client.dp.mode = "batch_clip"``) clips the batch *mean* to ``C`` and adds noise of std
``z·C`` to it. Adding, removing or replacing one example can move that clipped mean anywhere in the ball of radius
``C``, so by up to ``2C`` (the method's own docstring: user-level sensitivity ``2C``; CafCor's Lemma A.4): each step
is the Gaussian mechanism of multiplier ``z/2``, unamplified (the whole batch is released, not a sample of it).

The ledgers charged ``GaussianDpEvent(z)`` (sensitivity ``C``) and calibration picked ``z`` for it, so a run
reported a quarter of the RDP its noise gives. Checked here against dp_accounting directly.
"""
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from trustfl.config.build import build_federation
from trustfl.experiment import run_experiment
from trustfl.privacy.analysis.gaussian import DEFAULT_RDP_ORDERS

pytestmark = pytest.mark.usefixtures("one_torch_thread")
DELTA = 1e-5


def _epsilon(noise_multiplier: float, steps: int) -> float:
    """ε at DELTA of ``steps`` releases of a mean clipped to ``C`` with noise std ``noise_multiplier·C``
    (sensitivity 2C), by dp_accounting's RDP accountant at the ledgers' integer orders."""
    acc = rdp.RdpAccountant(list(DEFAULT_RDP_ORDERS))
    acc.compose(dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(noise_multiplier / 2), steps))
    return acc.get_epsilon(DELTA)


def _cfg(small_config, **dp):
    return small_config(rounds=2, cohort__size=8, client__batch_size=16, client__batch_sampler="fixed",
                        client__steps=2, client__momentum=0.0,
                        client__dp={"mode": "batch_clip", "delta": DELTA, **dp})


def test_a_calibrated_noise_multiplier_meets_the_budget_at_sensitivity_2c(small_config):
    fed = build_federation(_cfg(small_config, epsilon=3.0), quiet=True)
    for i, z in enumerate(fed.noise_multipliers):
        assert _epsilon(z, fed.info["privacy"]["planned_steps"][i]) <= 3.0 * (1 + 1e-6)


def test_the_ledger_of_a_run_reports_the_epsilon_of_its_noise_at_sensitivity_2c(small_config, tmp_path):
    cfg = _cfg(small_config, noise_multiplier=4.0)
    result = run_experiment(cfg, tmp_path / "run", progress=False, plots=False)
    fed = build_federation(cfg, quiet=True)
    spent = result.summary["epsilon"]
    assert spent
    for cid, eps in spent.items():
        assert eps == pytest.approx(_epsilon(4.0, fed.info["privacy"]["planned_steps"][int(cid)]), rel=1e-9)
