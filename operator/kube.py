"""A small async Kubernetes REST client for the operator's children (aiohttp, which kopf already uses).

Credentials come from one `KubeConfig`, shared with kopf's login handler: in-cluster service
account, or a kubeconfig file. Children are applied with get → create, or a JSON merge patch when
the live object differs from the rendered one on any rendered field. (Server-side apply would be
nicer on a real cluster, but kmock has none; a merge patch behaves the same for what we render,
since lists are replaced whole.)
"""

from __future__ import annotations

import base64
import dataclasses
import os
import ssl
import tempfile
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"

PLURALS = {
    "ServiceAccount": "serviceaccounts", "Role": "roles", "RoleBinding": "rolebindings",
    "ConfigMap": "configmaps", "Deployment": "deployments", "Service": "services",
    "PodDisruptionBudget": "poddisruptionbudgets", "ServiceMonitor": "servicemonitors",
    "InferencePool": "inferencepools", "Pod": "pods", "PersistentVolumeClaim": "persistentvolumeclaims",
    "InferenceService": "inferenceservices", "Event": "events", "Secret": "secrets",
    "StatefulSet": "statefulsets",
}
# A child with this annotation is created once and never patched (a generated password must not change).
CREATE_ONLY = "kvloop.io/create-only"


class ApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


@dataclasses.dataclass
class KubeConfig:
    server: str
    token: str | None = None
    token_path: str | None = None
    ca_path: str | None = None
    ca_data: str | None = None  # PEM text
    cert_path: str | None = None
    key_path: str | None = None
    insecure: bool = False
    namespace: str | None = None

    @classmethod
    def in_cluster(cls) -> KubeConfig:
        host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        host = f"[{host}]" if ":" in host else host
        ns = None
        if os.path.exists(f"{SA_DIR}/namespace"):
            with open(f"{SA_DIR}/namespace") as f:
                ns = f.read().strip()
        return cls(server=f"https://{host}:{port}", token_path=f"{SA_DIR}/token", ca_path=f"{SA_DIR}/ca.crt",
                   namespace=ns)

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None) -> KubeConfig:
        path = path or os.environ.get("KUBECONFIG",
                                      "").split(os.pathsep)[0] or os.path.expanduser("~/.kube/config")
        with open(path) as f:
            doc = yaml.safe_load(f)
        ctx_name = context or doc.get("current-context")
        ctx = next(c["context"] for c in doc["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == ctx["cluster"])
        user = next((u.get("user") or {} for u in doc.get("users") or [] if u["name"] == ctx.get("user")), {})
        base = os.path.dirname(os.path.abspath(path))

        def file_or_data(file_key: str, data_key: str, src: dict[str, Any]) -> str | None:
            if src.get(data_key):
                fd, tmp = tempfile.mkstemp(prefix="kvloop-kube-")
                with os.fdopen(fd, "wb") as out:
                    out.write(base64.b64decode(src[data_key]))
                return tmp
            return os.path.join(base, src[file_key]) if src.get(file_key) else None

        return cls(
            server=cluster["server"],
            token=user.get("token"),
            token_path=user.get("tokenFile"),
            ca_path=file_or_data("certificate-authority", "certificate-authority-data", cluster),
            cert_path=file_or_data("client-certificate", "client-certificate-data", user),
            key_path=file_or_data("client-key", "client-key-data", user),
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
            namespace=ctx.get("namespace"),
        )

    @classmethod
    def from_environment(cls) -> KubeConfig:
        if os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(f"{SA_DIR}/token"):
            return cls.in_cluster()
        return cls.from_kubeconfig()

    def bearer(self) -> str | None:
        if self.token_path:  # re-read: projected tokens rotate
            with open(self.token_path) as f:
                return f.read().strip()
        return self.token

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https"):
            return False
        if self.insecure:
            return False
        ctx = ssl.create_default_context(cafile=self.ca_path)
        if self.cert_path and self.key_path:
            ctx.load_cert_chain(self.cert_path, self.key_path)
        return ctx


def api_path(api_version: str, kind: str, namespace: str | None, name: str | None = None,
             sub: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = base + (f"/namespaces/{quote(namespace)}" if namespace else "") + f"/{PLURALS[kind]}"
    if name:
        path += f"/{quote(name)}"
    if sub:
        path += f"/{sub}"
    return path


def is_subset(want: Any, have: Any) -> bool:
    """Whether every field rendered in `want` has the same value in `have` (server defaults ignored)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and is_subset(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(is_subset, want, have))
    if isinstance(want, bool) or isinstance(have, bool):
        return want is have or want == have and type(want) is type(have)
    return want == have or str(want) == str(have)


class KubeClient:
    def __init__(self, config: KubeConfig, timeout: float = 30.0):
        self.config = config
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self.config.ssl_context())
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def request(self, method: str, path: str, *, json: Any = None, params: dict[str, str] | None = None,
                      content_type: str = "application/json") -> dict[str, Any] | None:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        token = self.config.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        async with self._sess().request(method, self.config.server.rstrip("/") + path, json=json,
                                        params=params, headers=headers) as rsp:
            if rsp.status == 404 and method in ("GET", "DELETE"):
                return None
            body = await rsp.json(content_type=None) if rsp.content_length != 0 else {}
            if rsp.status >= 400:
                msg = body.get("message") if isinstance(body, dict) else str(body)
                raise ApiError(rsp.status, msg or rsp.reason or "error")
            return body

    async def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str,
                                                                                               Any] | None:
        return await self.request("GET", api_path(api_version, kind, namespace, name))

    async def list(self, api_version: str, kind: str, namespace: str | None,
                   labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        params = {"labelSelector": ",".join(f"{k}={v}" for k, v in labels.items())} if labels else None
        body = await self.request("GET", api_path(api_version, kind, namespace), params=params) or {}
        items = body.get("items") or []
        # Filter again client-side: some API fakes ignore label selectors.
        return [i for i in items if all(((i.get("metadata") or {}).get("labels") or {}).get(k) == v
                                        for k, v in (labels or {}).items())]

    async def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        return await self.request("DELETE", api_path(api_version, kind, namespace, name),
                                  json={"propagationPolicy": "Background"}) is not None

    async def apply(self, obj: dict[str, Any]) -> str:
        """Create or patch `obj`; returns "created", "patched" or "unchanged"."""
        meta = obj["metadata"]
        api, kind, ns, name = obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"]
        live = await self.get(api, kind, ns, name)
        if live is None:
            await self.request("POST", api_path(api, kind, ns), json=obj)
            return "created"
        if is_subset(obj, live) or (meta.get("annotations") or {}).get(CREATE_ONLY) == "true":
            return "unchanged"
        await self.request("PATCH", api_path(api, kind, ns, name), json=obj,
                           content_type="application/merge-patch+json")
        return "patched"
