"""The ``trustfl`` command: run | validate | list | report | privacy."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from trustfl.errors import TrustFLError

_KINDS_SHOWN = ("dataset", "partitioner", "batch_sampler", "model", "objective", "evaluator", "algorithm",
                "engine", "executor", "gradient_method", "gradient_transform", "step_budget", "aggregator",
                "pre_aggregator", "attack", "client_stage", "server_stage", "server_optimizer", "downlink_stage")


def _cmd_run(args: argparse.Namespace) -> int:
    from trustfl.config.load import load_config
    from trustfl.experiment import run_experiment

    if args.resume:
        if args.config or args.set:
            raise TrustFLError("--resume takes its config from RUN_DIR/config.toml; drop CONFIG and --set.")
        result = run_experiment(None, resume=args.resume, data_dir=args.data_dir, progress=not args.quiet)
    else:
        if not args.config:
            raise TrustFLError("trustfl run needs a CONFIG file (or --resume RUN_DIR).")
        cfg = load_config(args.config, args.set)
        result = run_experiment(cfg, args.out, data_dir=args.data_dir, progress=not args.quiet)
    s = result.summary
    if "notice" in s:
        print(s["notice"])
    print(f"run directory: {result.run_dir}")
    primary = s.get("primary_metric", "accuracy")
    print(f"final {primary}: {s[f'final_{primary}']:.4f} (best {s[f'best_{primary}']:.4f}) after {s['rounds']} "
          f"rounds in {s['wall_time_s']:.1f} s")
    if "epsilon" in s and s["epsilon"]:
        eps = list(s["epsilon"].values())
        print(f"privacy: epsilon spent per client in [{min(eps):.3f}, {max(eps):.3f}] at delta = {s['delta']}")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from trustfl.config.build import build_federation
    from trustfl.config.load import load_config

    cfg = load_config(args.config, args.set)
    fed = build_federation(cfg, data_dir=args.data_dir)
    print(f"{args.config}: valid ({cfg.algorithm}, {fed.info['dataset']}, objective {fed.info['objective']}, "
          f"engine {cfg.engine.kind}, {fed.num_clients} clients, {fed.layout.numel} parameters, {cfg.rounds} rounds)")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from trustfl.core.registry import kinds, names

    for kind in [k for k in _KINDS_SHOWN if k in kinds()] + [k for k in kinds() if k not in _KINDS_SHOWN]:
        print(f"{kind}: {', '.join(names(kind))}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from trustfl.report.table import report_run

    print(report_run(args.run_dir))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trustfl", description="Trustworthy federated learning experiments.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an experiment from a TOML file")
    run.add_argument("config", nargs="?", help="experiment TOML file")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    run.add_argument("--out", help="run directory (default: runs/<name>-<dataset>-seed<seed>-<time>)")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its checkpoint")
    run.add_argument("--data-dir", help="directory of IDX data sets (default: $TRUSTFL_DATA or ~/.cache/trustfl)")
    run.add_argument("--quiet", action="store_true", help="no progress output")
    run.set_defaults(func=_cmd_run)
    val = sub.add_parser("validate", help="check a config and build the experiment without training")
    val.add_argument("config")
    val.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    val.add_argument("--data-dir")
    val.set_defaults(func=_cmd_validate)
    lst = sub.add_parser("list", help="every registered data set, partitioner, model, algorithm and stage")
    lst.set_defaults(func=_cmd_list)
    rep = sub.add_parser("report", help="re-plot a run directory and print its metrics table")
    rep.add_argument("run_dir")
    rep.set_defaults(func=_cmd_report)
    from trustfl import cli_privacy
    cli_privacy.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "privacy":
        from trustfl import cli_privacy
        return cli_privacy.run(args)
    try:
        return args.func(args)
    except TrustFLError as err:
        print(f"trustfl: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trustfl: interrupted (resume with `trustfl run --resume RUN_DIR`)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
