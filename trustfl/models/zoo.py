"""The model zoo. Every model maps a batch ``(B, *input_shape)`` to logits ``(B, num_classes)``.

Models return **logits**; losses apply ``cross_entropy`` (= NLL of log-softmax, the CafCor paper's loss).
"""
from __future__ import annotations

import inspect
import itertools
import math
import numbers
from typing import Any, Callable, Sequence

import torch
from torch import nn

from trustfl.core.memory import refuse_beyond_free
from trustfl.core.registry import lookup, register, register_adapter
from trustfl.errors import ConfigError
from trustfl.models.pooling import max_pool2d


def check_input_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    """``input_shape`` as a tuple of positive integers (a ConfigError otherwise)."""
    shape = tuple(input_shape) if isinstance(input_shape, Sequence) and not isinstance(input_shape, str) else None
    if not shape or any(isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 1 for d in shape):
        raise ConfigError(f"`input_shape` must be a non-empty sequence of positive integers, found {input_shape!r}.")
    return tuple(int(d) for d in shape)


def check_outputs(num_classes: int) -> int:
    """``num_classes`` (the model's outputs) as a positive integer (a ConfigError otherwise)."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral) or num_classes < 1:
        raise ConfigError(f"`num_classes` (the model's outputs) must be a positive integer, found {num_classes!r}.")
    return int(num_classes)


def check_sizes(key: str, value: object, allow_empty: bool = False) -> list[int]:
    """``model.<key>``, a list of layer sizes, as a list of positive integers (a ConfigError naming the key
    otherwise: a bare number, a string, booleans or floats are refused, not iterated or passed to torch)."""
    sizes = list(value) if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) else None
    if sizes is None or (not sizes and not allow_empty) or any(
            isinstance(h, bool) or not isinstance(h, numbers.Integral) or h < 1 for h in sizes):
        hint = f" (write [{value}] for one layer)" if isinstance(value, numbers.Integral) and not isinstance(
            value, bool) else ""
        raise ConfigError(f"`model.{key}` must be a {'' if allow_empty else 'non-empty '}list of positive integers, "
                          f"found {value!r}{hint}.")
    return [int(h) for h in sizes]


def _features(input_shape: Sequence[int]) -> int:
    return int(math.prod(check_input_shape(input_shape)))


@register("model", "logreg")
class LogisticRegression(nn.Module):
    """Multinomial logistic regression: one linear layer on the flattened input."""

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(_features(input_shape), check_outputs(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))


@register("model", "mlp")
class MLP(nn.Module):
    """Fully connected ReLU network ``in → hidden[0] → … → num_classes``."""

    def __init__(self, input_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (200, 200)) -> None:
        super().__init__()
        sizes = [_features(input_shape), *check_sizes("hidden", hidden)]
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        layers.append(nn.Linear(sizes[-1], check_outputs(num_classes)))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


def _as_image(x: torch.Tensor, channels: int, side: int) -> torch.Tensor:
    return x.reshape(x.shape[0], channels, side, side)


@register("model", "cnn_cafcor")
class CafCorCNN(nn.Module):
    """CafCor's MNIST CNN (the paper's Sec. 5): conv 20 → conv 50 → fc 500 → fc 10; 431,080 parameters at 28×28.

    Conv2d(1,20,5) → ReLU → MaxPool(2) → Conv2d(20,50,5) → ReLU → MaxPool(2) → Linear(800,500) → ReLU →
    Linear(500,10). The paper gives only the parameter count; these layers are ByzFL's ``cnn_mnist``, which has
    exactly that count. The paper's log_softmax is applied by the cross-entropy loss.
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        self.channels, self.side = _image_geometry(input_shape, "cnn_cafcor")
        self.conv1 = nn.Conv2d(self.channels, 20, 5)
        self.conv2 = nn.Conv2d(20, 50, 5)
        flat = 50 * (((self.side - 4) // 2 - 4) // 2) ** 2
        self.fc1 = nn.Linear(flat, 500)
        self.fc2 = nn.Linear(500, check_outputs(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _as_image(x, self.channels, self.side)
        x = max_pool2d(torch.relu(self.conv1(x)), 2)
        x = max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


@register("model", "cnn_rhdp")
class RobustHDPCNN(nn.Module):
    """Robust-HDP's MNIST/FMNIST CNN (the paper's Table 5): 28,938 parameters at 28×28.

    Conv2d(1,16,5,pad 2) → ReLU → MaxPool(2) → Conv2d(16,32,5,pad 2) → ReLU → MaxPool(2) → Linear(1568,10).
    No ReLU on the output layer (the authors' code; Table 5's output ReLU is a typo).
    """

    def __init__(self, input_shape: Sequence[int], num_classes: int) -> None:
        super().__init__()
        self.channels, self.side = _image_geometry(input_shape, "cnn_rhdp")
        self.conv1 = nn.Conv2d(self.channels, 16, 5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.fc = nn.Linear(32 * (self.side // 4) ** 2, check_outputs(num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _as_image(x, self.channels, self.side)
        x = max_pool2d(torch.relu(self.conv1(x)), 2)
        x = max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def _image_geometry(input_shape: Sequence[int], name: str) -> tuple[int, int]:
    shape = check_input_shape(input_shape)
    if len(shape) == 3 and shape[1] == shape[2]:
        channels, side = shape[0], shape[1]
    elif len(shape) == 1 and math.isqrt(shape[0]) ** 2 == shape[0]:
        channels, side = 1, math.isqrt(shape[0])
    else:
        raise ConfigError(f"model {name!r} needs square images, found input shape {shape}.")
    if side < 16:
        raise ConfigError(f"model {name!r} needs images of side >= 16, found {side} (use 'mlp' or 'logreg' for "
                          f"small inputs such as digits).")
    return channels, side


def _imported_model(cls: Any, name: str) -> Callable[..., nn.Module]:
    """``model.name = "pkg.mod:Net"``: the class is called with the ``[model]`` table's arguments, plus
    ``input_shape`` and ``num_classes`` when its constructor takes them (or ``**kwargs``)."""
    if not callable(cls):
        raise ConfigError(f"model {name!r} is a {type(cls).__name__}, not a class or function building a module.")
    try:
        accepted = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        accepted = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())

    def factory(input_shape: tuple[int, ...], num_classes: int, **params: Any) -> nn.Module:
        given = {"input_shape": input_shape, "num_classes": num_classes}
        extra = {k: v for k, v in given.items() if takes_any or k in accepted}
        model = cls(**extra, **params)
        if not isinstance(model, nn.Module):
            raise ConfigError(f"model {name!r} built a {type(model).__name__}, not a torch.nn.Module.")
        return model
    return factory


register_adapter("model", _imported_model)


_DEFAULT_INIT = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
"""Layer types whose ``reset_parameters`` :func:`_reset_with` reproduces: U(±gain·√(3/fan_in)) weights with
``kaiming_uniform_(a=√5)``, then U(±1/√fan_in) biases."""


def _reset_with(module: nn.Module, generator: torch.Generator) -> None:
    """PyTorch's default initialisation of a Linear/Conv layer, drawn from ``generator`` (same calls, same order)."""
    with torch.no_grad():
        nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=generator)
        if module.bias is not None:
            fan_in = module.weight[0].numel()  # in_features, or in_channels/groups · kernel size
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            nn.init.uniform_(module.bias, -bound, bound, generator=generator)


def _has_state(module: nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False))


def build_model(name: str, input_shape: Sequence[int], num_classes: int, seed: int, **params: object) -> nn.Module:
    """Build a model with deterministic initial weights drawn from ``seed``; the global RNG is not used.

    A model of trustfl's own is built on the meta device (no values, no random draws); one whose weights and
    buffers would take more than the memory free on the CPU is refused there (a MemoryError). Its layers are then
    materialised on the CPU (tied parameters stay tied) and initialised in registration order from a
    ``torch.Generator`` seeded with ``seed``: the same draws, in the same order, as PyTorch's constructors make
    from ``torch.manual_seed(seed)``, so the weights are those of a model built under that seed (every model here
    registers its layers in the order it creates them). A model with an ``init_weights(generator)`` method then
    re-draws what it chooses from a generator of its own seeded with ``seed``. A model with a layer type outside
    :data:`_DEFAULT_INIT` holding parameters or buffers, and every model that is not trustfl's own (an import path
    or a plugin's), is built as written: its constructor runs on the CPU under ``seed`` inside
    ``torch.random.fork_rng`` (the global CPU RNG is restored afterwards), so what it sets itself (its own
    initialisation, tied parameters, sizes computed with tensors) is kept.
    """
    factory = lookup("model", name)

    def make() -> nn.Module:
        return factory(input_shape=tuple(input_shape), num_classes=num_classes, **params)

    if not _of_trustfl(factory):
        _refuse_beyond_free_if_known(make)
        return _built_under(seed, make)
    with torch.device("meta"):
        skeleton = make()
    refuse_beyond_free(sum(t.numel() * t.element_size() for t in itertools.chain(skeleton.parameters(),
                                                                                 skeleton.buffers())))
    stateful = [m for m in skeleton.modules() if _has_state(m)]
    if all(type(m) in _DEFAULT_INIT for m in stateful):
        ties = _tied_names(skeleton)
        # ``to_empty(device="cpu")`` with an ``empty`` that does not go through the meta tensor: torch.empty_like of
        # a meta tensor runs the Python reference, whose first call imports torch.fx's symbolic shapes and sympy
        # (about 0.5 s). Every value is drawn below, so only shapes and dtypes matter.
        model = skeleton._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device="cpu"))
        generator = torch.Generator(device="cpu").manual_seed(seed)
        for module in stateful:
            _reset_with(module, generator)
        _retie(model, ties)
        _custom_init(model, seed)
        return model
    return _built_under(seed, make)


def _of_trustfl(factory: object) -> bool:
    """Whether ``factory`` is one of trustfl's own model classes (whose constructors set nothing but the default
    initialisation), not an imported class or a plugin's."""
    return isinstance(factory, type) and factory.__module__.startswith("trustfl.")


def _refuse_beyond_free_if_known(make: Callable[[], nn.Module]) -> None:
    """The memory check before a model of your own is built, when its constructor also runs on the meta device (one
    that reads values, e.g. ``int(torch.tensor(shape).prod())``, cannot: it is then built without the check)."""
    try:
        with torch.device("meta"):
            skeleton = make()
    except Exception:  # the real build below runs the constructor again and reports its error
        return
    if isinstance(skeleton, nn.Module):
        refuse_beyond_free(sum(t.numel() * t.element_size() for t in itertools.chain(skeleton.parameters(),
                                                                                     skeleton.buffers())))


def _built_under(seed: int, make: Callable[[], nn.Module]) -> nn.Module:
    """The model ``make`` builds on the CPU with the global CPU RNG seeded with ``seed`` (restored afterwards)."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)
        model = make()
    _custom_init(model, seed)
    return model


def _tied_names(model: nn.Module) -> list[list[str]]:
    """The names of each parameter registered under more than one name (tied), first name first."""
    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    return [group for group in names.values() if len(group) > 1]


def _retie(model: nn.Module, ties: list[list[str]]) -> None:
    """Register each group of ``ties`` again as one parameter, the first name's (materialising made one per name)."""
    for first, *others in ties:
        shared = model.get_parameter(first)
        for n in others:
            owner, _, attr = n.rpartition(".")
            setattr(model.get_submodule(owner), attr, shared)


def _custom_init(model: nn.Module, seed: int) -> None:
    """A model's own initialisation, if it has one: ``model.init_weights(generator)`` after the default draws,
    from a CPU generator of its own seeded with ``seed`` (so layers it draws first, e.g. an encoder, get the same
    weights whatever heads the model adds after them)."""
    init_weights = getattr(model, "init_weights", None)
    if callable(init_weights):
        with torch.no_grad():
            init_weights(torch.Generator(device="cpu").manual_seed(seed))
