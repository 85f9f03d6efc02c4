"""Federated self-supervised learning parts: augmentations (views), FedSC's correlation matrices, FedCA's dictionary.

- :mod:`.augment`: batched augmentations and :func:`make_views` (V views of a batch, on its device).
- :mod:`.correlation`: R_j, DP-CalR (Algorithm 2 of the FedSC paper) and the server's :class:`CorrelationStore`.
- :mod:`.share` / :mod:`.dictionary`: the client statistics ``fedsc_correlation`` and ``fedca_dictionary``.

The SC loss itself is an objective (:mod:`trustfl.objectives.spectral`); its privacy math is in
:mod:`trustfl.privacy.analysis.fedsc`.
"""
from trustfl.selfsup.augment import Augmentation, make_views, make_views_cohort, view_generator
from trustfl.selfsup.correlation import CorrelationStore, add_matrix_noise, client_weights, correlation, dp_calr

__all__ = ["Augmentation", "CorrelationStore", "add_matrix_noise", "client_weights", "correlation", "dp_calr",
           "make_views", "make_views_cohort", "view_generator"]
