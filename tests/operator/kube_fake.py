"""kmock's Kubernetes emulator with the metadata a real API server adds, for the operator's tests.

kmock 0.8 keeps objects as plain JSON merged by patches. This subclass fills what kopf and the
operator rely on: `uid`, `resourceVersion`, `generation` (bumped on spec changes only) and
`creationTimestamp` on create; the `status` subresource (a patch there touches only `.status`, and
a patch on the main resource leaves `.status` alone, as on a CRD with the status subresource); and
the `scale` subresource (GET returns an autoscaling/v1 Scale; PATCH writes `.spec.replicas`).
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import uuid
from typing import Any

import attrs
import kmock
from kmock._internal import dicts  # merge-patch semantics identical to the emulator's own

CREATE, UPDATE, FETCH = kmock.action.CREATE, kmock.action.UPDATE, kmock.action.FETCH
_versions = itertools.count(1000)


@attrs.define(kw_only=True)
class KubeFake(kmock.KubernetesEmulator):
    def _key(self, request: kmock.Request) -> Any:
        return (request.resource, request.namespace, request.name)

    def _has_status_subresource(self, resource: Any) -> bool:
        try:
            return "status" in self.resources[resource].subresources
        except KeyError:
            return False

    async def _handle(self, request: kmock.Request):  # type: ignore[override]
        if request.resource is not None and request.action == CREATE and isinstance(request.data, dict):
            data = request.data  # edited in place: kmock matches reactions against this very request
            meta = data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):  # kopf names its Events this way
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            if request.namespace:
                meta.setdefault("namespace", request.namespace)
            meta["uid"] = str(uuid.uuid4())
            meta["resourceVersion"] = str(next(_versions))
            meta["generation"] = 1
            meta["creationTimestamp"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        elif request.resource is not None and request.name and self._key(request) in self.objects:
            obj = self.objects[self._key(request)]
            if not obj.deleted:
                current = copy.deepcopy(obj.raw)
                if request.action == FETCH and request.subresource == "scale":
                    return await self._reply(self._scale(current))
                if request.action == UPDATE and isinstance(request.data, dict):
                    body = self._patch_body(request, current)
                    request.data.clear()
                    request.data.update(body)
        return await super()._handle(request)

    def _patch_body(self, request: kmock.Request, current: dict[str, Any]) -> dict[str, Any]:
        data = copy.deepcopy(request.data)
        if request.subresource == "scale":
            data = {"spec": {"replicas": int((data.get("spec") or {}).get("replicas", 0))}}
        elif request.subresource == "status":
            data = {"status": data.get("status")}
        elif self._has_status_subresource(request.resource):
            data.pop("status", None)
        meta = data.setdefault("metadata", {})
        for field in ("uid", "creationTimestamp", "generation", "resourceVersion"):  # the server's to set
            meta.pop(field, None)
        merged = dicts.merge_patch_dict(current, data)
        meta["resourceVersion"] = str(next(_versions))
        if merged.get("spec") != current.get("spec"):
            meta["generation"] = int((current.get("metadata") or {}).get("generation") or 1) + 1
        return data

    @staticmethod
    def _scale(obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.get("metadata") or {}
        return {"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                             "resourceVersion": meta.get("resourceVersion")},
                "spec": {"replicas": (obj.get("spec") or {}).get("replicas", 0)},
                "status": {"replicas": (obj.get("status") or {}).get("replicas", 0),
                           "selector": (obj.get("status") or {}).get("selector", "")}}

    async def _reply(self, payload: dict[str, Any]):
        import aiohttp.web

        return aiohttp.web.json_response(payload)


def declare_resources(fake: KubeFake) -> None:
    info = kmock.ResourceInfo
    verbs = {"get", "list", "watch", "create", "patch", "update", "delete"}
    fake.resources["kvloop.io/v1alpha1/inferenceservices"] = info(
        kind="InferenceService", singular="inferenceservice", namespaced=True, verbs=verbs,
        shortnames={"kvis"}, subresources={"status", "scale"})
    # kopf waits for the namespaces resource in discovery before it starts any watch.
    fake.resources["v1/namespaces"] = info(kind="Namespace", singular="namespace", namespaced=False, verbs=verbs)
    for res, kind in [("apps/v1/deployments", "Deployment"), ("v1/services", "Service"),
                      ("v1/configmaps", "ConfigMap"), ("v1/serviceaccounts", "ServiceAccount"),
                      ("v1/pods", "Pod"), ("v1/events", "Event"),
                      ("rbac.authorization.k8s.io/v1/roles", "Role"),
                      ("rbac.authorization.k8s.io/v1/rolebindings", "RoleBinding"),
                      ("policy/v1/poddisruptionbudgets", "PodDisruptionBudget"),
                      ("monitoring.coreos.com/v1/servicemonitors", "ServiceMonitor")]:
        fake.resources[res] = info(kind=kind, singular=kind.lower(), namespaced=True, verbs=verbs,
                                   subresources={"status"} if kind in ("Deployment", "Pod") else set())


def _parse_path_with_namespaces(path: str) -> Any:
    """kmock 0.8 reads `/api/v1/namespaces[/NAME]` as the start of a namespaced path (a 500 on
    listing namespaces, which kopf does for `--namespace` glob patterns); here it is the
    cluster-scoped `namespaces` resource, as on a real API server."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
        return _parsing.ParsedPath("", "v1", "namespaces", None, parts[3] if len(parts) == 4 else None, None)
    return _kmock_parse_path(path)


from kmock._internal import parsing as _parsing  # noqa: E402

_kmock_parse_path = _parsing.parse_path
_parsing.parse_path = _parse_path_with_namespaces
