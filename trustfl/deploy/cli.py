"""``trustfl deploy app CONFIG --out DIR``: write a Flower app directory; ``trustfl deploy keys --clients N --out
DIR``: make the nodes' key pairs before the run, to pin them (docs/deployment.md)."""
from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    dep = sub.add_parser("deploy", help="deploy an experiment on real nodes with Flower")
    what = dep.add_subparsers(dest="deploy_command", required=True)
    app = what.add_parser("app", help="write a ready Flower app directory (then `flwr run DIR <connection>`)")
    app.add_argument("config", help="experiment TOML file")
    app.add_argument("--out", required=True, help="the app directory to write")
    app.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    app.add_argument("--run-dir", default="", help="where the server writes the run directory (default: DIR/run)")
    app.add_argument("--data-dir", default="", help="data directory of the server and nodes (default: as `run`)")
    app.set_defaults(func=run)
    keys = what.add_parser("keys", help="make every node's key pair before the run, so that each node can pin all "
                                        "public keys (node config key-file, public-keys)")
    keys.add_argument("--clients", type=int, required=True, help="the number of clients (data.num_clients)")
    keys.add_argument("--out", required=True, help="a new directory for node<k>.key and public_keys.toml")
    keys.set_defaults(func=make_keys)


def run(args: argparse.Namespace) -> int:
    from trustfl.deploy.app_dir import write_app

    out = write_app(args.config, args.out, args.set, run_dir=args.run_dir, data_dir=args.data_dir)
    print(f"Flower app written to {out}; run it with `flwr run {out} <connection> --stream` "
          f"(docs/deployment.md)", file=sys.stderr)
    return 0


def make_keys(args: argparse.Namespace) -> int:
    from trustfl.deploy.pinned import PUBLIC_FILE, write_keys

    out = write_keys(args.out, args.clients)
    print(f"{args.clients} key pair(s) written to {out}: give node k its node{{k}}.key (`key-file`, keep it secret) "
          f"and every node {PUBLIC_FILE} (`public-keys`), over a channel the server does not control "
          f"(docs/deployment.md)", file=sys.stderr)
    return 0
