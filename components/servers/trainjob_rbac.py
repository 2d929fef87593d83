"""The launcher's RBAC: the ServiceAccount, Role and RoleBinding that allow exactly the TrainJob calls it makes.

``llmpack compile --nodes N`` writes them to ``trainjob/launcher-rbac.yaml``; ``llmpack doctor``
checks a cluster against them. Why these three verbs: docs/decisions.md (the TrainJob launcher).
"""

from __future__ import annotations

import copy
from typing import Any

from components.servers.trainjob import API_GROUP, PLURAL

GROUP = API_GROUP
RESOURCE = f"{PLURAL}.{GROUP}"  # as kubectl and RBAC messages name it
RBAC_VERBS = ("create", "get", "delete")
LAUNCHER_SERVICE_ACCOUNT = "llmpack-launcher"  # the MLflow Job of a gang runs as it; its Role is launcher_rbac()'s
RBAC_FILE = "trainjob/launcher-rbac.yaml"  # where `llmpack compile --nodes N` writes launcher_rbac(), under --out


def launcher_rbac(service_account: str = LAUNCHER_SERVICE_ACCOUNT) -> list[dict[str, Any]]:
    """The ServiceAccount, Role and RoleBinding a launcher needs: exactly the calls of this module.

    No namespace in them: ``kubectl apply -n NS`` puts all three in the run's namespace, and a
    RoleBinding's ServiceAccount subject without one is the binding's own namespace.
    """
    labels = {"app.kubernetes.io/name": "llmpack", "app.kubernetes.io/component": "launcher"}
    meta = {"name": service_account, "labels": labels}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": copy.deepcopy(meta)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": copy.deepcopy(meta),
         "rules": [{"apiGroups": [GROUP], "resources": [PLURAL], "verbs": list(RBAC_VERBS)}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": copy.deepcopy(meta),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": service_account},
         "subjects": [{"kind": "ServiceAccount", "name": service_account}]},
    ]


def launcher_rbac_yaml(service_account: str = LAUNCHER_SERVICE_ACCOUNT) -> str:
    """:func:`launcher_rbac` as one multi-document YAML file, with how to apply and bind it."""
    import yaml

    head = (
        "# What the finetune launcher of a TrainJob gang may do "
        "(llmpack compile --nodes; components/servers/trainjob_launch.py):\n"
        f"# create, get and delete {RESOURCE}, nothing else. Apply it in the run's namespace:\n"
        "#   kubectl apply -n llmpack -f launcher-rbac.yaml\n"
        f"# The MLflow Job runs as ServiceAccount {service_account}. KFP and Argo pods run as their own account\n"
        "# (KFP: pipeline-runner or default-editor; Argo: the Workflow's, default unless --serviceaccount): "
        "bind it too, e.g.\n"
        f"#   kubectl -n llmpack create rolebinding {service_account}-argo --role={service_account} "
        "--serviceaccount=llmpack:default\n"
    )
    return head + yaml.safe_dump_all(launcher_rbac(service_account), sort_keys=False, default_flow_style=False)
