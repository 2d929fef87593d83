"""The launcher's RBAC: the ServiceAccount, Role and RoleBinding that allow exactly the TrainJob calls it makes.

``llmpack compile --nodes N`` writes them to ``trainjob/launcher-rbac.yaml``; ``llmpack cluster doctor``
checks a cluster against them. Why these three verbs: docs/internals/decisions.md (the TrainJob launcher).
"""

from __future__ import annotations

import copy
from typing import Any

from components.podspec import NODE_SERVICE_ACCOUNT
from components.trainjob.spec import API_GROUP, PLURAL

GROUP = API_GROUP
RESOURCE = f"{PLURAL}.{GROUP}"  # as kubectl and RBAC messages name it
RBAC_VERBS = ("create", "get", "delete")
LAUNCHER_SERVICE_ACCOUNT = "llmpack-launcher"  # the MLflow Job of a gang runs as it; its Role is launcher_rbac()'s
RBAC_FILE = "trainjob/launcher-rbac.yaml"  # where `llmpack compile --nodes N` writes launcher_rbac(), under --out


def launcher_rbac(service_account: str = LAUNCHER_SERVICE_ACCOUNT,
                  namespace: str | None = None) -> list[dict[str, Any]]:
    """The ServiceAccount, Role and RoleBinding a launcher needs (exactly the calls of this module), and the
    node pods' ServiceAccount, which has no Role and mounts no token.

    ``namespace`` (``llmpack compile --namespace``) is written into all three and the binding's
    subject, so the file applies where the compiled pods run whatever ``kubectl``'s context says;
    without one they are left unnamespaced for ``kubectl apply -n NS``. The Role is bound to the
    launcher's own ServiceAccount only: no other pod of any path mounts a token
    (``automountServiceAccountToken: false``), so no other pod may create or delete TrainJobs.
    """
    labels = {"app.kubernetes.io/name": "llmpack", "app.kubernetes.io/component": "launcher"}
    meta: dict[str, Any] = {"name": service_account, **({"namespace": namespace} if namespace else {}),
                            "labels": labels}
    subject = {"kind": "ServiceAccount", "name": service_account, **({"namespace": namespace} if namespace else {})}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": copy.deepcopy(meta)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": copy.deepcopy(meta),
         "rules": [{"apiGroups": [GROUP], "resources": [PLURAL], "verbs": list(RBAC_VERBS)}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": copy.deepcopy(meta),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": service_account},
         "subjects": [subject]},
        # The TrainJob's node pods run as this one: no Role, no token mounted (components.trainjob.spec).
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {**copy.deepcopy(meta), "name": NODE_SERVICE_ACCOUNT,
                      "labels": {**labels, "app.kubernetes.io/component": "trainer"}},
         "automountServiceAccountToken": False},
    ]


def launcher_rbac_yaml(service_account: str = LAUNCHER_SERVICE_ACCOUNT, namespace: str | None = None) -> str:
    """:func:`launcher_rbac` as one multi-document YAML file, with how to apply it and who runs as it."""
    import yaml

    ns = namespace or "NAMESPACE"
    head = (
        "# What the finetune launcher of a TrainJob gang may do "
        "(llmpack compile --nodes; components/trainjob/launch.py):\n"
        f"# create, get and delete {RESOURCE}, nothing else, as ServiceAccount {service_account} only.\n"
        f"# Apply it first, in the run's namespace ({ns}" + (", as compiled: --namespace" if namespace else "") + "):\n"
        f"#   kubectl apply -n {ns} -f launcher-rbac.yaml\n"
        f"# Who runs as it: the MLflow Job and the Argo Workflow's finetune launcher template. The TrainJob's node\n"
        f"# pods run as ServiceAccount {NODE_SERVICE_ACCOUNT} (below: no Role, no token). Every other pod of\n"
        "# every path mounts no token (automountServiceAccountToken: false; Argo's own executor containers use\n"
        "# the Workflow's executor account). KFP cannot say either per task (kfp-kubernetes has no service account or\n"
        "# token field): create the KFP run with this service account (the run's serviceAccount), no broader one\n"
        "# (docs/cluster.md, least privilege).\n"
    )
    return head + yaml.safe_dump_all(launcher_rbac(service_account, namespace), sort_keys=False,
                                     default_flow_style=False)
