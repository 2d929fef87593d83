"""What ``llmpack cluster doctor`` knows of a cluster backend, declared in its optional second module (``DOCTOR``)
or on its :class:`~components.backend.Backend` (``doctor``): the RBAC its submission needs, its server's version
probe, its own options, and the checklist line every check returns. Part of the backend contract
(docs/internals/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from components.compiled_pods import PodSpec


@dataclass(frozen=True, kw_only=True)
class VersionProbe:
    """How ``llmpack cluster doctor`` asks a backend's server for its version (with its token, never shown)."""

    what: str  # "KFP API"
    path: str  # the version call under the host
    field: str  # the answer's JSON field holding the version
    token_env: str  # the variable holding the token
    host_env: str  # the variable naming the host when no flag does
    scheme: str = "https"  # of a host given without one
    service_namespace: str = "default"  # where its server's Service usually is (the fix's kubectl)


@dataclass(frozen=True, kw_only=True)
class DoctorFlag:
    """A ``llmpack cluster doctor`` option a backend's checks read: a Kubernetes name (``--argo-controller-namespace``).
    """

    flag: str  # "--argo-controller-namespace"
    default: str
    help: str

    @property
    def dest(self) -> str:
        """The keyword click gives it, and its key in the values the backend's :attr:`DoctorFacts.checks` is given."""
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class DoctorCheck:
    """One line of ``llmpack cluster doctor``'s checklist: holds or not, what was checked, the command that fixes it."""

    ok: bool
    what: str
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "what": self.what, **({"fix": self.fix} if self.fix else {})}


class DoctorReader(Protocol):
    """What a backend's own doctor checks may read of the cluster (``llmpack.cluster.doctor.reader.ClusterReader``)."""

    Unanswered: type[Exception]  # raised by a read that failed (forbidden, or no answer)

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap, ``None`` when there is none."""
        ...

    def unread(self, exc: Exception, what: str, namespace: str = "") -> DoctorCheck:
        """The failed check of a read that raised :attr:`Unanswered`, with its fix."""
        ...


@dataclass(frozen=True)
class ControllerFact:
    """The controller a backend's objects need reconciled: its Deployment (in its install manifests), what waits for
    ever without it, the command that installs it, and the API group whose types it serves."""

    what: str
    deployment: str
    waits: str
    install: str
    api_group: str


@dataclass(frozen=True, kw_only=True)
class DoctorFacts:
    """What ``llmpack cluster doctor`` checks for a cluster backend, besides what every path needs.

    Declared in the backend's optional second module, ``<its package>.doctor``'s ``DOCTOR``, which only the lab
    loads (:func:`llmpack.backends.doctor_facts`); a backend without one may set :attr:`LabFacts.doctor
    <components.backend.LabFacts.doctor>`.
    """

    # (verb, resource, API group) its submission needs in the run's namespace
    verbs: tuple[tuple[str, str, str], ...] = ()
    probe: VersionProbe | None = None  # its server's version call, when it has a server
    # the compiled file (under compile --out) whose pods Pod Security is checked against
    pod_artifact: str | None = None
    flags: tuple[DoctorFlag, ...] = ()  # the doctor options its own checks read
    # its own checks, given the values of its ``flags`` by ``dest`` (Argo's artifact repository); none by default
    checks: Callable[[DoctorReader, str, Mapping[str, str]], list[DoctorCheck]] | None = None
    # how to read its compiled file's pods (its YAML documents); default: every pod spec found in it
    compiled_pods: Callable[[list[Any]], Iterable[PodSpec]] | None = None
    # the server version (of ``probe``) from which the orchestrator sets Pod Security ``restricted``'s fields on
    # its pods itself (KFP 2.16): from it, a compiled pod that leaves them out is admitted all the same
    secures_pods_from: tuple[int, int] | None = None
    # the orchestrator's own controller in the cluster (Argo's workflow-controller); None: none of its own
    controller: ControllerFact | None = None
