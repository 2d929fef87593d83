"""The one glossary: every term llmpack's tables, report and docs use, with its short definition.

``python -m llmpack.ui.glossary`` prints docs/glossary.md (a test holds the committed page to it).
The terminal legends (:mod:`llmpack.ui.display`), report.md and report.html read their definitions
from here, so a term means the same thing wherever it is shown. Two figures used to share the
word "overhead", 13x apart; they have two names now: **pipeline overhead** (time: the gaps
between steps) and **billed non-compute** (money: GPU time billed while no step trained or
evaluated).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Term:
    key: str  # how code asks for it
    name: str  # how it is written in tables and text
    short: str  # one line: what the legends print
    detail: str = ""  # more, for docs/glossary.md
    metric: str = ""  # the derived metric it names, where it is one (docs/telemetry-and-cost.md)
    group: str = "time"


GROUPS = (
    ("time", "Time"),
    ("money", "Money and GPU use"),
    ("stats", "Comparing paths"),
    ("words", "Backends and paths"),
    ("model", "The registered model"),
)

# ``name: short`` fits one 80-column terminal line (a test holds it); more goes in ``detail``.
TERMS: tuple[Term, ...] = (
    # ------------------------------------------------------------------ time
    Term(key="spinup", name="spin-up", metric="spinup_s",
         short="submit → the training step's process start (first attempt)",
         detail="What the orchestrator costs before training can begin: scheduling, pod creation, image pull, the "
                "steps before finetune and their hand-overs, on every path alike (a pod that runs those steps "
                "first, the MLflow Job's or a fused one, counts them as separate pods do). A pipeline without a "
                "finetune step: its first step's process start."),
    Term(key="spinup_first", name="spin-up (no finetune)", metric="spinup_s",
         short="submit → first step's process or pod start",
         detail="Spin-up of a pipeline of your own without a finetune step: its first step's process start "
                "(docs/your-pipeline.md)."),
    Term(key="time_to_first_step", name="time to first step", metric="time_to_first_step_s",
         short="submit → first optimizer step done",
         detail="Spin-up, imports, model load and one step: how long until the GPUs do useful work."),
    Term(key="total", name="total", metric="total_s",
         short="submit → run's end (the orchestrator handed over to the closing task)"),
    Term(key="submit_instant", name="submit instant",
         short="when the run was submitted: client clock, else orchestrator's",
         detail="`llmpack.submit_time_source` `client` (exact) or `orchestrator` (Argo's creationTimestamp, whole "
                "seconds; the start of the run `mlflow run` created). Every metric measured from submit "
                "(`spinup_s`, `time_to_first_step_s`, `total_s`, `pipeline_overhead_s`, `gang_ready_s`) means this "
                "instant on every path."),
    Term(key="from_first_pod", name="from first pod", metric="spinup_from_first_pod_s",
         short="timed from the run's earliest pod/process (no submit instant)",
         detail="KFP's own CLI and plain kfp.local pass none (`llmpack.submit_time_source=first_pod`): the metrics "
                "measured from submit are then logged as `spinup_from_first_pod_s`, "
                "`time_to_first_step_from_first_pod_s`, `total_from_first_pod_s`... and `spinup_s` is absent, "
                "so a dashboard across paths never mixes the two."),
    Term(key="step_compute", name="step compute",
         short="each step's process start → finished, over all steps and attempts",
         detail="CPU and GPU steps alike. What pipeline overhead is measured against; not GPU compute."),
    Term(key="pipeline_overhead", name="pipeline overhead", metric="pipeline_overhead_s",
         short="total − step compute: wall time with no step running",
         detail="Seconds, not dollars: orchestrator hand-overs and waits. Not billed non-compute, which is GPU "
                "time billed while a step ran."),
    Term(key="percentiles", name="p50 / p90", short="median and 90th percentile over n runs; p99 only with n >= 10",
         detail="Linear interpolation between closest ranks (numpy 'linear', Hyndman-Fan type 7)."),
    Term(key="tokens_per_s", name="tokens/s", metric="tokens_per_s",
         short="finetune's training tokens per second, every rank counted"),
    Term(key="eval_loss", name="eval loss", metric="eval_loss",
         short="mean token loss of the tuned model on held-out data (lower: better)",
         detail="Cross-entropy per response token, measured by the evaluate step on data the training never saw; "
                "`perplexity` is its exponential. Identical on every path for the same seed (the same weights)."),
    Term(key="base_loss", name="base loss", metric="base_eval_loss",
         short="the same eval loss of the base model, before fine-tuning",
         detail="Measured by the evaluate step on the same held-out split: eval loss below base loss is what the "
                "fine-tuning bought."),
    Term(key="exact_match", name="exact match", metric="tuned_exact_match",
         short="share of held-out prompts answered exactly (greedy), base → tuned",
         detail="The evaluate step answers each held-out prompt greedily (at most 256 prompts; new tokens bounded by "
                "the longest expected answer, at most 64) and compares the answer with the expected one byte for "
                "byte; `base_exact_match` is the base model's, per built-in task `tuned_exact_match_reverse`... "
                "Identical on every path for the same seed (docs/serving.md)."),
    Term(key="normalised_match", name="normalised match", metric="tuned_normalised_match",
         short="exact match after strip, casefold and whitespace collapsed",
         detail="Forgives `Paris ` for `paris`; never a different word. `base_normalised_match` is the base model's."),
    Term(key="gate_metric", name="gate metric", metric="gate_improvement",
         short="what min_improvement judges: exact match where answers exist",
         detail="Pipeline parameter `gate_metric`: `auto` (default: exact match when the held-out split has prompts "
                "to answer, else eval loss), `eval_loss`, `exact_match` or `normalised_match`. The run records "
                "which one gated as the metric `gated_by_<name>` and the improvement it judged as `gate_improvement` "
                "(tuned − base for a match, base − tuned for a loss)."),
    # ------------------------------------------------------------------ money
    Term(key="cost", name="cost", metric="cost_usd", group="money",
         short="GPUs × billed seconds × price per GPU-hour / 3600, every attempt",
         detail="Billed from container start (locally: process start) to finished, plus node provisioning; on a "
                "cluster the GPU nodes' billed time. Dollars are written one way everywhere: 3 significant figures "
                "below $1, cents above."),
    Term(key="projected", name="projected", group="money",
         short="a local run priced as if on the spec's GPU type; no GPU billed",
         detail="A CPU run with 2 × nvidia-h100-80gb in its spec is priced at that GPU's list price, so the "
                "paths' overheads show in dollars. Cluster runs are billed, not projected."),
    Term(key="not_priced", name="n/a (price)", group="money",
         short="a run no step of which asks for a GPU: nothing to price, no cost",
         detail="Its price tags (llmpack.price_per_gpu_hour, llmpack.price_source) read n/a, in the record, "
                "report.json, the report and show_record.py alike. Not unknown: that is a GPU step whose price was "
                "not found (a GPU type in no price table and no --price-per-gpu-hour)."),
    Term(key="gpu_compute", name="GPU compute", group="money",
         short="GPU steps' model loaded → finished, × GPUs (training, evaluating)"),
    Term(key="billed_non_compute", name="billed non-compute", group="money",
         short="cost − GPU compute: start-up, load, hand-overs, retries",
         detail="Dollars, not seconds: the part of the bill in which no step trained or evaluated (on a cluster also "
                "node provisioning and the scale-down tail). Not pipeline overhead, which is wall time between "
                "steps and holds no GPU."),
    Term(key="straggler_waste", name="straggler waste", group="money",
         short="GPU time billed while a gang waits for its slowest node",
         detail="Sum over the gang's GPUs of (gang ready − the GPU's own node ready) × price: every GPU that is "
                "up early is billed while the last node comes up (`llmpack cluster plan project`, docs/plan.md)."),
    Term(key="usd_per_1m_tokens", name="$/1M tokens", metric="usd_per_1m_tokens", group="money",
         short="cost / training tokens × 10⁶"),
    Term(key="preemption_waste", name="preemption waste", metric="preemption_waste_usd", group="money",
         short="GPU time since the last checkpoint + the retry's spin-up",
         detail="Per preemption, priced: the work since the last checkpoint is redone, and the new pod's start-up "
                "and model load to its first step exist only because of the preemption (docs/preemption.md)."),
    Term(key="time_to_recover", name="time to recover", metric="time_to_recover_s", group="time",
         short="a preemption → the retry's first optimizer step",
         detail="The orchestrator's retry delay, the new pod's scheduling and start-up, the steps it reruns "
                "(the MLflow Job reruns main from the start) and the model load."),
    Term(key="goodput", name="goodput", metric="goodput", group="money",
         short="training GPU-s / GPU-s held (GPUs × submit → end, or billed if more)",
         detail="Between 0 and 1, higher is better. For the same training, more wall time or more billed time "
                "can only lower it, so a slower path never looks better. It says how much of the held GPU time "
                "was training, not how fast training was (tokens/s says that)."),
    # ------------------------------------------------------------------ comparing
    Term(key="n", name="n", group="stats", short="succeeded runs of a path behind the figure"),
    Term(key="baseline", name="baseline", group="stats",
         short="the path the others are compared with (direct, or --baseline PATH)"),
    Term(key="delta", name="Δ", group="stats", short="mean of the per-round differences, path − baseline",
         detail="Each round runs every path once, interleaved; a round's difference cancels what the round "
                "shared (a drift of the machine)."),
    Term(key="ci", name="CI", group="stats", short="confidence interval of Δ (Student t, its level shown)",
         detail="The differences the rounds are consistent with. A compare that looks after every round spends "
                "its 5% error rate across the looks, so each look's CI is wider than 95% (97.5%, 99%...); all of "
                "them hold the true Δ at once in at least 95% of compares."),
    Term(key="equivalence_margin", name="equivalence margin", group="stats",
         short="largest Δ that counts as no practical difference (--margin)",
         detail="A path whose whole CI lies within ± the margin is equivalent to the baseline. Default: 25% of "
                "the baseline's median (times: at least 0.5 s)."),
    Term(key="not_judged", name="not judged", group="stats",
         short="one run per path: a figure shown apart, no verdict attempted",
         detail="A headline measured once per path (total and cost in a compare until decided) has no interval: "
                "the terminal and the report show it apart and dimmed, never as a headline. `--repeats 5` judges "
                "it."),
    Term(key="decided", name="decided / undecided", group="stats",
         short="CI excludes 0 or is within ±margin (decided), or neither",
         detail="Decided: faster, slower, cheaper, costlier (the CI excludes 0) or equivalent (the CI lies within "
                "± the equivalence margin). Undecided: the CI straddles 0 and reaches past the margin; more runs "
                "can decide it."),
    Term(key="extrapolated", name="extrapolated", group="stats",
         short="projected past the data: nodes × samples needed > samples measured",
         detail="`llmpack cluster plan project`: the q-quantile of a max over N nodes needs about N / (1 − q) "
                "node samples; "
                "with fewer it rests on an exponential tail fitted past the largest sample (docs/plan.md)."),
    Term(key="plan_estimate", name="plan (estimate)", group="stats",
         short="`llmpack cluster plan`'s figures for a run not yet submitted",
         detail="p50 and p90 with 95% intervals per path × GPU type × on-demand/spot, from the user's own "
                "measured runs (docs/plan.md); a phase "
                "measured on another GPU type or path is marked borrowed. Not the comparison's round plan "
                "(`llmpack compare`'s which-runs-to-submit, llmpack/compare/plan.py)."),
    Term(key="borrowed", name="borrowed", group="stats",
         short="a planned figure resting on a phase measured elsewhere",
         detail="`llmpack cluster plan`: image pull and model load do not depend on the GPU, the orchestrator's "
                "overhead "
                "not on the GPU, provisioning and training not on the path: an option lacking its own runs of "
                "such a phase takes another GPU type's or path's and says so (docs/plan.md)."),
    Term(key="beyond_noise", name="▼ / ▲ / ≈", group="stats",
         short="decidedly lower / higher than the baseline; ≈ equivalent"),
    # ------------------------------------------------------------------ the pack's words
    Term(key="backend", name="backend", group="words",
         short="an orchestrator's package: compile, local run; a cluster one submits",
         detail="`--backend NAME`. Declared once in its own folder against the contract (components/backend.py: "
                "`Backend`, what every backend does) and listed one line each in llmpack/backends.py (more by "
                "`LLMPACK_BACKENDS`); its name is the `llmpack.orchestrator` tag. `direct` is the backend with no "
                "orchestrator: the reference."),
    Term(key="cluster_backend", name="cluster backend", group="words",
         short="a backend that submits to a cluster and knows its own pods",
         detail="`components.backend.ClusterBackend`: its connection, submit and wait, its `compare --cluster` "
                "path, and `recognise_pod`. Registered with `+cluster` (`kfp`, `argo`, `mlflow`); the pack asks "
                "`isinstance(backend, ClusterBackend)`, one way."),
    Term(key="backend_mixin", name="backend mixin", group="words",
         short="an optional capability a backend lists among its bases",
         detail="`LabFacts` (its pod marks and doctor facts: what the lab reads), `OwnAccount` (the "
                "orchestrator's own account of a run: Argo's GPU-hours), `Coloured` (its colour in the report). "
                "A backend without one is asked nothing of it (docs/internals/architecture.md, the backend "
                "contract)."),
    Term(key="orchestrator", name="orchestrator", group="words",
         short="the system a cluster backend drives: KFP, Argo Workflows, MLflow",
         detail="Named as its backend is (`kfp`, `argo`, `mlflow`); only a backend's own folder names it."),
    Term(key="packaging", name="packaging", group="words",
         short="how the steps go into pods: one each, or fused (--fuse)"),
    Term(key="path", name="path", group="words",
         short="one backend in one packaging, as compare runs it (argo+fuse-gpu)",
         detail="What `compare` and the report set side by side. Elsewhere, as in any program, a path is a file's."),
    Term(key="mode", name="mode", group="words",
         short="where a run's steps ran: local (this machine) or cluster (pods)",
         detail="The record's `llmpack.mode`. A compiled package says `cluster` (llmpack's local runs pass `local`), "
                "or `auto` where its orchestrator also runs it here as compiled (KFP's `kfp.local`): `cluster` "
                "inside a Kubernetes pod, else `local`. A step told `cluster` logs to a tracking server only."),
    Term(key="mlflow_roles", name="MLflow, twice", group="words",
         short="the mlflow backend, and the tracking library every path uses",
         detail="`--backend mlflow` runs MLflow Projects (`mlflow_projects/`). `import mlflow`, "
                "`MLFLOW_TRACKING_URI` and the run's record are the tracking library every backend writes to: "
                "they name no backend (tests/test_backend_names.py holds the code to that)."),
    # ------------------------------------------------------------------ the registered model
    Term(key="challenger", name="challenger", group="model",
         short="the registry alias on the newest version a run registered",
         detail="Every registered version takes it (an alias points at one version); the version's "
                "`llmpack.promotion*` tags say why it did or did not also become the champion (docs/serving.md)."),
    Term(key="champion", name="champion", group="model",
         short="the registry alias on the version to ship: best on the same eval set",
         detail="Moves to a new version only when its quality gate passed and its figure beats the champion's on the "
                "same eval set (`llmpack.eval_set`), or when there is none; a tie keeps the incumbent, a champion "
                "scored on other data is not compared, `--no-promote` never moves it. Serve it as "
                "`models:/NAME@champion` (docs/serving.md)."),
    Term(key="seal", name="seal", group="model",
         short="a step's signature over the sha256 of each file of its output",
         detail="Your key's, bound to the pipeline run: prepare_data's split (`llmpack-dataset.seal.json`, or a step "
                "of yours through `split_output`), tokenize's tokens (`llmpack-tokens.seal.json`), finetune's model "
                "(`llmpack-model.seal.json`). The next steps read only a private copy checked against it, so a file "
                "swapped between the steps is refused (docs/serving.md, docs/your-pipeline.md)."),
)

_BY_KEY = {t.key: t for t in TERMS}


def term(key: str) -> Term:
    """The term for ``key`` (a KeyError names a term the glossary lacks: add it here)."""
    return _BY_KEY[key]


def define(key: str) -> str:
    """``name: short definition``, as the legends print it."""
    t = term(key)
    return f"{t.name}: {t.short}"


def legend(keys: tuple[str, ...] | list[str]) -> list[str]:
    """One ``name: definition`` line per key, in the order given."""
    return [define(k) for k in keys]


def render() -> str:
    """docs/glossary.md."""
    lines = [
        "# Glossary",
        "",
        "<!-- generated by `python -m llmpack.ui.glossary > docs/glossary.md`; "
        "edit llmpack/ui/glossary.py, not this page -->",
        "",
        "Every term `llmpack run`, `llmpack compare` and the report use, with the definition their legends print.",
        "How each metric is derived: [telemetry-and-cost.md](telemetry-and-cost.md#derived-metrics).",
        "",
    ]
    for group, title in GROUPS:
        lines += [f"## {title}", "", "| term | metric | definition |", "|---|---|---|"]
        for t in TERMS:
            if t.group != group:
                continue
            text = t.short + (f". {t.detail}" if t.detail else "")
            metric = f"`{t.metric}`" if t.metric else ""
            lines.append(f"| **{t.name}** | {metric} | {text.replace('|', '&#124;')} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
