"""The ``trustfl`` command: run | sweep | compare | validate | list | report | privacy | deploy.

Errors: every error a user can cause (a bad config or flag, a missing data set, an exhausted privacy budget) is
a :class:`~trustfl.errors.TrustFLError`; the command prints it as one line, ``trustfl: error: <message>``, on
stderr and exits with code 2; so does a path argument given as ``''`` (which would stand for the working
directory). Ctrl-C exits with code 130 and one line; a stdout closed by its reader (``| head``) ends the command
quietly, with code 141. Anything else is a bug and keeps its traceback (exit code 1). Under torchrun (``RANK``
set) only rank 0 prints, errors included; every rank exits with the same code. A rank other than 0 that meets a
user error first waits (at most :data:`RANK0_GRACE_S`) before it exits: torchrun stops every rank as soon as one
exits, which could stop rank 0 before it printed the error.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn, Sequence

from trustfl.core.openmp import limit_openmp_spin
from trustfl.core.paths import looked_up
from trustfl.errors import TrustFLError, UsageError

EXIT_USER_ERROR = 2
_DEVICE_HELP = "set engine.device: cpu, cuda, cuda:N or auto (cuda when present, else cpu)"
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143
"""128 + SIGTERM: a scheduler (or `kill`) stopped the command; handled as Ctrl-C is, with its own exit code."""
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: the reader of stdout went away (``trustfl report RUN | head -1``); the command stops quietly."""
RANK0_GRACE_S = 20.0
"""How long a torchrun rank other than 0 waits, after a user error, for rank 0 to report it and exit."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so that the run unwinds (progress bar, lock, TensorBoard) and the
    CLI says how to resume, as for Ctrl-C."""


def _on_sigterm(signum: int, frame: object) -> NoReturn:
    raise Terminated


_KINDS_SHOWN = ("dataset", "partitioner", "batch_sampler", "model", "objective", "evaluator", "algorithm",
                "engine", "executor", "gradient_method", "gradient_transform", "step_budget", "aggregator",
                "pre_aggregator", "attack", "client_stage", "server_stage", "server_optimizer", "downlink_stage")


def _cmd_run(args: argparse.Namespace) -> int:
    from trustfl.config.load import load_config
    from trustfl.experiment import run_experiment

    if args.resume:
        if args.config or args.set or args.out or args.overwrite or args.imports:
            raise UsageError("--resume takes its config (and the plugins it imports) from RUN_DIR/config.toml and "
                             "writes to RUN_DIR; drop CONFIG, --set, --out, --overwrite and --import.")
        resume = looked_up(args.resume, "--resume: run directory", UsageError)
        if not resume.is_dir():
            raise UsageError(f"--resume: run directory {args.resume!r} "
                             f"{'is a file, not a directory' if resume.exists() else 'does not exist'}.")
        result = run_experiment(None, resume=args.resume, data_dir=args.data_dir, progress=not args.quiet,
                                device=args.device)
    else:
        if not args.config:
            raise UsageError("trustfl run needs a CONFIG file (or --resume RUN_DIR).")
        cfg = _with_imports(load_config(args.config, _with_device(args.set, args.device)), args.imports)
        if args.out and _rank() == 0:
            _make_run_dir(args.out, args.overwrite)
        result = run_experiment(cfg, args.out, data_dir=args.data_dir, progress=not args.quiet)
    s = result.summary
    if _rank() != 0:  # torchrun: rank 0 reports
        return 0
    if "notice" in s:
        print(s["notice"])
    print(f"run directory: {result.run_dir}")
    primary = s.get("primary_metric", "accuracy")
    print(f"final {primary}: {_number(s.get(f'final_{primary}'))} (best {_number(s.get(f'best_{primary}'))}) after "
          f"{s['rounds']} rounds in {s['wall_time_s']:.1f} s")
    if s.get("rounds_all_rejected"):
        print(f"warning: every message was rejected in {s['rounds_all_rejected']} of {s['rounds']} rounds (the model "
              f"did not move in them): see `rejected` in metrics.jsonl", file=sys.stderr)
    if s.get("rounds_skipped"):
        print(f"warning: {s['rounds_skipped']} of {s['rounds']} rounds were skipped, too few of their messages "
              f"passing screening for the aggregator (the model did not move in them): see `skipped` in "
              f"metrics.jsonl", file=sys.stderr)
    if s.get("rounds_diverged"):
        print(f"warning: in {s['rounds_diverged']} of {s['rounds']} rounds the server's step would have made the model "
              f"non-finite (too large a server learning rate: `server.lr`, a recipe's `server_lr`), and the model "
              f"did not move in them: see `diverged` in metrics.jsonl", file=sys.stderr)
    if "epsilon" in s and s["epsilon"]:
        eps = list(s["epsilon"].values())
        print(f"privacy: epsilon spent per client in [{min(eps):.3f}, {max(eps):.3f}] at delta = {s['delta']}")
    return 0


def _number(value: object) -> str:
    """A metric as the summary line shows it: 4 decimals, or nan where none is a number (a diverged run's)."""
    return f"{value:.4f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "nan"


def _with_device(overrides: list[str], device: str | None) -> list[str]:
    """``--device DEVICE``: the override ``engine.device = DEVICE``, after (so winning over) any ``--set``."""
    if device is None:
        return list(overrides)
    import json
    return [*overrides, f"engine.device={json.dumps(device)}"]


def _rank() -> int:
    """This process's torchrun rank (``RANK``; 0 outside torchrun): only rank 0 prints."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _with_imports(cfg, imports: list[str]):
    """``--import MODULE``: add to the config's ``plugins`` (kept in the run's config.toml, so a resume imports them
    too)."""
    if not imports:
        return cfg
    import dataclasses
    return dataclasses.replace(cfg, plugins=[*cfg.plugins, *(m for m in imports if m not in cfg.plugins)])


def _make_run_dir(out: str, overwrite: bool = False) -> None:
    """Create ``--out`` now, so that an unusable path, or one that holds another run (unless ``overwrite``), is a
    one-line error before the experiment is built."""
    from trustfl.core.runfiles import check_out_dir, hold_run_dir, run_files_in, writing

    path = check_out_dir(out)
    held = run_files_in(path)
    if held and not overwrite:
        raise UsageError(f"--out {out!r} already holds a run ({', '.join(held)}): continue it with `trustfl run "
                         f"--resume {out}`, or pass --overwrite to start afresh there.")
    if held:  # the old run's files go (its checkpoint: a later --resume must not continue the run this one replaces)
        with hold_run_dir(path), writing(path):  # unless a running process writes the run there
            _remove_run(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"--out: cannot create run directory {out!r}: {err.strerror or err}.") from None


def _remove_run(path: Path) -> None:
    """Remove what a trustfl run wrote in ``path`` (:data:`~trustfl.core.runfiles.WRITTEN`, the plots of the metrics
    its summary.json or run_info.json names, ``tensorboard/``); other files stay."""
    import shutil

    from trustfl.core.runfiles import WRITTEN, read_json_object
    from trustfl.errors import TrustFLError
    from trustfl.report.plots import plot_files

    metrics: list[str] = []
    for name, key in (("summary.json", "metrics"), ("run_info.json", "evaluators")):
        try:  # a damaged file is removed all the same
            metrics += read_json_object(path / name, {key: list}).get(key) or []
        except TrustFLError:
            pass
    for name in [*WRITTEN, *plot_files(metrics)]:
        (path / name).unlink(missing_ok=True)
    board = path / "tensorboard"
    if board.is_dir() and not board.is_symlink():
        shutil.rmtree(board)
    else:
        board.unlink(missing_ok=True)


def _cmd_sweep(args: argparse.Namespace) -> int:
    from trustfl.report.sweep import run_sweep

    if os.environ.get("WORLD_SIZE", "1").strip() not in ("", "1"):
        raise UsageError("trustfl sweep does not run under torchrun (WORLD_SIZE > 1): run each point with "
                         "`torchrun ... -m trustfl run CONFIG --set KEY=VALUE`, or the sweep in one process.")

    result = run_sweep(args.config, args.grid, args.seeds, out=args.out, overrides=args.set, jobs=args.jobs,
                       threads=args.threads, data_dir=args.data_dir)
    hint = f"; compare with `trustfl compare {result.out}`" if result.done or result.skipped else ""
    print(f"sweep: {len(result.done)} run, {len(result.skipped)} finished earlier, {len(result.failed)} failed{hint}")
    return 0 if result.ok else 1


def _cmd_compare(args: argparse.Namespace) -> int:
    from trustfl.report.compare import compare_runs

    result = compare_runs(args.runs, out=args.out, plots=not args.no_plots, metric=args.metric, ignore=args.ignore)
    print(result.markdown)
    if result.skipped:
        print(f"\nleft out (no metrics yet): {', '.join(result.skipped)}")
    if result.unfinished:
        print(f"\nleft out (unfinished): {'; '.join(result.unfinished)}")
    if result.incomplete:
        print(f"\nleft out (rows missing): {'; '.join(result.incomplete)}")
    for notice in result.notices:
        print(f"warning: {notice}", file=sys.stderr)
    where = sorted({str(f.parent) for f in result.files})
    print(f"\nwrote {', '.join(f.name for f in result.files)} to {', '.join(where)}")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from trustfl.config.build import build_federation
    from trustfl.config.load import load_config

    cfg = _with_imports(load_config(args.config, _with_device(args.set, args.device)), args.imports)
    fed = build_federation(cfg, data_dir=args.data_dir)
    if cfg.report.tensorboard:  # the run's first check beyond the federation: the optional package is there
        from trustfl.experiment import summary_writer
        summary_writer()
    who = (f"{fed.vertical.num_parties} parties" if fed.vertical is not None else f"{fed.num_clients} clients")
    print(f"{args.config}: valid ({cfg.algorithm}, {fed.info['dataset']}, objective {fed.info['objective']}, "
          f"engine {fed.info['engine']}, {who}, {fed.layout.numel} parameters, {cfg.rounds} rounds)")
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


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block), exit code 2, like every other trustfl error."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trustfl", description="Trustworthy federated learning experiments.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an experiment from a TOML file")
    run.add_argument("config", nargs="?", help="experiment TOML file")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    run.add_argument("--out", help="run directory (default: runs/<name>-<dataset>-seed<seed>-<time>)")
    run.add_argument("--overwrite", action="store_true",
                     help="with --out: start afresh in a directory that already holds a run (the files trustfl "
                          "wrote there are removed first; other files stay)")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run from its checkpoint")
    run.add_argument("--data-dir", help="directory of IDX data sets (default: $TRUSTFL_DATA or ~/.cache/trustfl)")
    run.add_argument("--quiet", action="store_true", help="no progress output")
    run.add_argument("--device", help=_DEVICE_HELP + "; with --resume, where the resumed run continues")
    run.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                     help="import a module (name or .py path) that registers your parts, like `plugins` (kept "
                          "in the run's config.toml, so --resume imports it again)")
    run.set_defaults(func=_cmd_run)
    swp = sub.add_parser("sweep", help="run a config over a grid of values x seeds, one run directory per point")
    swp.add_argument("config", help="experiment TOML file")
    swp.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                     help="values of a config key (TOML values, like --set); repeat for a Cartesian product")
    swp.add_argument("--seeds", help="seeds, e.g. 0-2 or 0,3,5 (default: the config's seed)")
    swp.add_argument("--out", required=True, help="sweep directory: sweep.json and one run directory per point; "
                                                  "re-running the same command resumes the sweep")
    swp.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key in every point")
    swp.add_argument("--jobs", type=int, default=1, help="points run at once, in worker processes (default 1)")
    swp.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1; 0: torch's default)")
    swp.add_argument("--data-dir", help="directory of IDX data sets (default: $TRUSTFL_DATA or ~/.cache/trustfl)")
    swp.set_defaults(func=_cmd_sweep)
    cmp = sub.add_parser("compare", help="compare runs: mean ± std over seeds per setting, table and plots")
    cmp.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories, or a sweep directory")
    cmp.add_argument("--out", help="where compare.md, compare.csv and the plots go (default: the sweep "
                                   "directory, else the working directory)")
    cmp.add_argument("--metric", help="metric of the plots (default: primary metric, accuracy, or the first)")
    cmp.add_argument("--ignore", action="append", default=[], metavar="KEY",
                     help="a config key that does not define a group (seed, name, data.data_dir always)")
    cmp.add_argument("--no-plots", action="store_true", help="only the table")
    cmp.set_defaults(func=_cmd_compare)
    val = sub.add_parser("validate", help="check a config and build the experiment without training")
    val.add_argument("config")
    val.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    val.add_argument("--data-dir")
    val.add_argument("--device", help=_DEVICE_HELP)
    val.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                     help="import a module (name or .py path) that registers your parts, like `plugins`")
    val.set_defaults(func=_cmd_validate)
    lst = sub.add_parser("list", help="every registered data set, partitioner, model, algorithm and stage")
    lst.set_defaults(func=_cmd_list)
    rep = sub.add_parser("report", help="re-plot a run directory and print its metrics table")
    rep.add_argument("run_dir")
    rep.set_defaults(func=_cmd_report)
    from trustfl import cli_privacy
    cli_privacy.add_parser(sub)
    from trustfl.deploy import cli as deploy_cli
    deploy_cli.add_parser(sub)
    return parser


def _one_line(err: BaseException) -> str:
    """The message on one line (a wrapped library message may hold newlines)."""
    return re.sub(r"\s*\n\s*", " ", str(err)).strip() or type(err).__name__


_PATH_ARGS = ("config", "out", "resume", "run_dir", "runs", "data_dir")
"""The destinations of the arguments that name a file or directory: none may be the empty string."""


def _refuse_empty_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (UsageError naming the flag) a path argument of the command given as ``''``: ``Path('')`` is the
    working directory, where ``--out ''`` would write over a run and ``--resume ''`` read as no --resume. An
    argument whose default is ``''`` (``deploy app --run-dir``: the default place) takes it as that default."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                _refuse_empty_paths(chosen, args)
        elif action.dest in _PATH_ARGS and action.default != "":
            value = getattr(args, action.dest, None)
            if value == "" or isinstance(value, list) and "" in value:
                flag = max(action.option_strings, key=len, default="") or action.metavar or action.dest.upper()
                what = "file" if action.dest == "config" else "directory"
                raise UsageError(f"{flag} is an empty path: name the {what}" +
                                 (" (`.` for the working directory)." if what == "directory" else "."))


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on it)."""
    try:
        import select
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll (Windows), no file descriptor (a test's capture)
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns the exit code: 0, 2 (a user error, one line on stderr), 130 (interrupted: Ctrl-C),
    141 (stdout closed by its reader: quietly) or 143 (terminated: SIGTERM, e.g. a cluster's scheduler).

    Only :class:`TrustFLError` is caught: any other exception is a bug and propagates with its traceback.
    """
    limit_openmp_spin()  # before any command imports torch (see trustfl.core.openmp)
    command, run_dir = None, "RUN_DIR"
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        command = args.command
        _refuse_empty_paths(parser, args)
        run_dir = getattr(args, "out", None) or getattr(args, "resume", None) or run_dir
        if command == "privacy":
            from trustfl import cli_privacy
            code = cli_privacy.run(args)
        else:
            code = args.func(args)
        sys.stdout.flush()  # here, where a closed stdout is caught, not at exit
        return code
    except BrokenPipeError:
        if not _stdout_closed():  # another pipe (a worker's): a bug, with its traceback
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush finds nowhere to fail
        return EXIT_BROKEN_PIPE
    except TrustFLError as err:
        if _rank() == 0:  # torchrun: every rank meets the same error; rank 0 says it, the others exit quietly
            print(f"trustfl: error: {_one_line(err)}", file=sys.stderr)
        else:  # ... after rank 0 (torchrun ends this rank when rank 0 exits): exiting first could stop rank 0
            try:  # before it printed; a rank 0 that never meets the error costs this wait
                time.sleep(RANK0_GRACE_S)
            except KeyboardInterrupt:  # torchrun's SIGTERM once rank 0 has exited: the wait is over, quietly
                pass
        return EXIT_USER_ERROR
    except KeyboardInterrupt as err:
        hint = ""
        if command == "run":  # a directory without its config.toml (not made yet, or only locked) resumes nothing
            started = run_dir == "RUN_DIR" or (Path(run_dir) / "config.toml").is_file()
            hint = f" (resume with `trustfl run --resume {run_dir}`)" if started else \
                " before the run wrote its config.toml (run the same command again to start it)"
        if command == "sweep":
            hint = " (re-run the same command to resume the sweep)"
        terminated = isinstance(err, Terminated)
        if _rank() == 0:
            print(f"trustfl: {'terminated' if terminated else 'interrupted'}{hint}", file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
