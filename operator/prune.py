"""Pruning: an InferenceService's children that it no longer renders are deleted.

A child is found by a label selector over every kind the operator renders, and deleted only when
it carries this InferenceService's ownership labels and a controller owner reference to an
InferenceService of the same name, and is not in the freshly rendered set (on delete: that set is
empty). Objects someone else made, even with copied labels, are never touched.
"""

from __future__ import annotations

from typing import Any

from kvloop.operator import constants as C
from kvloop.operator.kube import ApiError, KubeClient
from kvloop.operator.render import OWNED_KINDS


def ownership_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": C.MANAGER, "app.kubernetes.io/instance": name}


def owned_by(obj: dict[str, Any], name: str) -> bool:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    if any(labels.get(k) != v for k, v in ownership_labels(name).items()):
        return False
    # Any uid: a child left by an earlier InferenceService of the same name is ours to clean up too.
    return any(ref.get("kind") == C.KIND and ref.get("name") == name and ref.get("controller")
               and str(ref.get("apiVersion", "")).startswith(C.GROUP + "/")
               for ref in meta.get("ownerReferences") or [])


async def prune(client: KubeClient, namespace: str, name: str, keep: list[dict[str, Any]]) -> list[str]:
    """Delete owned children not in `keep`; returns "Kind/name" of each one deleted."""
    wanted = {(c["kind"], c["metadata"]["name"]) for c in keep}
    pruned: list[str] = []
    for api_version, kind in reversed(OWNED_KINDS):  # the Deployment before the RBAC its pods use
        try:
            items = await client.list(api_version, kind, namespace, labels=ownership_labels(name))
        except ApiError as exc:
            if exc.status in (403, 404):  # API not served, or not granted: we cannot have made any
                continue
            raise
        for item in items:
            child = (item.get("metadata") or {}).get("name", "")
            if (kind, child) in wanted or not owned_by(item, name):
                continue
            await client.delete(api_version, kind, namespace, child)
            pruned.append(f"{kind}/{child}")
    return pruned
