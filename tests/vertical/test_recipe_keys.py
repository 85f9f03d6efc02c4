"""Every ``[recipe]`` key of the vertical algorithms either changes the run or is refused by name.

Without ``recipe.epsilon`` there is no DP: ``embedding_clip`` was set to inf, ``release_count`` never read (not even
"bogus" was refused), ``delta`` and ``accountant`` trained bitwise the same (``delta`` still went into
run_info.json); DPZV's ``clip`` did nothing with ``clipping = false`` (``clip = -5`` was accepted).
"""
from __future__ import annotations

import math
import re

import pytest
import torch

from trustfl.config.build import build_federation
from trustfl.errors import ConfigError, TrustFLError
from trustfl.experiment import run_experiment
from trustfl.recipes.vertical import KEYS, PRIVACY_KEYS

pytestmark = pytest.mark.usefixtures("one_torch_thread")

OTHER = {"epsilon": 2.0, "delta": 1e-2, "accountant": "rdp", "smoothing": 1e-2, "clip": 0.5, "clipping": False,
         "difference": "two_lambda", "direction": "gaussian", "server_update": "zo", "embedding_smoothing": 1e-2,
         "embedding_clip": 0.05, "release_count": "all"}
"""A value away from each key's default."""
BASES = {"dpzv": [{}, {"epsilon": 1.0}, {"clipping": False}], "vafl": [{}, {"epsilon": 1.0}],
         "zoo_vfl": [{}, {"epsilon": 1.0}], "czofo": [{}, {"epsilon": 1.0}]}
BY_THE_DATA = {("dpzv", "clipping", ())}
"""``recipe.clipping = false`` over DPZV's default C = 10: these short runs' loss differences stay below C (it acts
on MNIST: benchmarks/dpzv.md); that it turns clipping off is asserted below."""


def _run(cfg, path):
    result = run_experiment(cfg, path, progress=False, plots=False)
    return result.params, [{k: v for k, v in row.items() if k != "wall_time_s"} for row in result.rows]


@pytest.mark.parametrize("algorithm", sorted(BASES))
def test_every_recipe_key_changes_the_run_or_is_refused(vertical_config, tmp_path, algorithm):
    silent = []
    for b, base in enumerate(BASES[algorithm]):
        small = {"rounds": 1, "engine__iterations_per_round": 12}
        params, rows = _run(vertical_config(algorithm, recipe=base, **small), tmp_path / f"{b}")
        for key in KEYS[algorithm] + PRIVACY_KEYS:
            if key in base:
                continue
            try:
                other = _run(vertical_config(algorithm, recipe={**base, key: OTHER[key]}, **small),
                             tmp_path / f"{b}-{key}")
            except TrustFLError:
                continue  # refused (the messages: below)
            if torch.equal(other[0], params) and other[1] == rows and \
                    (algorithm, key, tuple(base)) not in BY_THE_DATA:
                silent.append(f"recipe.{key} over {base}")
    assert not silent, f"set, accepted and without any effect: {silent}"


@pytest.mark.parametrize("algorithm, recipe, key, why", [
    ("vafl", {"embedding_clip": 0.5}, "embedding_clip", "the embeddings are sent unclipped and without noise"),
    ("zoo_vfl", {"embedding_clip": 0.5}, "embedding_clip", "the embeddings are sent unclipped"),
    ("czofo", {"release_count": "bogus"}, "release_count", "`recipe.epsilon` is not set"),
    ("vafl", {"release_count": "all"}, "release_count", "`recipe.epsilon` is not set"),
    ("dpzv", {"delta": 1e-3}, "delta", "the server's replies carry no noise"),
    ("dpzv", {"accountant": "rdp"}, "accountant", "no ledger is kept"),
    ("dpzv", {"clipping": False, "clip": -5}, "clip", "`recipe.clipping` is false"),
    ("dpzv", {"clipping": False, "clip": 10.0, "delta": 0.1}, "delta", "also `recipe.clip`"),
])
def test_a_key_another_key_turns_off_is_refused_by_name(vertical_config, algorithm, recipe, key, why):
    with pytest.raises(ConfigError, match=rf"^`recipe\.{key}` is set but does nothing: .*{re.escape(why)}[^\n]*\.$"):
        build_federation(vertical_config(algorithm, recipe=recipe), quiet=True)


def test_the_same_keys_build_with_epsilon_and_with_clipping(vertical_config):
    """The refusals are of the combination only: with ``recipe.epsilon`` each key is calibrated, with clipping
    ``recipe.clip`` is the bound, and ``clipping = false`` leaves the differences unclipped."""
    rec = {"epsilon": 1.0, "delta": 1e-2, "accountant": "gdp_clt", "embedding_clip": 0.5, "release_count": "all"}
    fed = build_federation(vertical_config("vafl", recipe=rec), quiet=True)
    assert fed.vertical.method.privacy.clip == 0.5 and fed.vertical.charge_all
    fed = build_federation(vertical_config("dpzv", recipe={"clipping": True, "clip": 3.0}), quiet=True)
    assert fed.vertical.method.clip == 3.0
    fed = build_federation(vertical_config("dpzv", recipe={"clipping": False}), quiet=True)
    assert fed.vertical.method.clip == math.inf
