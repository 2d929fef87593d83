"""Every ``LLMPACK_*`` environment variable, declared once, typed, with its default and meaning.

Modelled on MLflow's ``mlflow/environment_variables.py``: each setting is one :class:`Setting`
object; code reads it with :meth:`Setting.get` (or names it with ``.name`` where it sets it for a
child process), never with its own string. :data:`REGISTRY` lists them all: tests clear them from
the environment by reading it, and ``docs/configuration.md`` is generated from it
(``python -m llmpack.configuration > docs/configuration.md``; a test keeps the page current).

Who sets a variable matters to a reader: ``user`` settings are for people and their CI;
``internal`` ones are how llmpack's own processes talk to each other (a launcher to its ranks, the
client to a step); ``test`` ones are fault injection for tests and benchmarks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

T = TypeVar("T", str, int, float, bool)
Audience = Literal["user", "internal", "test"]
_TRUE = ("1", "true", "yes")
_FALSE = ("0", "false", "no", "")


@dataclass(frozen=True, kw_only=True)
class Setting(Generic[T]):
    """One environment variable: its name, type, default and what it does."""

    name: str
    type: type[T]
    default: T | None
    doc: str
    audience: Audience = "user"

    def raw(self, env: Mapping[str, str] | None = None) -> str | None:
        """The variable's text as set (``None`` when unset)."""
        return (os.environ if env is None else env).get(self.name)

    def is_set(self, env: Mapping[str, str] | None = None) -> bool:
        """True when the variable is set to a non-empty value."""
        return bool(self.raw(env))

    def get(self, env: Mapping[str, str] | None = None) -> T | None:
        """The typed value, or the default when unset or empty; a bad value raises ``ValueError`` naming it."""
        text = self.raw(env)
        if text is None or text == "":
            return self.default
        if self.type is bool:
            low = text.strip().lower()
            if low in _TRUE or low in _FALSE:
                return low in _TRUE  # type: ignore[return-value]
            raise ValueError(f"{self.name}={text!r}: expected 1/0, true/false or yes/no")
        try:
            return self.type(text)
        except ValueError:
            raise ValueError(f"{self.name}={text!r}: not a valid {self.type.__name__}") from None


REGISTRY: dict[str, Setting] = {}  # type: ignore[type-arg]


def declare(setting: Setting[T]) -> Setting[T]:
    """Add ``setting`` to the registry (a backend declares its own this way) and return it."""
    if setting.name in REGISTRY and REGISTRY[setting.name] != setting:
        raise ValueError(f"{setting.name} declared twice, differently")
    REGISTRY[setting.name] = setting
    return setting


#: Price per GPU-hour in USD for every GPU step; beats a price file and the shipped table.
PRICE_PER_GPU_HOUR = declare(Setting(name="LLMPACK_PRICE_PER_GPU_HOUR", type=str, default=None,
                                     doc="Price per GPU-hour in USD; beats the price file and the shipped table."))
#: A price YAML (same format as the shipped ``components/record/prices.yaml``).
PRICE_FILE = declare(Setting(name="LLMPACK_PRICE_FILE", type=str, default=None,
                             doc="A price YAML in the shipped table's format; beats the shipped table."))
#: Which provider's row of the price table to use (``aws``, ``gcp``, ``azure``...).
PRICE_PROVIDER = declare(Setting(name="LLMPACK_PRICE_PROVIDER", type=str, default=None,
                                 doc="The provider whose price row is used (aws, gcp, azure, ...)."))
#: The MLflow experiment records go to.
EXPERIMENT = declare(Setting(name="LLMPACK_EXPERIMENT", type=str, default="llmpack",
                             doc="The MLflow experiment every record goes to."))
#: Upper bound in seconds on retrying an upload to the tracking server.
TRACKING_MAX_WAIT_S = declare(Setting(name="LLMPACK_TRACKING_MAX_WAIT_S", type=float, default=30.0,
                                      doc="Seconds an upload to the tracking server is retried, in all."))
#: ``0``: step processes log through MLflow's client even to an HTTP tracking server (the lean REST path off).
TRACKING_REST = declare(Setting(name="LLMPACK_TRACKING_REST", type=bool, default=True,
                                doc="0: step processes import MLflow's client to log, "
                                    "even to an http(s) tracking server."))
#: ``0`` turns the MLflow sink of the steps off (the JSONL beside each step stays).
MLFLOW_LOGGING = declare(Setting(name="LLMPACK_MLFLOW_LOGGING", type=bool, default=True,
                                 doc="0: steps log nothing to MLflow (the JSONL beside each step stays)."))
#: ``0``: the register step logs the weights to the run but creates no model version (compare's runs).
REGISTER_VERSION = declare(Setting(name="LLMPACK_REGISTER_VERSION", type=bool, default=True,
                                   doc="0: register logs the weights but creates no model version "
                                       "(llmpack compare sets it)."))
#: ``0``: no warm-ahead processes in fused steps (the strict one-process pod).
WARM_AHEAD = declare(Setting(name="LLMPACK_WARM_AHEAD", type=bool, default=True,
                             doc="0: a fused step runs no parked warm-ahead process (strictly one process)."))
#: The Kubernetes API server the pod watcher of ``compare --cluster`` talks to (else the kubeconfig).
K8S_HOST = declare(Setting(name="LLMPACK_K8S_HOST", type=str, default=None,
                           doc="Kubernetes API URL for compare --cluster's pod watcher (else the kubeconfig's)."))
#: A bearer token for :data:`K8S_HOST`; never printed.
K8S_TOKEN = declare(Setting(name="LLMPACK_K8S_TOKEN", type=str, default=None,
                            doc="Bearer token for LLMPACK_K8S_HOST (never printed)."))

#: The provenance key itself, hex (components/provenance.py); on a cluster from a Secret.
SIGNING_KEY = declare(Setting(name="LLMPACK_SIGNING_KEY", type=str, default=None,
                              doc="Provenance key, hex, 32+ bytes (else the key file); never printed."))
#: Where the provenance key file lives (generated 0600 on first use).
SIGNING_KEY_FILE = declare(Setting(name="LLMPACK_SIGNING_KEY_FILE", type=str, default=None,
                                   doc="Provenance key file (default ~/.config/llmpack/signing.key, made 0600)."))

# How llmpack's own processes talk to each other.
#: The orchestrator's attempt number of the running step (0: the first).
ATTEMPT = declare(Setting(name="LLMPACK_ATTEMPT", type=int, default=None, audience="internal",
                          doc="The orchestrator's attempt number of the running step (0: the first): set by "
                              "direct, the MLflow driver and Argo (its templates with retries, from {{retries}}); "
                              "KFP has no attempt placeholder, so a step it retries is told nothing."))
#: Set by the llmpack client when it uploads every step's JSONL itself after a local run.
CLIENT_UPLOADS = declare(Setting(name="LLMPACK_CLIENT_UPLOADS", type=bool, default=False, audience="internal",
                                 doc="1: the llmpack client uploads the records after a local run; steps do not."))
#: Where the closing task finds the run's step records (a local run's artifacts).
RECORDS_DIR = declare(Setting(name="LLMPACK_RECORDS_DIR", type=str, default=None, audience="internal",
                              doc="Directory of the run's step records, read by the closing task."))
#: Set by an MLflow project's ``main`` on a first step it started before its run existed.
RUN_ID_FILE = declare(Setting(name="LLMPACK_RUN_ID_FILE", type=str, default=None, audience="internal",
                              doc="File where main writes the step's MLflow run id once it exists; "
                                  "read before uploading."))
#: Set by llmpack's torchrun launcher for its ranks: it records start/finish and uploads.
LAUNCHER = declare(Setting(name="LLMPACK_LAUNCHER", type=bool, default=False, audience="internal",
                           doc="1: this rank runs under llmpack's torchrun launcher (set by the launcher)."))
#: Set on a fused step's parked process: the index of the member it runs.
PARKED_MEMBER = declare(Setting(name="LLMPACK_PARKED_MEMBER", type=int, default=None, audience="internal",
                                doc="Index of the fused member a parked warm-ahead process runs (set by the step)."))
#: ``1``: each rank of a gang writes its own events file (merged later).
RANK_EVENTS = declare(Setting(name="LLMPACK_RANK_EVENTS", type=bool, default=False, audience="internal",
                              doc="1: each rank of a gang writes llmpack-events.rank<R>.jsonl (merged later)."))
#: Set by ``llmpack run --seeds N`` on its last seed's run: the earlier seeds' gate improvements.
SEED_IMPROVEMENTS = declare(Setting(name="LLMPACK_SEED_IMPROVEMENTS", type=str, default=None, audience="internal",
                                    doc="Comma list of the earlier seeds' gate improvements (llmpack run --seeds "
                                        "sets it): register gates on their interval."))
#: ``llmpack compile --nodes N`` warns past this many nodes (a typo of 1000 for 10 is 8000 GPUs).
NODES_WARN = declare(Setting(name="LLMPACK_NODES_WARN", type=int, default=64,
                             doc="llmpack compile warns when --nodes is above this many nodes."))
#: Compiled into a gang launcher's pod: the digests of the gang specs its ``trainjob`` parameter may be.
GANG_SPECS = declare(Setting(name="LLMPACK_GANG_SPECS", type=str, default=None, audience="internal",
                             doc="Comma-separated sha256 digests of the compiled gang specs a run's trainjob parameter "
                                 "may choose among (set by llmpack compile --nodes)."))
# Checkpoints that outlive the pod
# (llmpack compile --checkpoint-pvc/--grace-period/--checkpoint-minutes; docs/preemption.md).
#: The checkpoint volume's mount: finetune writes under ``<root>/<pipeline run>/<step>``, keyed by run.
CHECKPOINT_ROOT = declare(Setting(name="LLMPACK_CHECKPOINT_ROOT", type=str, default=None, audience="internal",
                                  doc="Checkpoint volume mount: "
                                      "finetune checkpoints under ROOT/<pipeline run>/<step>."))
#: Minutes between checkpoints, besides every ``checkpoint_every`` steps (whichever comes first).
CHECKPOINT_MINUTES = declare(Setting(name="LLMPACK_CHECKPOINT_MINUTES", type=float, default=0.0,
                                     audience="internal",
                                     doc="Also checkpoint every T minutes "
                                         "(whichever of steps or minutes comes first)."))
#: The pod's terminationGracePeriodSeconds as compiled, logged beside the measured checkpoint write time.
GRACE_PERIOD_S = declare(Setting(name="LLMPACK_GRACE_PERIOD_S", type=int, default=None, audience="internal",
                                 doc="The pod's compiled grace period, "
                                     "logged as grace_period_s beside checkpoint_save_s."))
#: The user's ``--label KEY=VALUE``s as JSON, compiled into the closing task's pod: its record's tags.
LABELS = declare(Setting(name="LLMPACK_LABELS", type=str, default=None, audience="internal",
                         doc="JSON of the --label KEY=VALUEs compiled in; the record tags them llmpack.label.KEY."))

# Fault injection for tests and benchmarks.
#: ``finetune=2.0[,step=s]``: a step's process starts that many seconds later.
INJECT_START_DELAY = declare(Setting(name="LLMPACK_INJECT_START_DELAY", type=str, default="", audience="test",
                                     doc="STEP=S[,STEP=S]: delay a step's process start by S seconds."))
#: ``finetune=1[:S][,step=N[:S]]``: fail a step's first N attempts after S seconds.
INJECT_FAILURES = declare(Setting(name="LLMPACK_INJECT_FAILURES", type=str, default="", audience="test",
                                  doc="STEP=N[:S][,...]: fail a step's first N attempts, after S seconds."))
#: Seconds a checkpoint write pauses mid-way, so a kill can be aimed at that window.
CHAOS_CHECKPOINT_PAUSE_S = declare(Setting(name="LLMPACK_CHAOS_CHECKPOINT_PAUSE_S", type=float, default=0.0,
                                           audience="test",
                                           doc="Seconds a checkpoint write pauses before its manifest (chaos tests)."))


#: GPU utilisation on GPU steps (components.record.gpu_metrics): on unless set to 0.
GPU_METRICS = declare(Setting(name="LLMPACK_GPU_METRICS", type=bool, default=True,
                              doc="Sample GPU utilisation and memory on GPU steps (NVML, else nvidia-smi); "
                                  "0 turns it off."))
GPU_SAMPLE_INTERVAL_S = declare(Setting(name="LLMPACK_GPU_SAMPLE_INTERVAL_S", type=float, default=1.0,
                                        doc="Seconds between GPU samples on a GPU step."))
GPU_IDLE_UTIL_PCT = declare(Setting(name="LLMPACK_GPU_IDLE_UTIL_PCT", type=float, default=5.0,
                                    doc="A GPU below this utilisation (%) counts as idle "
                                        "in gpu_idle_before_first_step_s."))


def render_markdown() -> str:
    """``docs/configuration.md``: every setting registered so far, grouped by who sets it.

    The backends declare their own settings when they are imported: ``python -m
    llmpack.configuration`` imports every backend first, then calls this.
    """
    lines = ["# Configuration: every LLMPACK_* setting", "",
             "What each `LLMPACK_*` environment variable does, its type and default. Generated from",
             "the one registry, `components/settings.py` (`python -m llmpack.configuration`); a test",
             "keeps this page equal to it. MLflow's own variables (`MLFLOW_TRACKING_URI`, ...) work",
             "as MLflow documents them.", ""]
    titles = {"user": "Settings for users", "internal": "Set by llmpack for its own processes",
              "test": "Fault injection (tests and benchmarks)"}
    for audience, title in titles.items():
        lines += [f"## {title}", "", "| variable | type | default | what it does |", "|---|---|---|---|"]
        for s in sorted(REGISTRY.values(), key=lambda s: s.name):
            if s.audience == audience:
                default = "" if s.default in (None, "") else f"`{s.default}`"
                lines.append(f"| `{s.name}` | {s.type.__name__} | {default} | {s.doc} |")
        lines.append("")
    return "\n".join(lines)

