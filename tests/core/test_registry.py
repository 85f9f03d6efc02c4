"""The public registry (``trustfl.build``, ``lookup``, ``register``): a caller's mistake is a TrustFLError that says
what the component takes, never a TypeError or a torch RuntimeError from deep inside."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import trustfl
from trustfl.core import registry
from trustfl.errors import ConfigError, RegistryError


@pytest.mark.parametrize("kind, name, params, error, fragment", [
    ("aggregator", 5, {}, RegistryError, "The aggregator name must be a string, found 5; valid names: caf"),
    ("aggregator", None, {}, RegistryError, "must be a string, found None"),
    ("aggregator", "cwtm", {"f": 1, "bogus": 1}, ConfigError,
     "aggregator 'cwtm': got an unexpected keyword argument 'bogus'; it takes f"),
    ("aggregator", "cwtm", {}, ConfigError, "missing a required argument: 'f'"),
    ("objective", "cross_entropy", {"weight": 1.0}, ConfigError, "it takes no parameters"),
    ("dataset", "digits", {"nope": 1}, ConfigError, "it takes data_dir, seed, max_train, max_test"),
    ("model", "mlp", {"num_classes": 3}, ConfigError, "missing a required argument: 'input_shape'"),
])
def test_build_refuses_what_the_component_does_not_take(kind, name, params, error, fragment):
    with pytest.raises(error) as err:
        trustfl.build(kind, name, **params)
    assert fragment in str(err.value)


@pytest.mark.parametrize("name, shape, classes, fragment", [
    ("mlp", (0,), 10, "`input_shape` must be"), ("mlp", (-1,), 10, "`input_shape` must be"),
    ("mlp", 5, 3, "`input_shape` must be"), ("mlp", (), 3, "`input_shape` must be"),
    ("mlp", (5,), -3, "`num_classes`"), ("logreg", (3,), True, "`num_classes`"), ("logreg", (3,), 0, "`num_classes`"),
    ("cnn_cafcor", (0, 28, 28), 10, "`input_shape` must be"), ("cnn_rhdp", (1, 28, 28), 0, "`num_classes`"),
    ("sc_mlp", (0, 3), 0, "`input_shape` must be"), ("sc_cnn", (1, -8, 8), 0, "`input_shape` must be"),
])
def test_models_refuse_shapes_they_cannot_have(name, shape, classes, fragment):
    with pytest.raises(ConfigError, match=fragment):
        trustfl.build("model", name, input_shape=shape, num_classes=classes)


def test_models_take_numpy_and_torch_sizes():
    a = trustfl.build("model", "mlp", input_shape=(np.int64(4),), num_classes=np.int64(3), hidden=[5])
    b = trustfl.build("model", "mlp", input_shape=torch.Size([4]), num_classes=3, hidden=[5])
    assert [p.shape for p in a.parameters()] == [p.shape for p in b.parameters()] == [(5, 4), (5,), (3, 5), (3,)]


@pytest.mark.parametrize("kind, name", [("aggregator", ""), ("", "x"), (None, "x"), ("aggregator", 3), ("a", "  ")])
def test_register_refuses_empty_or_non_string_names(kind, name):
    with pytest.raises(RegistryError, match="must be a non-empty string"):
        registry.register(kind, name)
    assert "" not in registry.kinds()


@pytest.mark.parametrize("kind, name, params, fragment", [
    ("attack", "alie_ls", {"aggregator_params": True}, "attack 'alie_ls' with {'aggregator_params': True}"),
    ("server_optimizer", "sgd", {"lr": "x"}, "server_optimizer 'sgd'"),
    ("evaluator", "class_accuracy", {"classes": 3.5}, "evaluator 'class_accuracy'"),
    ("model", "vertical", {"input_shape": (4,), "num_classes": 2, "blocks": 2}, "`blocks` must be a non-empty list"),
    ("model", "vertical", {"input_shape": (4,), "num_classes": 2, "blocks": [[0, 9]]}, r"column indices in \[0, 4\)"),
    ("objective", "spectral_contrastive", {"reference": (1,)}, "`reference` must be an \\(H, H\\) tensor"),
])
def test_build_turns_ill_typed_parameters_into_config_errors(kind, name, params, fragment):
    # a config reports these with the key (build_component); the Python API said TypeError / KeyError / AttributeError
    with pytest.raises(ConfigError, match=fragment):
        trustfl.build(kind, name, **params)


def _scalar_parameters():
    """(kind, name, key, type, optional) of every registered factory's parameter annotated bool, int or float (or
    that or None) that can be set alone (every other parameter has a default)."""
    cases = []
    for kind in trustfl.kinds():
        for name in trustfl.names(kind):
            try:
                signature = registry.inspect.signature(trustfl.lookup(kind, name))
            except (TypeError, ValueError):
                continue
            for key, p in signature.parameters.items():
                annotation = p.annotation.__name__ if isinstance(p.annotation, type) else p.annotation
                base = annotation.removesuffix(" | None") if isinstance(annotation, str) else None
                others_default = all(q.default is not q.empty or q.kind in (q.VAR_KEYWORD, q.VAR_POSITIONAL)
                                     for k, q in signature.parameters.items() if k != key)
                if base in ("bool", "int", "float") and others_default:
                    cases.append((kind, name, key, base, annotation != base))
    return cases


SCALAR_PARAMETERS = _scalar_parameters()


def test_the_scalar_type_check_covers_many_parameters():
    assert len(SCALAR_PARAMETERS) > 60 and {c[3] for c in SCALAR_PARAMETERS} == {"bool", "int", "float"}
    assert ("aggregator", "weiavg", "per_client_metrics", "bool", False) in SCALAR_PARAMETERS
    assert ("attack", "gaussian", "around_honest_mean", "bool", False) in SCALAR_PARAMETERS


@pytest.mark.parametrize("kind, name, key, annotation, optional", SCALAR_PARAMETERS)
def test_a_value_of_another_type_is_refused_naming_the_key(kind, name, key, annotation, optional):
    # '3' and True for a number, 1 and '3' for a flag: a factory that does not check its flags (per_client_metrics)
    # or its numbers' types (alie_ls's start) took them
    bad_values = ["3", 1] if annotation == "bool" else ["3", True]
    for bad in bad_values + ([] if optional else [None]):
        with pytest.raises(ConfigError, match=f"^{kind} '{name}': `{key}` must be "):
            trustfl.build(kind, name, **{key: bad})


def test_register_refuses_a_kind_no_run_reads_suggesting_the_close_one():
    """`register("aggregatr", ...)` was accepted and never built: the rule of that name stayed unknown."""
    with pytest.raises(RegistryError, match=r"^register\(\): no part of a run is of kind 'aggregatr' \(did you mean "
                                            r"'aggregator'\?\); the kinds: aggregator, algorithm, "):
        registry.register("aggregatr", "mine")
    assert "aggregatr" not in registry.kinds()
    for kind in registry.KINDS:  # every kind the library registers or builds is one of them
        registry.names(kind)
    assert set(registry.kinds()) <= set(registry.KINDS)
