"""``trustfl privacy``: compute ε of a DP-SGD schedule, or calibrate its noise multiplier.

  trustfl privacy epsilon --noise-multiplier 1.1 --sample-rate 0.01 --steps 1000 --delta 1e-5 [--json]
  trustfl privacy calibrate --epsilon 2 --delta 1e-5 --sample-rate 0.01 --steps 1000 [--accountant pld]

Bad arguments print one line on stderr and exit with code 2 (never a traceback). Wire it into the main CLI
with :func:`add_parser` / :func:`run`; :func:`main` runs it stand-alone.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import types
from typing import Any, Callable, NoReturn, Optional, Sequence

from trustfl.errors import TrustFLError
# Only the constants: building the parser must not import dp_accounting (and scipy); `_run` imports the math.
from trustfl.privacy.analysis.gaussian import ACCOUNTANTS, SAMPLINGS

__all__ = ["add_parser", "main", "run"]


def _one_line_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def _patch(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    # argparse prints the usage block before the error; a one-line error is easier to read in logs.
    parser.error = types.MethodType(_one_line_error, parser)  # type: ignore[method-assign]
    return parser


def _number(name: str, check: Callable[[float], bool], allowed: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"`{name}` must be a number, found {text!r}.") from None
        if math.isnan(value) or not check(value):
            raise argparse.ArgumentTypeError(f"`{name}` must be {allowed}, found {text}.")
        return value

    parse.__name__ = name
    return parse


def _steps(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"`steps` must be an integer >= 1, found {text!r}.") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"`steps` must be an integer >= 1, found {text}.")
    return value


_DELTA = _number("delta", lambda v: 0 < v < 1, "in (0, 1)")
_RATE = _number("sample_rate", lambda v: 0 < v <= 1, "in (0, 1]")
_POSITIVE_Z = _number("noise_multiplier", lambda v: 0 < v < math.inf, "a finite number > 0")
_POSITIVE_EPS = _number("epsilon", lambda v: 0 < v < math.inf, "a finite number > 0")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sample-rate", type=_RATE, required=True, help="sampling rate q in (0, 1]; 1 = no sampling")
    p.add_argument("--steps", type=_steps, required=True, help="number of steps T")
    p.add_argument("--delta", type=_DELTA, required=True, help="target δ in (0, 1)")
    p.add_argument("--accountant", choices=ACCOUNTANTS, default="rdp", help="dp_accounting accountant")
    p.add_argument("--sampling", choices=SAMPLINGS, default="poisson",
                   help="how batches are drawn; without_replacement is replace-one adjacency, where the noise "
                        "multiplier is σ over the replace-one sensitivity (2C for DP-SGD's clipped sum: a "
                        "client.dp.noise_multiplier of 2z)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``privacy`` command (with ``epsilon`` and ``calibrate``) to an argparse subparsers object."""
    parser = _patch(subparsers.add_parser("privacy", help="compute ε or calibrate noise for DP-SGD",
                                          description=__doc__.splitlines()[0]))
    commands = parser.add_subparsers(dest="privacy_command", metavar="{epsilon,calibrate}")
    commands.required = True
    eps = _patch(commands.add_parser("epsilon", help="ε of a (subsampled) Gaussian schedule"))
    eps.add_argument("--noise-multiplier", type=_POSITIVE_Z, required=True, help="noise multiplier z = σ/C")
    _common(eps)
    cal = _patch(commands.add_parser("calibrate", help="noise multiplier reaching a target ε"))
    cal.add_argument("--epsilon", type=_POSITIVE_EPS, required=True, help="target ε")
    _common(cal)
    cal.add_argument("--tol", type=_number("tol", lambda v: 0 < v < 1, "in (0, 1)"), default=1e-4,
                     help="ε tolerance of the calibration (default 1e-4)")
    parser.set_defaults(command_fn=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Execute a parsed ``privacy`` command; returns the exit code (2 on a privacy/argument error)."""
    # dp_accounting logs (through absl) a warning per RDP order it skips; keep the command's output clean.
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        return _run(args)
    finally:
        absl_logger.setLevel(level)


def round_up_digits(value: float, digits: int) -> str:
    """``value`` written with ``digits`` significant digits, never below it (e.g. 31622.838 → ``"31622.9"``)."""
    text = f"{value:.{digits}g}"
    if float(text) < value:
        step = 10.0 ** (math.floor(math.log10(abs(float(text)))) - digits + 1)
        text = f"{float(text) + step:.{digits}g}"
    return text


def _run(args: argparse.Namespace) -> int:
    from trustfl.privacy.analysis.gaussian import calibrate_noise_multiplier, epsilon_subsampled_gaussian

    try:
        if args.privacy_command == "epsilon":
            value = epsilon_subsampled_gaussian(args.noise_multiplier, args.sample_rate, args.steps, args.delta,
                                                args.accountant, args.sampling)
            key, text = "epsilon", f"epsilon = {value:.6g} at delta = {args.delta:g}"
        else:
            value = calibrate_noise_multiplier(args.epsilon, args.delta, args.sample_rate, args.steps,
                                               args.accountant, args.sampling, args.tol)
            # shown rounded up (more noise), with the ε of the value shown: a rounded-down σ could overspend
            shown = round_up_digits(value, 6)
            spent = epsilon_subsampled_gaussian(float(shown), args.sample_rate, args.steps, args.delta,
                                                args.accountant, args.sampling)
            key, text = "noise_multiplier", f"noise_multiplier = {shown} for epsilon = {args.epsilon:g} " \
                                            f"at delta = {args.delta:g}, which gives epsilon = {spent:.6g}"
    except TrustFLError as exc:
        print(f"trustfl privacy {args.privacy_command}: error: {exc}".replace("\n", " "), file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({key: value, "accountant": args.accountant, "sampling": args.sampling}))
    else:
        print(f"{text} ({args.accountant} accountant, {args.sampling} sampling, q = {args.sample_rate:g}, "
              f"T = {args.steps})")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Stand-alone entry point: ``main(["privacy", "epsilon", ...])`` (the leading "privacy" is optional)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or args_list[0] != "privacy":
        args_list.insert(0, "privacy")
    top = _patch(argparse.ArgumentParser(prog="trustfl"))
    add_parser(top.add_subparsers(dest="command"))
    try:
        args = top.parse_args(args_list)
    except SystemExit as exc:  # argparse exits on --help (0) and on bad arguments (2, one line printed)
        return int(exc.code) if isinstance(exc.code, int) else 2
    try:
        return run(args)
    except KeyboardInterrupt:  # as the main command: one line, exit code 130
        print("trustfl privacy: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
