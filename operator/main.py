"""`kvloop operator`: run the kopf operator for InferenceService resources.

By default it runs standalone, cluster-wide (one replica, Deployment strategy Recreate). With
`--peering NAME` several replicas coordinate through kopf's peering object (ClusterKopfPeering, or a
KopfPeering in each watched namespace with `--namespace`) so that only one acts at a time; the
object must exist (the Helm chart and the prod kustomize overlay create it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from kvloop.operator import constants as C

GLOB_CHARS = ("*", "?", "!", ",")


def add_operator_args(p: argparse.ArgumentParser) -> None:
    """The operator's options: one definition for `kvloop operator` and `python -m kvloop.operator.main`."""
    p.add_argument("--namespace", "-n", action="append", default=[],
                   help="watch only this namespace (repeatable). Glob patterns ('team-*', 'prod-*,!prod-x') "
                        "are matched against the cluster's namespaces, which needs list/watch on namespaces; "
                        "default: all namespaces")
    p.add_argument("--peering", default=os.environ.get("KVLOOP_OPERATOR_PEERING") or None,
                   help="kopf peering object name (several replicas, one acts); without it: standalone")
    p.add_argument("--liveness",
                   default=os.environ.get("KVLOOP_OPERATOR_LIVENESS", "http://0.0.0.0:8080/healthz"),
                   help="liveness endpoint URL ('' disables); it answers 200 once the operator is ready")
    p.add_argument("--image", default=os.environ.get("KVLOOP_IMAGE", C.DEFAULT_IMAGE),
                   help="default engine/sidecar image for InferenceServices that set none")
    p.add_argument("--status-interval", type=float,
                   default=float(os.environ.get("KVLOOP_OPERATOR_STATUS_INTERVAL", "15")),
                   help="seconds between status refreshes (conditions, feedback, drift repair)")
    p.add_argument("--kubeconfig", default=None,
                   help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    p.add_argument("--verbose", "-v", action="store_true", help="debug logging")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvloop operator", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_operator_args(p)
    return p.parse_args(argv)


def has_patterns(namespaces: list[str]) -> bool:
    return any(ch in ns for ns in namespaces for ch in GLOB_CHARS)


async def run(args: argparse.Namespace, stop_flag: asyncio.Event | None = None,
              ready_flag: asyncio.Event | None = None) -> None:
    import kopf  # imported here: `kvloop --help` and the other subcommands need not load kopf

    from kvloop.operator.handlers import OperatorConfig, build_registry, configure
    from kvloop.operator.kube import KubeConfig

    kube = KubeConfig.from_kubeconfig(args.kubeconfig) if args.kubeconfig else KubeConfig.from_environment()
    cfg = OperatorConfig(kube=kube, default_image=args.image, status_interval=args.status_interval,
                         observe_namespaces=has_patterns(args.namespace))
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


def run_from_args(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(run(args))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_from_args(parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
