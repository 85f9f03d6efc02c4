"""The activation schedule's arguments: refused with a ConfigError naming them, never a raw error or a count vector of
the wrong length."""
import pytest
import torch

from trustfl.errors import ConfigError
from trustfl.vertical.activation import activation_order, releases_per_party


@pytest.mark.parametrize("kind", ["shuffled", "uniform", "clock"])
def test_no_parties_is_refused_naming_the_argument(kind):
    with pytest.raises(ConfigError, match="num_parties"):
        activation_order(kind, 0, 2, 1, 0)


def test_an_empty_schedule_is_empty():
    assert activation_order("shuffled", 3, 0, 4, 0)[0].shape == (0,)
    assert activation_order("shuffled", 3, 2, 0, 0)[0].shape == (0,)
    with pytest.raises(ConfigError, match="rounds"):
        activation_order("shuffled", 3, -1, 4, 0)


@pytest.mark.parametrize("parties", [torch.tensor([-1]), torch.tensor([0, 5]), torch.tensor([[0, 1]]),
                                     torch.tensor([0.0, 1.0]), [0, 1]])
def test_releases_per_party_refuses_ids_outside_the_parties(parties):
    with pytest.raises(ConfigError, match="parties"):
        releases_per_party(parties, 2)


def test_releases_per_party_counts_every_party():
    assert releases_per_party(torch.tensor([0, 1, 1, 0, 1]), 3).tolist() == [2, 3, 0]
    assert releases_per_party(torch.zeros(0, dtype=torch.long), 2).tolist() == [0, 0]
    with pytest.raises(ConfigError, match="num_parties"):
        releases_per_party(torch.tensor([0]), 0)
