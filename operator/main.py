"""`kvloop operator`: run the kopf operator for InferenceService resources.

By default it runs standalone (one replica, Deployment strategy Recreate). With `--peering NAME`
several replicas coordinate through kopf's ClusterKopfPeering object so only one acts at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

import kopf
from kvloop.operator import constants as C
from kvloop.operator.handlers import OperatorConfig, build_registry, configure
from kvloop.operator.kube import KubeConfig


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvloop operator", description=__doc__)
    p.add_argument("--namespace", "-n", action="append", default=[],
                   help="watch only this namespace (repeatable; glob patterns allowed); default: all")
    p.add_argument("--peering", default=os.environ.get("KVLOOP_OPERATOR_PEERING") or None,
                   help="kopf peering object name; without it the operator runs standalone")
    p.add_argument("--liveness", default=os.environ.get("KVLOOP_OPERATOR_LIVENESS", "http://0.0.0.0:8080/healthz"),
                   help="liveness endpoint URL ('' disables)")
    p.add_argument("--image", default=os.environ.get("KVLOOP_IMAGE", C.DEFAULT_IMAGE),
                   help="default engine/sidecar image for InferenceServices that set none")
    p.add_argument("--status-interval", type=float,
                   default=float(os.environ.get("KVLOOP_OPERATOR_STATUS_INTERVAL", "15")),
                   help="seconds between status refreshes (conditions, feedback, drift repair)")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("--verbose", "-v", action="store_true")
    return p.parse_args(argv)


async def run(args: argparse.Namespace, stop_flag: asyncio.Event | None = None,
              ready_flag: asyncio.Event | None = None) -> None:
    kube = KubeConfig.from_kubeconfig(args.kubeconfig) if args.kubeconfig else KubeConfig.from_environment()
    cfg = OperatorConfig(kube=kube, default_image=args.image, status_interval=args.status_interval)
    settings = kopf.OperatorSettings()
    configure(settings, cfg)
    await kopf.operator(
        registry=build_registry(cfg),
        settings=settings,
        standalone=not args.peering,
        peering_name=args.peering or None,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness or None,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
