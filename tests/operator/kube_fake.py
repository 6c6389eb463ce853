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
    # (group, version, plural) -> the CRD that declared it: objects are validated against its schema
    # and CEL rules on create and update, as the API server's admission does (see crdcheck).
    crds: dict[tuple[str, str, str], dict[str, Any]] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # Watch streams as JSON (kmock's default is application/octet-stream, which client-go refuses);
        # a higher sub-priority than kmock's own watch fallback.
        (self.fallback ** 1)[kmock.action.WATCH] << kmock.headers({"Content-Type": "application/json"}) \
            << self._serve_watch

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
            if (refusal := self._admit(request, data)) is not None:
                return refusal
        elif request.resource is not None and request.name and self._key(request) in self.objects:
            obj = self.objects[self._key(request)]
            if not obj.deleted:
                current = copy.deepcopy(obj.raw)
                if request.action == FETCH and request.subresource == "scale":
                    return await self._reply(self._scale(current))
                if request.action == UPDATE and isinstance(request.data, dict):
                    body = self._patch_body(request, current)
                    if request.subresource != "status" and (
                            refusal := self._admit(request,
                                                   dicts.merge_patch_dict(current, body))) is not None:
                        return refusal
                    request.data.clear()
                    request.data.update(body)
        response = await super()._handle(request)
        await self._handle_crd(request)
        if request.action == UPDATE and request.subresource == "scale" and response.status == 200:
            # a Scale, not the object
            return await self._reply(self._scale(self.objects[self._key(request)].raw))
        return response

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

    # --- What the real kubectl needs beyond kopf: `kind` on lists, field selectors (kubectl wait and
    # delete watch one object by metadata.name), the core group's discovery as "v1", subresources
    # without the parent's short names, a Scale back from a scale patch, and CustomResourceDefinitions
    # that declare their resource when created and validate its objects from then on. ---

    async def _serve_list(self, request: kmock.Request):  # type: ignore[override]
        payload = await super()._serve_list(request)
        payload["items"] = [o for o in payload["items"] if _fields_match(request.params, o)]
        info = self._info(request.resource)
        if info is not None and info.kind:
            group, version = request.resource.group, request.resource.version
            payload["kind"] = f"{info.kind}List"
            payload["apiVersion"] = f"{group}/{version}" if group else version
        payload["metadata"] = {"resourceVersion": str(next(_versions))}
        return payload

    async def _serve_watch(self, request: kmock.Request):  # type: ignore[override]
        async for event in super()._serve_watch(request):
            if isinstance(event, dict) and not _fields_match(request.params, event.get("object") or {}):
                continue
            yield event

    async def _serve_version(self, request: kmock.Request):  # type: ignore[override]
        payload = await super()._serve_version(request)
        if request.resource.group == "":  # the core group is "v1", not "/v1"
            payload["groupVersion"] = request.resource.version
        for entry in payload.get("resources", []):
            if "/" in entry["name"]:  # a subresource: no short names or categories of its own
                entry["shortNames"], entry["categories"] = [], []
                if entry["name"].endswith("/scale"):
                    entry.update(kind="Scale", group="autoscaling", version="v1",
                                 verbs=["get", "patch", "update"])
                else:
                    entry["verbs"] = ["get", "patch", "update"]
        return payload

    def _admit(self, request: kmock.Request, obj: dict[str, Any]):
        """A 422 Invalid Status (as the API server answers) when the object breaks its CRD's schema."""
        res = request.resource
        crd = self.crds.get((res.group, res.version, res.plural))
        if crd is None:
            return None
        from crdcheck import validate

        errors = validate(obj, crd)
        if not errors:
            return None
        import aiohttp.web

        kind, name = crd["spec"]["names"]["kind"], (obj.get("metadata") or {}).get("name")
        message = f'{kind}.{crd["spec"]["group"]} "{name}" is invalid: ' + "; ".join(errors)
        return aiohttp.web.json_response(status=422, data={
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": "Invalid", "code": 422,
            "details": {"name": name, "group": crd["spec"]["group"], "kind": kind,
                        "causes": [{"reason": "FieldValueInvalid", "message": e} for e in errors]}})

    def _info(self, resource: Any) -> kmock.ResourceInfo | None:
        try:
            return self.resources[resource]
        except KeyError:
            return None

    async def _handle_crd(self, request: kmock.Request) -> None:
        if request.resource is not None and request.resource.plural == "customresourcedefinitions" \
                and request.action in (CREATE, UPDATE):
            name = request.name or ((request.data or {}).get("metadata") or {}).get("name")
            key = (request.resource, None, name)
            if name and key in self.objects and not self.objects[key].deleted:
                register_crd(self, self.objects[key].raw)


def _fields_match(params: Any, obj: dict[str, Any]) -> bool:
    """The `fieldSelector` of a list or watch, for metadata.name and metadata.namespace (= and ==)."""
    selector = (params or {}).get("fieldSelector") or ""
    meta = obj.get("metadata") or {}
    for term in filter(None, selector.split(",")):
        key, _, value = term.replace("==", "=").partition("=")
        negate = key.endswith("!")
        field = {"metadata.name": "name", "metadata.namespace": "namespace"}.get(key.rstrip("!"))
        if field is not None and (meta.get(field) == value) == negate:
            return False
    return True


VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}


def register_crd(fake: KubeFake, crd: dict[str, Any]) -> None:
    """Serves the resource a CustomResourceDefinition defines, as the API server does once it is created."""
    spec, names = crd["spec"], crd["spec"]["names"]
    for version in spec.get("versions") or []:
        if version.get("served", True):
            fake.crds[(spec["group"], version["name"], names["plural"])] = crd
            fake.resources[f"{spec['group']}/{version['name']}/{names['plural']}"] = kmock.ResourceInfo(
                kind=names["kind"], singular=names.get("singular") or names["kind"].lower(),
                namespaced=spec.get("scope") == "Namespaced", verbs=VERBS,
                shortnames=set(names.get("shortNames") or []), categories=set(names.get("categories") or []),
                subresources=set(version.get("subresources") or {}))


def declare_resources(fake: KubeFake, inference_services: bool = True) -> None:
    """The resources the operator uses; without `inference_services`, applying the CRD declares it."""
    info = kmock.ResourceInfo
    verbs = {"get", "list", "watch", "create", "patch", "update", "delete"}
    if inference_services:
        fake.resources["kvloop.io/v1alpha1/inferenceservices"] = info(
            kind="InferenceService", singular="inferenceservice", namespaced=True, verbs=verbs,
            shortnames={"kvis"}, subresources={"status", "scale"})
    fake.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = info(
        kind="CustomResourceDefinition", singular="customresourcedefinition", namespaced=False, verbs=verbs,
        shortnames={"crd", "crds"}, categories={"api-extensions"}, subresources={"status"})
    # kopf waits for the namespaces resource in discovery before it starts any watch.
    fake.resources["v1/namespaces"] = info(kind="Namespace", singular="namespace", namespaced=False,
                                           verbs=verbs)
    for res, kind in [("apps/v1/deployments", "Deployment"), ("v1/services", "Service"),
                      ("v1/configmaps", "ConfigMap"), ("v1/serviceaccounts", "ServiceAccount"),
                      ("v1/pods", "Pod"), ("v1/events", "Event"), ("v1/secrets", "Secret"),
                      ("apps/v1/statefulsets", "StatefulSet"),
                      ("rbac.authorization.k8s.io/v1/roles", "Role"),
                      ("rbac.authorization.k8s.io/v1/rolebindings", "RoleBinding"),
                      ("policy/v1/poddisruptionbudgets", "PodDisruptionBudget"),
                      ("monitoring.coreos.com/v1/servicemonitors", "ServiceMonitor")]:
        fake.resources[res] = info(kind=kind, singular=kind.lower(), namespaced=True, verbs=verbs,
                                   subresources=({"status"} if kind in ("Deployment", "Pod", "StatefulSet")
                                                 else set()))


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
