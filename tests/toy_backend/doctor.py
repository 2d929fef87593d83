"""The toy cluster backend's second module, which only the lab loads (``llmpack cluster doctor``): its doctor facts.

Found by the registry by its name, ``<the backend's package>.doctor`` (:func:`llmpack.backends.doctor_facts`):
no registry line more than the backend's own.
"""

from __future__ import annotations

from components.doctor_facts import DoctorFacts, VersionProbe
from tests.toy_backend.cluster import ARTIFACT

DOCTOR = DoctorFacts(verbs=(("create", "configmaps", ""),),  # what its submission would need in the run's namespace
                     probe=VersionProbe(what="Toy server", path="/api/version", field="version",
                                        token_env="TOY_TOKEN", host_env="TOY_HOST", scheme="http"),
                     pod_artifact=ARTIFACT.as_posix())
