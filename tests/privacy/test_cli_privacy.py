"""``trustfl privacy epsilon|calibrate``: outputs, --json and one-line errors with exit code 2."""
from __future__ import annotations

import argparse
import json
import random

import pytest

from trustfl.cli_privacy import add_parser, main, round_up_digits, run
from trustfl.privacy.analysis.gaussian import epsilon_subsampled_gaussian

EPS_ARGS = ["epsilon", "--noise-multiplier", "2.0", "--sample-rate", "1", "--steps", "10", "--delta", "1e-5"]


def test_epsilon_text_and_json(capsys):
    expected = epsilon_subsampled_gaussian(2.0, 1.0, 10, 1e-5)
    assert main(EPS_ARGS) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"epsilon = {expected:.6g} at delta = 1e-05")
    assert main(["privacy", *EPS_ARGS, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["epsilon"] == expected and data["accountant"] == "rdp"


def test_calibrate_json_round_trips(capsys):
    assert main(["calibrate", "--epsilon", "3", "--delta", "1e-5", "--sample-rate", "1", "--steps", "10",
                 "--json"]) == 0
    z = json.loads(capsys.readouterr().out)["noise_multiplier"]
    assert 3 - 1e-3 <= epsilon_subsampled_gaussian(z, 1.0, 10, 1e-5) <= 3
    assert main(["calibrate", "--epsilon", "3", "--delta", "1e-5", "--sample-rate", "1", "--steps", "10"]) == 0
    out = capsys.readouterr().out
    shown = out.split()[2]
    assert out.startswith(f"noise_multiplier = {shown} for epsilon = 3 at delta = 1e-05, which gives epsilon = ")
    assert float(shown) >= z and len(shown.replace(".", "")) <= 6
    assert float(out.split("which gives epsilon = ")[1].split()[0]) <= 3


def test_calibrated_value_shown_is_never_below_the_solution(capsys):
    # ε(σ) drops to 0 at σ ≈ 31622.84 here (dp_accounting's KL bound); the 6-digit value rounded to nearest
    # (31622.8) gives ε = 0.0035, far above the target, so the text must round up
    argv = ["calibrate", "--epsilon", "1e-300", "--delta", "1e-5", "--sample-rate", "0.1", "--steps", "10"]
    assert main([*argv, "--json"]) == 0
    z = json.loads(capsys.readouterr().out)["noise_multiplier"]
    assert epsilon_subsampled_gaussian(z, 0.1, 10, 1e-5) == 0.0 < epsilon_subsampled_gaussian(31622.8, 0.1, 10, 1e-5)
    assert main(argv) == 0
    shown = capsys.readouterr().out.split()[2]
    assert float(shown) >= z and epsilon_subsampled_gaussian(float(shown), 0.1, 10, 1e-5) == 0.0


def test_round_up_digits():
    rng = random.Random(0)
    for _ in range(2000):
        value = 10 ** rng.uniform(-4, 7)
        text = round_up_digits(value, 6)
        assert float(text) >= value and float(text) <= value * (1 + 1e-5)
        assert len(text.replace(".", "").lstrip("0").split("e")[0]) <= 6
    assert round_up_digits(31622.838488627916, 6) == "31622.9" and round_up_digits(2.5, 6) == "2.5"


@pytest.mark.parametrize("argv, needle", [
    (["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "10", "--delta", "1"], "--delta"),
    (["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "10", "--delta", "1.5"], "delta"),
    (["epsilon", "--noise-multiplier", "-1", "--sample-rate", "0.1", "--steps", "10", "--delta", "1e-5"],
     "noise_multiplier"),
    (["epsilon", "--noise-multiplier", "1", "--sample-rate", "1.5", "--steps", "10", "--delta", "1e-5"],
     "sample_rate"),
    (["epsilon", "--noise-multiplier", "abc", "--sample-rate", "0.1", "--steps", "10", "--delta", "1e-5"],
     "must be a number"),
    (["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "-3", "--delta", "1e-5"], "steps"),
    (["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1", "--delta", "1e-5"], "--steps"),
    (["calibrate", "--epsilon", "-2", "--delta", "1e-5", "--sample-rate", "0.1", "--steps", "10"], "epsilon"),
    (["calibrate", "--epsilon", "nan", "--delta", "1e-5", "--sample-rate", "0.1", "--steps", "10"], "epsilon"),
    (["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "10", "--delta", "1e-5",
      "--accountant", "pld", "--sampling", "without_replacement"], "SampledWithoutReplacementDpEvent"),
    (["bogus"], "invalid choice"),
])
def test_bad_arguments_give_one_line_and_exit_code_2(capsys, argv, needle):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("trustfl privacy")
    assert "Traceback" not in captured.err


def test_add_parser_plugs_into_another_cli(capsys):
    top = argparse.ArgumentParser(prog="trustfl")
    sub = top.add_subparsers(dest="command")
    add_parser(sub)
    args = top.parse_args(["privacy", *EPS_ARGS, "--json"])
    assert args.command == "privacy" and args.command_fn is run
    assert run(args) == 0
    assert "epsilon" in json.loads(capsys.readouterr().out)
