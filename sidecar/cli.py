"""`kvloop sidecar`: the feedback coordinator with its HTTP app (argument parsing only; light)."""

from __future__ import annotations

import argparse


def add_sidecar_parser(sub) -> None:
    from kvloop.sidecar.settings import LAWS

    p = sub.add_parser("sidecar", help="run the feedback coordinator (the pod's sidecar)")
    p.add_argument("--config", default=None, help="settings file (YAML or JSON), reloaded when it changes")
    p.add_argument("--control", default=None,
                   help="control block file (default: the settings', else /dev/shm)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=9090)
    p.add_argument("--mode", default=None, choices=("off", "observe", "enforce"),
                   help="override the settings' mode")
    p.add_argument("--period", type=float, default=None, help="override the settings' period in seconds")
    p.add_argument("--law", default=None, choices=LAWS,
                   help="override the settings' law (the trials' and the bandit's parameters: the settings "
                        "file's trial and bandit keys)")
    p.add_argument("--speculation-cap", type=int, default=None, metavar="N",
                   help="write this speculation cap (0-64; 0: speculation off) with every targets write, "
                        "overriding the settings'; the engine never raises it past its "
                        "--speculation-max-tokens")
    p.set_defaults(func=cmd_sidecar)


def cmd_sidecar(args: argparse.Namespace) -> int:
    from kvloop.sidecar.main import run

    return run(config=args.config, control=args.control, host=args.host, port=args.port,
               mode=args.mode, period=args.period, law=args.law, speculation_cap=args.speculation_cap)
