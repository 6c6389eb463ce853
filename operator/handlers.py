"""kopf handlers, registered on a fresh registry so that tests can run several operators in turn.

One `reconcile` does everything: render the children (pure), apply them idempotently, read the
Deployment and the pods back, and write `status` (never `spec`). It runs on create, update and
resume, and on a timer that refreshes conditions and feedback and repairs drift.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
from typing import Any

import kopf

from kvloop.operator import constants as C
from kvloop.operator.kube import ApiError, KubeClient, KubeConfig
from kvloop.operator.prune import prune
from kvloop.operator.render import render_children
from kvloop.operator.shape import shape_problems
from kvloop.operator.spec import problems, with_defaults
from kvloop.operator.status import compute_status, readable_status, strip_times

# Children that belong to optional APIs: a 404 on them means the API is not installed.
OPTIONAL_APIS = {"ServiceMonitor": "monitoring.coreos.com/v1 (Prometheus Operator)",
                 "InferencePool": "inference.networking.k8s.io/v1 (Gateway API Inference Extension)"}


@dataclasses.dataclass
class OperatorConfig:
    kube: KubeConfig
    default_image: str = C.DEFAULT_IMAGE
    status_interval: float = 15.0
    request_timeout: float = 30.0
    # Namespace globs need kopf to list and watch namespaces ("scanning"); exact names and
    # cluster-wide mode do not, and then scanning stays off (fewer permissions).
    observe_namespaces: bool = False


def configure(settings: kopf.OperatorSettings, cfg: OperatorConfig) -> None:
    """Settings that keep kopf's own bookkeeping under kvloop.io and out of `spec` and `status`."""
    settings.persistence.finalizer = C.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=C.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=C.GROUP, key="last-handled-configuration")
    settings.posting.level = logging.WARNING  # log lines of WARNING and above become Events
    settings.scanning.disabled = not cfg.observe_namespaces
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = cfg.request_timeout
    settings.queueing.error_delays = [1, 2, 5, 10, 30]
    # kopf releases the finalizer only once the status timer has exited; without a wait for the timer's
    # current run, a deletion that arrives while it runs is re-checked only after 60 s
    settings.background.instant_exit_timeout = 2.0


async def _apply_children(client: KubeClient, children: list[dict[str, Any]]) -> tuple[list[str], str | None]:
    changes: list[str] = []
    for child in children:
        ref = f"{child['kind']}/{child['metadata']['name']}"
        try:
            result = await client.apply(child)
        except ApiError as exc:
            if exc.status == 404 and child["kind"] in OPTIONAL_APIS:
                api = OPTIONAL_APIS[child["kind"]]
                return changes, f"{ref} requested but {api} is not served by this cluster"
            return changes, f"applying {ref} failed: {exc}"
        if result != "unchanged":
            changes.append(f"{result} {ref}")
    return changes, None


def read_spec(raw_spec: Any, name: str, namespace: str, uid: str, default_image: str
              ) -> tuple[dict[str, Any], list[str], list[dict[str, Any]]]:
    """(defaulted spec, problems, children) of a stored spec, whatever its shape: a malformed one gives
    problems (and the defaults, for the status), never an exception."""
    # An API server always sets metadata.uid; an object stored around one may lack it, and children
    # whose owner reference names no uid would be refused (or collected at once).
    found = shape_problems(raw_spec) + ([] if uid
                                        else ["metadata.uid is not set, so children cannot name their owner"])
    if found:
        return with_defaults({}), found, []
    try:
        full = with_defaults(dict(raw_spec))
        found = problems(full)
        children = [] if found else render_children(name, namespace, uid, dict(raw_spec), default_image)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:  # a shape the schema allows
        return with_defaults({}), [f"spec cannot be read: {type(exc).__name__}: {exc}"], []
    return full, found, children


async def _reconcile_unlocked(*, cfg: OperatorConfig, client: KubeClient, body: kopf.Body, meta: Any,
                              name: str, namespace: str, uid: str, patch: kopf.Patch,
                              logger: kopf.Logger) -> None:
    # A timer's body is a live view that kopf updates in place between awaits: the spec applied and the
    # generation reported as observed are read together, here, so the status never claims a generation whose
    # spec it did not apply (seen once in CI: a spec change landed during a timer's reconcile, which then
    # reported generation 2 for generation 1's children). The raw body, not kopf's spec/status views: those
    # raise on a stored spec or status that is no object.
    raw_spec, generation = copy.deepcopy(body.get("spec")), meta.get("generation")
    full, found, children = read_spec(raw_spec, name, namespace, uid, cfg.default_image)
    apply_error = None
    if found:
        logger.info("InferenceService cannot be realised: %s", "; ".join(found))
    else:
        changes, apply_error = await _apply_children(client, children)
        if not apply_error:  # only once the new set is in place: a failed apply keeps the old children
            try:
                changes += [f"pruned {ref}" for ref in await prune(client, namespace, name, keep=children)]
            except ApiError as exc:
                apply_error = f"pruning children no longer rendered failed: {exc}"
        if changes:
            kopf.event(body, type="Normal", reason="ChildrenApplied", message=", ".join(changes))
        if apply_error:
            kopf.event(body, type="Warning", reason="ApplyFailed", message=apply_error)
    deploy = await client.get("apps/v1", "Deployment", namespace, name)
    pods = await client.list("v1", "Pod", namespace, labels=C.selector_labels(name))
    stored = body.get("status")
    previous = readable_status(stored)
    new = compute_status(name=name, namespace=namespace, spec=full, deploy=deploy, pods=pods, problems=found,
                         apply_error=apply_error, previous=previous, generation=generation,
                         observed_generation=generation)
    _post_events(body, previous, new)
    if not isinstance(stored, dict):  # replaced whole: a merge patch cannot descend into a non-object
        patch["status"] = new
    elif strip_times(new) != strip_times({k: previous.get(k) for k in new}):
        for key, value in new.items():
            patch.status[key] = value


def _post_events(body: kopf.Body, previous: dict[str, Any], new: dict[str, Any]) -> None:
    old_last = ((previous.get("feedback") or {}).get("lastDecision") or {})
    new_last = new["feedback"].get("lastDecision")
    if new_last and (new_last.get("at"), new_last.get("pod")) != (old_last.get("at"), old_last.get("pod")):
        kopf.event(body, type="Normal", reason="FeedbackDecision",
                  message=f"pod {new_last['pod']}: {new_last['knob']} changed ({new_last['reason']})")
    old = {c.get("type"): c for c in previous.get("conditions") or []}
    for cond in new["conditions"]:
        before = old.get(cond["type"], {})
        if cond["type"] == "Degraded" and cond["status"] == "True" and (
                before.get("status") != "True" or before.get("message") != cond["message"]):
            kopf.event(body, type="Warning", reason=cond["reason"], message=cond["message"])
        if cond["type"] == "Ready" and cond["status"] != before.get("status") and cond["status"] == "True":
            kopf.event(body, type="Normal", reason="Ready", message=cond["message"])
        if (cond["type"] == "FeedbackHealthy" and cond["status"] == "False"
                and before.get("status") != "False"):
            kopf.event(body, type="Warning", reason=cond["reason"], message=cond["message"])


async def cleanup(*, client: KubeClient, name: str, namespace: str, logger: kopf.Logger) -> None:
    # Owner references let the garbage collector do this too; deleting explicitly makes the
    # result independent of the collector (and of clusters or fakes without one). The children
    # are found by their labels, not rendered from the spec: that also covers children of older
    # specs, and a spec too malformed to render.
    try:
        pruned = await prune(client, namespace, name, keep=[])
    except ApiError as exc:
        raise kopf.TemporaryError(f"deleting the children of {namespace}/{name}: {exc}", delay=5) from exc
    logger.info("children of %s/%s deleted: %s", namespace, name, ", ".join(pruned) or "none left")


def build_registry(cfg: OperatorConfig) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    locks: dict[str, asyncio.Lock] = {}
    client = KubeClient(cfg.kube, timeout=cfg.request_timeout)
    res = dict(group=C.GROUP, version=C.VERSION, plural=C.PLURAL, registry=registry)

    @kopf.on.startup(registry=registry)
    async def _startup(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure(settings, cfg)

    @kopf.on.cleanup(registry=registry)
    async def _shutdown(**_: Any) -> None:
        await client.close()

    @kopf.on.login(registry=registry)
    def _login(**_: Any) -> kopf.ConnectionInfo:
        k = cfg.kube
        return kopf.ConnectionInfo(server=k.server, token=k.bearer(), ca_path=k.ca_path,
                                   insecure=k.insecure or None,
                                   certificate_path=k.cert_path, private_key_path=k.key_path,
                                   default_namespace=k.namespace, scheme="Bearer" if k.bearer() else None)

    @kopf.on.probe(id="ready", registry=registry)
    def _probe(**_: Any) -> bool:
        return True

    @kopf.on.resume(**res)
    @kopf.on.create(**res)
    @kopf.on.update(**res)
    async def _reconcile(**kw: Any) -> None:
        await reconcile(cfg=cfg, client=client, **_pick(kw))

    async def reconcile(only_generation: int | None = None, **kw: Any) -> None:  # one at a time per object
        lock = locks.setdefault(kw["uid"], asyncio.Lock())
        async with lock:
            if only_generation is not None:
                # A timer's body can be stale by the time it gets the lock: if the spec changed meanwhile, the
                # change handler has reconciled the new spec, and re-applying the old one would revert
                # children. Likewise if it is being deleted: the delete handler may have
                # just removed the children.
                live = await client.get(C.API_VERSION, C.KIND, kw["namespace"], kw["name"])
                live_meta = (live or {}).get("metadata") or {}
                if (live is None or live_meta.get("deletionTimestamp")
                        or live_meta.get("generation") != only_generation):
                    return
            await _reconcile_unlocked(**kw)

    @kopf.timer(**res, interval=cfg.status_interval, initial_delay=cfg.status_interval)
    async def _refresh(**kw: Any) -> None:
        body = kw["body"]
        stored = body.get("status")
        observed = stored.get("observedGeneration") if isinstance(stored, dict) else None
        # Timers run beside change handlers: leave a new generation and deletion to them.
        if body.meta.get("deletionTimestamp") or observed != body.meta.get("generation"):
            return
        await reconcile(cfg=cfg, client=client, only_generation=body.meta.get("generation"), **_pick(kw))

    @kopf.on.delete(**res)
    async def _delete(name: str, namespace: str, uid: str, logger: kopf.Logger, **_: Any) -> None:
        async with locks.setdefault(uid, asyncio.Lock()):
            await cleanup(client=client, name=name, namespace=namespace, logger=logger)
        locks.pop(uid, None)

    return registry


def _pick(kw: dict[str, Any]) -> dict[str, Any]:
    keys = ("body", "meta", "name", "namespace", "uid", "patch", "logger")
    return {k: kw[k] for k in keys}
