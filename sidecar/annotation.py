"""Publishes the coordinator's state as the pod annotation kvloop.io/feedback (JSON merge patch on
the sidecar's own pod, with the pod's service account), only on change plus a slow heartbeat.

The operator aggregates these annotations into the InferenceService's status.feedback."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from urllib.parse import quote

import httpx

from kvloop.sidecar.coordinator import rfc3339

log = logging.getLogger("kvloop.sidecar")
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@dataclasses.dataclass
class KubeAccess:
    server: str
    token: str | None = None
    token_path: str | None = None  # re-read on every call: projected tokens rotate
    verify: str | bool = True

    @classmethod
    def from_env(cls) -> KubeAccess | None:
        """KVLOOP_KUBE_SERVER (+ KVLOOP_KUBE_TOKEN) for tests and local runs, else in-cluster."""
        if os.environ.get("KVLOOP_KUBE_SERVER"):
            return cls(os.environ["KVLOOP_KUBE_SERVER"].rstrip("/"),
                       token=os.environ.get("KVLOOP_KUBE_TOKEN"),
                       verify=os.environ.get("KVLOOP_KUBE_CA", True))
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        if not host:
            return None
        host = f"[{host}]" if ":" in host else host
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        ca = f"{SA_DIR}/ca.crt"
        return cls(f"https://{host}:{port}", token_path=f"{SA_DIR}/token",
                   verify=ca if os.path.exists(ca) else True)

    def headers(self) -> dict[str, str]:
        token = self.token
        if self.token_path:
            with open(self.token_path) as f:
                token = f.read().strip()
        return {"Authorization": f"Bearer {token}"} if token else {}


class AnnotationPublisher:
    def __init__(self, access: KubeAccess, namespace: str, pod: str, key: str = "kvloop.io/feedback",
                 heartbeat_s: float = 60.0, clock: Callable[[], float] = time.time, timeout: float = 5.0):
        self.access, self.namespace, self.pod, self.key = access, namespace, pod, key
        self.heartbeat_s = heartbeat_s
        self.clock = clock
        self.client = httpx.Client(verify=access.verify, timeout=timeout)
        self.published: dict | None = None  # last value sent, without updatedAt
        self.published_at = 0.0
        self.patches = 0
        self.errors = 0

    @classmethod
    def from_env(cls, key: str, heartbeat_s: float) -> AnnotationPublisher | None:
        pod, ns = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
        access = KubeAccess.from_env()
        if not pod or not ns or access is None:
            return None
        return cls(access, ns, pod, key, heartbeat_s)

    def maybe_publish(self, value: dict) -> bool:
        """Patches when the value changed or the heartbeat is due; True when it patched."""
        now = self.clock()
        if value == self.published and now - self.published_at < self.heartbeat_s:
            return False
        body = {"metadata": {"annotations": {self.key: json.dumps({**value, "updatedAt": rfc3339(now)},
                                                                  separators=(",", ":"))}}}
        url = f"{self.access.server}/api/v1/namespaces/{quote(self.namespace)}/pods/{quote(self.pod)}"
        try:
            resp = self.client.patch(url, content=json.dumps(body), headers={
                **self.access.headers(), "Content-Type": "application/merge-patch+json"})
            resp.raise_for_status()
        except (httpx.HTTPError, OSError) as exc:
            self.errors += 1
            log.warning("publishing the %s annotation failed: %s", self.key, exc)
            return False
        self.published, self.published_at = dict(value), now
        self.patches += 1
        return True

    def close(self) -> None:
        self.client.close()
