"""Simulated Byzantine attacks (simulation only): update-level rules, label flipping and line-search variants.

Build by name: ``trustfl.build("attack", "alie")``. Registered names: ``sign_flip``, ``foe``, ``alie``, ``mimic``,
``gaussian``, ``inf``, ``nan``, ``label_flip`` (data level), ``alie_ls``, ``foe_ls``.
"""
from trustfl.attacks.base import AbstractAttack
from trustfl.attacks.data import LabelFlip, flip_labels
from trustfl.attacks.line_search import LineSearchAttack, alie_ls, foe_ls, line_maximize
from trustfl.attacks.update import (ALittleIsEnough, FallOfEmpires, GaussianAttack, InfAttack, Mimic, NanAttack,
                                    SignFlip, alie_vector, baruch_z)

__all__ = ["ALittleIsEnough", "AbstractAttack", "FallOfEmpires", "GaussianAttack", "InfAttack", "LabelFlip",
           "LineSearchAttack", "Mimic", "NanAttack", "SignFlip", "alie_ls", "alie_vector", "baruch_z", "foe_ls",
           "flip_labels", "line_maximize"]
