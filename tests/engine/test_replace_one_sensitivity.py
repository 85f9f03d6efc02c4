"""Per-example DP-SGD on batches drawn without replacement (the default ``shuffle`` sampler, and ``fixed``) is
accounted under replace-one adjacency, where swapping one example moves the clipped gradient sum by up to ``2C``.
The noise has std ``z·C``, so each step is the Gaussian mechanism of multiplier ``z/2`` for that relation.

The ledgers charged ``GaussianDpEvent(z)`` (sensitivity ``C``) and calibration picked ``z`` for it: a run at
``client.dp.epsilon = 3`` (digits, 10 clients, batch 32, 5 rounds) reported ε = 3.0 and spent ε = 7.2 under the
relation it reported. Checked here against dp_accounting directly, with the sensitivity ``2C``.
"""
import pytest
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from trustfl.config.build import build_federation
from trustfl.experiment import run_experiment

pytestmark = pytest.mark.usefixtures("one_torch_thread")
DELTA = 1e-5


def _replace_one_epsilon(noise_multiplier: float, n: int, b: int, steps: int) -> float:
    """ε at DELTA of ``steps`` DP-SGD steps with noise std ``noise_multiplier·C`` on the sum of ``b`` of ``n``
    examples' gradients clipped to ``C``, under replace-one adjacency (sensitivity 2C)."""
    gauss = dp_event.GaussianDpEvent(noise_multiplier / 2)
    step = gauss if b >= n else dp_event.SampledWithoutReplacementDpEvent(n, b, gauss)
    acc = rdp.RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_event.SelfComposedDpEvent(step, steps))
    return acc.get_epsilon(DELTA)


def _cfg(small_config, sampler: str, batch_size: int = 16, **dp):
    return small_config(rounds=2, cohort__size=8, client__batch_size=batch_size, client__batch_sampler=sampler,
                        client__momentum=0.0, client__dp={"mode": "per_example", "delta": DELTA, **dp})


@pytest.mark.parametrize("sampler", ["shuffle", "fixed"])
def test_a_calibrated_noise_multiplier_meets_the_budget_at_the_replace_one_sensitivity(small_config, sampler):
    fed = build_federation(_cfg(small_config, sampler, epsilon=3.0), quiet=True)
    assert fed.ledger.neighboring == "replace_one"
    for i, (n, b) in enumerate(zip(fed.client_rows.sizes(), fed.batch_sizes)):
        steps = fed.info["privacy"]["planned_steps"][i]
        assert _replace_one_epsilon(fed.noise_multipliers[i], n, min(b, n), steps) <= 3.0 * (1 + 1e-6)


def test_a_client_whose_batch_holds_all_its_rows_is_charged_the_replace_one_gaussian(small_config):
    """b >= n: no subsampling, and still sensitivity 2C under the ledger's replace-one relation."""
    fed = build_federation(_cfg(small_config, "shuffle", batch_size=10_000, epsilon=3.0), quiet=True)
    for i, n in enumerate(fed.client_rows.sizes()):
        steps = fed.info["privacy"]["planned_steps"][i]
        assert _replace_one_epsilon(fed.noise_multipliers[i], n, n, steps) <= 3.0 * (1 + 1e-6)


def test_the_ledger_of_a_run_reports_the_replace_one_epsilon_of_its_noise(small_config, tmp_path):
    cfg = _cfg(small_config, "fixed", noise_multiplier=2.0)
    result = run_experiment(cfg, tmp_path / "run", progress=False, plots=False)
    fed = build_federation(cfg, quiet=True)
    sizes, spent = fed.client_rows.sizes(), result.summary["epsilon"]
    assert spent  # every client took part (cohort.size = num_clients)
    for cid, eps in spent.items():
        n, steps = sizes[int(cid)], fed.info["privacy"]["planned_steps"][int(cid)]
        assert eps == pytest.approx(_replace_one_epsilon(2.0, n, min(fed.batch_sizes[int(cid)], n), steps),
                                    rel=1e-9)


@pytest.mark.parametrize("dp", [{"noise_multiplier": 1.0}, {"epsilon": 3.0}])
def test_an_accountant_that_cannot_analyse_the_sampling_is_refused_before_training(small_config, dp):
    """PLD cannot analyse sampling without replacement: refused at build, budget or not (a run without a budget
    was accepted by `trustfl validate` and failed in its first round, naming no key)."""
    from trustfl.errors import ConfigError

    with pytest.raises(ConfigError, match="client.dp.accountant"):
        build_federation(_cfg(small_config, "shuffle", accountant="pld", **dp), quiet=True)
