"""Custom resources for the stand-in API (TrainJobs, Kueue Workloads...) and the built-in kinds
stored the same way: :class:`CustomResource`, the served sets, and :class:`CustomObjects`, the
part of :class:`~standins.k8s_api.KubeAPIStandIn` that creates, patches and deletes them as a
CRD with a status subresource behaves (each change a watch event). Split from
:mod:`standins.k8s_api`, which re-exports these names.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from standins import base
from standins.k8s_objects import status_object


@dataclass(frozen=True)
class CustomResource:
    """A custom resource with a status subresource, as its CRD declares it (namespaced unless said).

    Built-in kinds the stand-in stores the same way (Secrets, PVCs, Roles...) are declared with
    their own group (``""`` for the core API): see :data:`BUILTIN_OBJECTS`.
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def resource(self) -> str:
        """``{plural}.{group}``: the name kubectl, RBAC messages and ``Status`` errors use."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


TRAINJOBS = CustomResource("trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob")
WORKLOADS = CustomResource("kueue.x-k8s.io", "v1beta1", "workloads", "Workload")
WORKLOADS_V1BETA2 = CustomResource("kueue.x-k8s.io", "v1beta2", "workloads", "Workload")
# Kueue 0.15-0.19 serves Workloads at both versions, one store (Kueue before 0.15: v1beta1 only).
CUSTOM_RESOURCES = (TRAINJOBS, WORKLOADS, WORKLOADS_V1BETA2)
# More CRDs a cluster may have (pass them in ``custom_resources``): Kueue LocalQueues and the
# Trainer's cluster-scoped runtimes (what ``llmpack doctor`` reads).
LOCALQUEUES = CustomResource("kueue.x-k8s.io", "v1beta1", "localqueues", "LocalQueue")
LOCALQUEUES_V1BETA2 = CustomResource("kueue.x-k8s.io", "v1beta2", "localqueues", "LocalQueue")
CLUSTER_TRAINING_RUNTIMES = CustomResource("trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes",
                                           "ClusterTrainingRuntime", namespaced=False)
# Built-in kinds every API server serves, stored and routed as the custom resources are
# (``/api/v1/namespaces/{ns}/{plural}[/{name}]``, ``/apis/rbac.authorization.k8s.io/v1/...``).
BUILTIN_OBJECTS = (
    CustomResource("", "v1", "secrets", "Secret"),
    CustomResource("", "v1", "configmaps", "ConfigMap"),
    CustomResource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim"),
    CustomResource("", "v1", "serviceaccounts", "ServiceAccount"),
    CustomResource("", "v1", "resourcequotas", "ResourceQuota"),
    CustomResource("", "v1", "limitranges", "LimitRange"),
    CustomResource("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    CustomResource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch of ``target`` (a new object; ``null`` removes a key)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = copy.deepcopy(dict(target)) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


class CustomObjects:
    """The custom-object store of :class:`~standins.k8s_api.KubeAPIStandIn` (a mixin: the server's
    lock, resourceVersion and watch log are its)."""

    _cond: threading.Condition
    _rv: int
    custom_resources: dict[tuple[str, str, str], CustomResource]
    custom_objects: dict[str, dict[tuple[str, str], dict[str, Any]]]
    on_custom_object_created: Callable[[dict[str, Any]], None] | None

    def _append(self, etype: str, obj: dict[str, Any], resource: str = "pods") -> None:
        raise NotImplementedError  # the server's


    def _custom_by_resource(self, resource: str) -> CustomResource:
        """The served resource named ``{plural}.{group}`` or, when unambiguous, ``{plural}``."""
        # one resource served at several versions shares one store: any of them will do
        found = list({r.resource: r for r in self.custom_resources.values()
                      if resource in (r.resource, r.plural)}.values())
        if len(found) != 1:
            raise KeyError(f"custom resource {resource!r}: {'ambiguous' if found else 'not served'}")
        return found[0]

    @property
    def trainjobs(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The stored TrainJobs by (namespace, name) (the live store; {} when not served)."""
        return self.custom_objects.get(TRAINJOBS.resource, {})

    def custom_object(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A copy of one stored object (``resource``: ``trainjobs`` or ``trainjobs.trainer.kubeflow.org``), else
        None."""
        res = self._custom_by_resource(resource)
        with self._cond:
            return copy.deepcopy(self.custom_objects[res.resource].get((namespace, name)))

    def _bump(self, res: CustomResource, obj: dict[str, Any], etype: str) -> dict[str, Any]:
        """Give ``obj`` the next resourceVersion and log the watch event (lock held)."""
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._append(etype, obj, res.resource)
        return copy.deepcopy(obj)

    def apply_custom_object(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace an object as a controller would (status kept). Returns the stored copy."""
        body = copy.deepcopy(dict(obj))
        group, _, version = str(body.get("apiVersion", "")).rpartition("/")
        res = next((r for r in self.custom_resources.values()
                    if (r.group, r.version, r.kind) == (group, version, body.get("kind"))), None)
        if res is None:
            raise KeyError(f"{body.get('apiVersion')} {body.get('kind')}: not a served custom resource")
        meta = body.setdefault("metadata", {})
        if res.namespaced:
            meta.setdefault("namespace", "default")
        key = (meta.get("namespace", ""), meta["name"])
        with self._cond:
            store = self.custom_objects[res.resource]
            old = store.get(key)
            meta.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", old["metadata"]["creationTimestamp"] if old else base.utc_now())
            meta.setdefault("generation", 1)
            store[key] = body
            return self._bump(res, body, "MODIFIED" if old else "ADDED")

    def set_custom_object_status(self, resource: str, namespace: str, name: str, status: Mapping[str, Any],
                                 *, merge: bool = True) -> dict[str, Any]:
        """Set (``merge``: merge-patch) an object's ``status``, as its controller does. A MODIFIED event."""
        res = self._custom_by_resource(resource)
        with self._cond:
            obj = self.custom_objects[res.resource][(namespace, name)]
            obj["status"] = merge_patch(obj.get("status") or {}, dict(status)) if merge else copy.deepcopy(dict(status))
            return self._bump(res, obj, "MODIFIED")

    def set_trainjob_condition(self, namespace: str, name: str, type: str = "Complete", status: str = "True",
                               reason: str = "", message: str = "") -> dict[str, Any]:
        """Set one ``status.conditions`` entry of a TrainJob as the Trainer controller does (metav1.Condition).

        ``type``: ``Complete``, ``Failed`` or ``Suspended``; ``reason`` defaults to the type
        (JobSet's ``AllJobsCompleted`` / ``FailedJobs`` are what a real cluster shows). The
        ``lastTransitionTime`` moves only when the status changes (``meta.SetStatusCondition``).
        """
        with self._cond:
            obj = self.custom_objects[TRAINJOBS.resource][(namespace, name)]
            conditions = list((obj.get("status") or {}).get("conditions") or [])
            old = next((c for c in conditions if c.get("type") == type), None)
            new = {
                "type": type,
                "status": status,
                "observedGeneration": obj["metadata"].get("generation", 1),
                "lastTransitionTime": (old["lastTransitionTime"] if old and old.get("status") == status
                                       else base.utc_now()),
                "reason": reason or type,
                "message": message,
            }
            conditions = [new if c is old else c for c in conditions] if old else [*conditions, new]
            obj.setdefault("status", {})["conditions"] = conditions
            return self._bump(TRAINJOBS, obj, "MODIFIED")

    def delete_custom_object(self, resource: str, namespace: str, name: str) -> None:
        """Remove an object (a DELETED event), as garbage collection finishing would."""
        res = self._custom_by_resource(resource)
        with self._cond:
            obj = self.custom_objects[res.resource].pop((namespace, name), None)
            if obj is not None:
                obj["metadata"].setdefault("deletionTimestamp", base.utc_now())
                self._bump(res, obj, "DELETED")

    def _not_found(self, res: CustomResource, name: str) -> tuple[int, dict[str, Any]]:
        return 404, status_object(404, "NotFound", f'{res.resource} "{name}" not found',
                                  {"name": name, "group": res.group, "kind": res.plural})

    def _create_custom(self, res: CustomResource, namespace: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body.get("apiVersion") != res.api_version or body.get("kind") != res.kind:
            return 400, status_object(400, "BadRequest",
                                      f"the API version in the data ({body.get('apiVersion')}) does not "
                                      f"match the expected API version ({res.api_version}), or the kind "
                                      f"({body.get('kind')}) is not {res.kind}")
        meta = body.setdefault("metadata", {})
        if meta.get("namespace") not in (None, "", namespace):
            return 400, status_object(400, "BadRequest", "the namespace of the provided object does not match the "
                                      "namespace sent on the request")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not name:
            return 422, status_object(422, "Invalid",
                                      f'{res.kind}.{res.group} "" is invalid: metadata.name: Required value')
        key = (namespace, name)
        with self._cond:
            store = self.custom_objects[res.resource]
            if key in store:
                return 409, status_object(409, "AlreadyExists", f'{res.resource} "{name}" already exists',
                                          {"name": name, "group": res.group, "kind": res.plural})
            body.pop("status", None)  # the status subresource: create resets it
            for field in ("deletionTimestamp", "deletionGracePeriodSeconds"):
                meta.pop(field, None)
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), creationTimestamp=base.utc_now(), generation=1)
            store[key] = body
            created = self._bump(res, body, "ADDED")
        if self.on_custom_object_created is not None:
            self.on_custom_object_created(copy.deepcopy(created))
        return 201, created

    def _patch_custom(self, res: CustomResource, namespace: str, name: str, patch: Any, content_type: str,
                      status_only: bool) -> tuple[int, dict[str, Any]]:
        if content_type.split(";")[0].strip().lower() != "application/merge-patch+json":
            return 415, status_object(415, "UnsupportedMediaType",
                                      "the body of the request was in an unknown format - accepted media types "
                                      "include: "
                                      f"application/merge-patch+json (got {content_type or 'none'})")
        if not isinstance(patch, dict):
            return 400, status_object(400, "BadRequest", "the body of the request was in an unknown format")
        with self._cond:
            obj = self.custom_objects[res.resource].get((namespace, name))
            if obj is None:
                return self._not_found(res, name)
            wanted_rv = ((patch.get("metadata") or {}).get("resourceVersion"))
            if wanted_rv and wanted_rv != obj["metadata"]["resourceVersion"]:
                return 409, status_object(409, "Conflict",
                                          f'Operation cannot be fulfilled on {res.resource} "{name}": the '
                                          "object has been modified; please apply your changes to the latest version "
                                          "and try again", {"name": name, "group": res.group, "kind": res.plural})
            merged = merge_patch(obj, patch)
            if status_only:  # /status: only status changes
                new = copy.deepcopy(obj)
                new["status"] = merged.get("status") or {}
            else:  # the main resource: status and the server's metadata fields stay
                new = merged
                new["status"] = copy.deepcopy(obj.get("status") or {})
                for field in ("name", "namespace", "uid", "creationTimestamp", "generation", "deletionTimestamp"):
                    if field in obj["metadata"]:
                        new["metadata"][field] = obj["metadata"][field]
                    else:
                        new["metadata"].pop(field, None)
                new["apiVersion"], new["kind"] = obj["apiVersion"], obj["kind"]
                if new.get("spec") != obj.get("spec"):
                    new["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
            if not new["status"]:
                new.pop("status")
            self.custom_objects[res.resource][(namespace, name)] = new
            return 200, self._bump(res, new, "MODIFIED")

    def _delete_custom(self, res: CustomResource, namespace: str, name: str, options: Any,
                       query: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        options = options if isinstance(options, dict) else {}
        want_uid = (options.get("preconditions") or {}).get("uid")
        with self._cond:
            store = self.custom_objects[res.resource]
            obj = store.get((namespace, name))
            if obj is None:
                return self._not_found(res, name)
            if want_uid and want_uid != obj["metadata"]["uid"]:
                return 409, status_object(409, "Conflict", f'Operation cannot be fulfilled on {res.resource} "{name}": '
                                          f"Precondition failed: UID in precondition: {want_uid}, UID in object meta: "
                                          f"{obj['metadata']['uid']}",
                                          {"name": name, "group": res.group, "kind": res.plural})
            del store[(namespace, name)]
            obj["metadata"]["deletionTimestamp"] = base.utc_now()
            policy = options.get("propagationPolicy") or query.get("propagationPolicy")
            if policy == "Foreground":  # what the API server answers before the garbage collector finishes
                obj["metadata"]["finalizers"] = [*obj["metadata"].get("finalizers", []), "foregroundDeletion"]
            return 200, self._bump(res, obj, "DELETED")


# --------------------------------------------------------------------------- command line (a separate server process)
