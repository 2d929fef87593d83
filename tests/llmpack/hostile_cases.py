"""The hostile-input cases ``test_hostile_input.py`` runs: each surface's inputs and the line each must give.

:data:`CASES` are run as real commands in a fresh directory; :data:`ELSEWHERE` are the cases one
command's one line cannot show, each naming its own test (docs/internals/hostile-input.md, "Kept by hand").
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tests.conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "k8s"
PROGRAMS = {"llmpack": "llmpack", "argo": "argo_workflows.local", "kfp": "kfp_pipelines.local",
            "step": "components.run"}
# Root reads mode-000 files anyway: the unreadable cases run it without the capabilities that allow that.
DROP_READ_CAPS = ("setpriv", "--bounding-set=-dac_override,-dac_read_search")


@dataclass(frozen=True, kw_only=True)
class Case:
    """One hostile input: the files to build, the command to run on them, and what its one line must say."""

    id: str
    surface: str
    input: str  # the table's description of the input (markdown)
    argv: tuple[str, ...]
    expect: str  # a part of the error line that names the problem
    program: Literal["llmpack", "argo", "kfp", "step"] = "llmpack"
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    setup: Callable[[Path], None] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    unreadable: tuple[str, ...] = ()  # made mode 000
    read_only: tuple[str, ...] = ()  # made mode 444 (a file) or 555 (a directory), run as unreadable ones are
    full_disk: str | None = None  # a directory made a full 64 KiB tmpfs (or, where none can be mounted, simulated)
    stdout: Literal["pipe", "/dev/full"] = "pipe"


ROW = '{"prompt": "Add: 1+2", "response": "3"}\n'
POD_DUMP = json.loads((FIXTURES / "pods.json").read_text(encoding="utf-8"))
KFP_PACKAGE = (REPO / "kfp_pipelines" / "finetune.yaml").read_text(encoding="utf-8")
ARGO_WORKFLOW = (REPO / "argo_workflows" / "finetune.yaml").read_text(encoding="utf-8")
DEEP_JSON = "[" * 100_000 + "]" * 100_000


def pods_with(edit: Callable[[list[dict]], None]) -> str:
    """The recorded pod dump with one hostile edit."""
    doc = json.loads(json.dumps(POD_DUMP))
    edit(doc["items"])
    return json.dumps(doc)


def _set(path: str, value: object, index: int = 1) -> Callable[[list[dict]], None]:
    def edit(items: list[dict]) -> None:
        obj = items[index]
        *parents, last = path.split(".")
        for key in parents:
            obj = obj[key]
        obj[last] = value

    return edit


def fifo(name: str) -> Callable[[Path], None]:
    return lambda d: os.mkfifo(d / name)


def symlink(name: str, target: str) -> Callable[[Path], None]:
    return lambda d: os.symlink(target, d / name)


def sparse(name: str, size: int) -> Callable[[Path], None]:
    """A file of ``size`` zero bytes that takes no disk (a size limit's input)."""
    def make(d: Path) -> None:
        with (d / name).open("wb") as fh:
            fh.truncate(size)

    return make


def run(*args: str) -> tuple[str, ...]:
    """``llmpack run`` with an output directory whose absence afterwards shows nothing was started."""
    return ("run", *args, "--output-dir", "runs")


def compare(*args: str) -> tuple[str, ...]:
    return ("compare", *args, "--output-dir", "runs", "--report", "report")


CANARY = "CANARYPASS"  # a password no output may show (tests/llmpack/test_secret_redaction.py checks every command)
BOMB = "\n".join(['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'] + [
    f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]"
    for prev, cur in zip("abcdefgh", "bcdefghi", strict=True)]) + "\n"
PRICES = "prices:\n  - {gpu: nvidia-l4, per_gpu_hour: 0.8, source: contract, as_of: 2026-11}\n"

CASES: tuple[Case, ...] = (
    # ------------------------------------------------------------------ JSONL data
    Case(id="jsonl-latin1", surface="JSONL data", input="`run --data latin1.jsonl`: line 2 is Latin-1, not UTF-8",
         files={"latin1.jsonl": ROW.encode() + '{"prompt": "café", "response": "x"}\n'.encode("latin-1")},
         argv=run("--data", "latin1.jsonl"), expect="latin1.jsonl:2: not UTF-8 text"),
    Case(id="jsonl-deep", surface="JSONL data", input="`run --data deep.jsonl`: a value nested 100,000 deep",
         files={"deep.jsonl": DEEP_JSON + "\n"}, argv=run("--data", "deep.jsonl"),
         expect="deep.jsonl:1: JSON nested too deeply"),
    Case(id="jsonl-surrogate", surface="JSONL data",
         input='`run --data s.jsonl`: `"\\ud800"` (a lone surrogate) in a prompt',
         files={"s.jsonl": ROW + '{"prompt": "\\ud800", "response": "x"}\n'}, argv=run("--data", "s.jsonl"),
         expect="s.jsonl:2: field 'prompt' holds a lone surrogate"),
    Case(id="jsonl-number-response", surface="JSONL data", input="`run --data n.jsonl`: `\"response\": 1e999`",
         files={"n.jsonl": '{"prompt": "a", "response": 1e999}\n'}, argv=run("--data", "n.jsonl"),
         expect="n.jsonl:1: field 'response' must be a string"),
    Case(id="jsonl-fifo", surface="JSONL data", input="`run --data pipe.jsonl`: a named pipe, not a file",
         setup=fifo("pipe.jsonl"), argv=run("--data", "pipe.jsonl"), expect="pipe.jsonl: not a regular file"),
    Case(id="jsonl-spaces-unicode", surface="paths",
         input="`run --data 'my data/dätä ü.jsonl'`: spaces and unicode, row 3 bad",
         files={"my data/dätä ü.jsonl": ROW * 2 + '{"prompt": "x"}\n'}, argv=run("--data", "my data/dätä ü.jsonl"),
         expect="my data/dätä ü.jsonl:3: missing field 'response'"),
    Case(id="jsonl-dangling-symlink", surface="symlinks", input="`run --data link.jsonl`: a symlink to a missing file",
         setup=symlink("link.jsonl", "gone.jsonl"), argv=run("--data", "link.jsonl"),
         expect="link.jsonl: broken symbolic link (to gone.jsonl)"),
    Case(id="jsonl-symlink-loop", surface="symlinks", input="`run --data loop.jsonl`: a symlink to itself",
         setup=symlink("loop.jsonl", "loop.jsonl"), argv=run("--data", "loop.jsonl"),
         expect="loop.jsonl: symbolic link loop"),
    Case(id="jsonl-unreadable", surface="unreadable files", input="`run --data secret.jsonl`: mode 000",
         files={"secret.jsonl": ROW * 2}, unreadable=("secret.jsonl",), argv=run("--data", "secret.jsonl"),
         expect="secret.jsonl: cannot read (Permission denied)"),
    Case(id="jsonl-compare", surface="JSONL data", input="`compare --data rows.jsonl`: line 2 cut short",
         files={"rows.jsonl": ROW + '{"prompt": "a", "resp\n'}, argv=compare("--data", "rows.jsonl"),
         expect="rows.jsonl:2: malformed JSON"),
    # ------------------------------------------------------------------ --param
    Case(id="param-nan", surface="--param", input="`run --param lr=nan`", argv=run("--param", "lr=nan"),
         expect="--param lr: nan is not allowed; must be a finite number > 0"),
    Case(id="param-fraction", surface="--param", input="`run --param eval_fraction=1.5`",
         argv=run("--param", "eval_fraction=1.5"),
         expect="--param eval_fraction: 1.5 is not allowed; must be between 0 and 1"),
    Case(id="param-method", surface="--param", input="`compare --param method=qlora`",
         argv=compare("--param", "method=qlora"),
         expect="--param method: 'qlora' is not allowed; must be 'lora' or 'full'"),
    Case(id="param-type", surface="--param", input="`run --param batch_size=8.5`",
         argv=run("--param", "batch_size=8.5"), expect="--param batch_size: '8.5' is not a valid int"),
    Case(id="param-unknown", surface="--param", input="`run --param learning_rate=0.1` (unknown name)",
         argv=run("--param", "learning_rate=0.1"), expect="--param 'learning_rate': unknown pipeline parameter"),
    Case(id="param-telemetry", surface="--param",
         input="`run --param run_group=x` (a telemetry value, not a parameter)",
         argv=run("--param", "run_group=x"), expect="--param 'run_group': unknown pipeline parameter"),
    Case(id="param-no-equals", surface="--param", input="`run --param lr`", argv=run("--param", "lr"),
         expect="--param 'lr': expected NAME=VALUE"),
    Case(id="param-submit", surface="--param", input="`submit kfp --param seq_len=4` (checked before any request)",
         argv=("cluster", "submit", "kfp", "--host", "http://127.0.0.1:9", "--param", "seq_len=4"),
         expect="--param seq_len: 4 is not allowed; must be at least 8"),
    # ------------------------------------------------------------------ price YAML
    Case(id="price-latin1", surface="price YAML", input="`run --price-file p.yaml`: Latin-1 bytes",
         files={"p.yaml": "# café\n".encode("latin-1") + PRICES.encode()}, argv=run("--price-file", "p.yaml"),
         expect="p.yaml: not UTF-8 text"),
    Case(id="price-syntax", surface="price YAML", input="`run --price-file p.yaml`: an unclosed `[` on line 2",
         files={"p.yaml": "prices:\n  - [gpu: nvidia-l4\n"}, argv=run("--price-file", "p.yaml"),
         expect="p.yaml: not valid YAML (line 3: expected ',' or ']'"),
    Case(id="price-negative", surface="price YAML", input="`run --price-file p.yaml`: `per_gpu_hour: -1`",
         files={"p.yaml": PRICES.replace("0.8", "-1")}, argv=run("--price-file", "p.yaml"),
         expect="p.yaml: prices[0].per_gpu_hour: price -1 must be a finite number >= 0"),
    Case(id="price-bool", surface="price YAML", input="`run --price-file p.yaml`: `per_gpu_hour: yes`",
         files={"p.yaml": PRICES.replace("0.8", "yes")}, argv=run("--price-file", "p.yaml"),
         expect="p.yaml: prices[0].per_gpu_hour: price True is not a number"),
    Case(id="price-gpu-list", surface="price YAML", input="`run --price-file p.yaml`: `gpu: [a, b]`",
         files={"p.yaml": PRICES.replace("nvidia-l4", "[a, b]")}, argv=run("--price-file", "p.yaml"),
         expect="p.yaml: prices[0].gpu: ['a', 'b'] is not a GPU type name"),
    Case(id="price-no-list", surface="price YAML", input="`run --price-file p.yaml`: `prices: {}`",
         files={"p.yaml": "prices: {}\n"}, argv=run("--price-file", "p.yaml"),
         expect="p.yaml: expected a top-level 'prices:' list"),
    Case(id="price-dir", surface="price YAML", input="`run --price-file prices/`: a directory",
         setup=lambda d: (d / "prices").mkdir(), argv=run("--price-file", "prices"),
         expect="prices: cannot read price file (Is a directory)"),
    Case(id="price-unreadable", surface="unreadable files", input="`run --price-file 'my prices.yaml'`: mode 000",
         files={"my prices.yaml": PRICES}, unreadable=("my prices.yaml",), argv=run("--price-file", "my prices.yaml"),
         expect="my prices.yaml: cannot read price file (Permission denied)"),
    # ------------------------------------------------------------------ control-plane costs
    Case(id="cp-yaml-case", surface="control-plane YAML", input="`compare --control-plane-costs cp.yaml`: `Argo: 120`",
         files={"cp.yaml": "Argo: 120\n"}, argv=compare("--control-plane-costs", "cp.yaml"),
         expect="cp.yaml: Argo: unknown orchestrator 'Argo' (choose from kfp, argo, mlflow); did you mean 'argo'?"),
    Case(id="cp-yaml-unknown", surface="control-plane YAML",
         input="`compare --control-plane-costs cp.yaml`: `airflow: 100`",
         files={"cp.yaml": "airflow: 100\n"}, argv=compare("--control-plane-costs", "cp.yaml"),
         expect="cp.yaml: airflow: unknown orchestrator 'airflow'"),
    Case(id="cp-yaml-negative", surface="control-plane YAML",
         input="`compare --control-plane-costs cp.yaml`: `kfp: -450`",
         files={"cp.yaml": "kfp: -450\n"}, argv=compare("--control-plane-costs", "cp.yaml"),
         expect="cp.yaml: kfp: must be >= 0 USD per month"),
    Case(id="cp-yaml-bool", surface="control-plane YAML", input="`compare --control-plane-costs cp.yaml`: `kfp: yes`",
         files={"cp.yaml": "kfp: yes\n"}, argv=compare("--control-plane-costs", "cp.yaml"),
         expect="cp.yaml: kfp: True is not a number of USD per month"),
    Case(id="cp-yaml-latin1", surface="control-plane YAML",
         input="`compare --control-plane-costs cp.yaml`: Latin-1 bytes",
         files={"cp.yaml": "# coût\nkfp: 450\n".encode("latin-1")}, argv=compare("--control-plane-costs", "cp.yaml"),
         expect="cp.yaml: not UTF-8 text"),
    Case(id="cp-yaml-syntax", surface="control-plane YAML",
         input="`compare --control-plane-costs cp.yaml`: `kfp: [450`",
         files={"cp.yaml": "kfp: [450\n"}, argv=compare("--control-plane-costs", "cp.yaml"),
         expect="cp.yaml: not valid YAML (line 2"),
    Case(id="cp-yaml-list", surface="control-plane YAML", input="`compare --control-plane-costs cp.yaml`: a list",
         files={"cp.yaml": "- kfp: 450\n"}, argv=compare("--control-plane-costs", "cp.yaml"),
         expect="cp.yaml: expected a mapping like 'kfp: 450'"),
    Case(id="cp-flag-inf", surface="control-plane flags", input="`compare --control-plane-cost kfp=1e400`",
         argv=compare("--control-plane-cost", "kfp=1e400"), expect="'1e400' is not a number of USD per month"),
    Case(id="cp-flag-empty", surface="control-plane flags", input="`compare --control-plane-cost mlflow=`",
         argv=compare("--control-plane-cost", "mlflow="), expect="--control-plane-cost mlflow=: '' is not a number"),
    # ------------------------------------------------------------------ flags
    Case(id="flag-backend-case", surface="flags", input="`run --backend KFP`", argv=run("--backend", "KFP"),
         expect="--backend 'KFP': choose one of direct, kfp, argo, mlflow; did you mean 'kfp'?"),
    Case(id="flag-backends-case", surface="flags", input="`compare --backends kfp,Argo`",
         argv=compare("--backends", "kfp,Argo"), expect="--backends: unknown backend 'Argo'"),
    Case(id="flag-repeats-negative", surface="flags", input="`compare --repeats -1`", argv=compare("--repeats", "-1"),
         expect="--repeats -1: must be at least 1"),
    Case(id="flag-price-negative", surface="flags", input="`run --price-per-gpu-hour -2`",
         argv=run("--price-per-gpu-hour", "-2"),
         expect="--price-per-gpu-hour: price '-2' must be a finite number >= 0"),
    Case(id="flag-delay-negative", surface="flags", input="`compare --inject-start-delay=-1`",
         argv=compare("--inject-start-delay=-1"), expect="--inject-start-delay '-1': seconds must be >= 0"),
    Case(id="flag-image", surface="flags", input="`compile --image 'my image:latest'`",
         argv=("compile", "--out", "out", "--image", "my image:latest"),
         expect="--image 'my image:latest': not a container image"),
    Case(id="flag-label", surface="flags", input="`compile --label 'team=ml platform'`",
         argv=("compile", "--out", "out", "--label", "team=ml platform"),
         expect="--label 'team=ml platform': value 'ml platform' is not a label value"),
    Case(id="flag-output-dir-file", surface="paths", input="`run --output-dir 'rüns 1'`: an existing file",
         files={"rüns 1": "keep me\n"}, argv=("run", "--output-dir", "rüns 1"),
         expect="--output-dir rüns 1: exists and is not a directory"),
    # ------------------------------------------------------------------ kubectl dumps
    Case(id="pods-labels-list", surface="kubectl dumps",
         input="`timeline --pods pods.json`: `metadata.labels` is a list",
         files={"pods.json": pods_with(_set("metadata.labels", ["a"]))},
         argv=("cluster", "timeline", "--pods", "pods.json"),
         expect="pods.json: items[1] (pod llmpack/llm-finetune-7tq4m-system-container-impl-1183460071): "
                "metadata.labels is an array"),
    Case(id="pods-name-number", surface="kubectl dumps", input="`timeline --pods pods.json`: `metadata.name: 7`",
         files={"pods.json": pods_with(_set("metadata.name", 7, 0))},
         argv=("cluster", "timeline", "--pods", "pods.json"),
         expect="pods.json: items[0]: metadata.name is a number, expected a string"),
    Case(id="pods-statuses-object", surface="kubectl dumps",
         input="`timeline --pods pods.json`: `containerStatuses` is an object",
         files={"pods.json": pods_with(_set("status.containerStatuses", {"main": {}}))},
         argv=("cluster", "timeline", "--pods", "pods.json"),
         expect="status.containerStatuses is an object, expected an array"),
    Case(id="pods-deep", surface="kubectl dumps", input="`timeline --pods pods.json`: nested 100,000 deep",
         files={"pods.json": '{"items": ' + DEEP_JSON + "}"}, argv=("cluster", "timeline", "--pods", "pods.json"),
         expect="pods.json: JSON nested too deeply"),
    Case(id="pods-utf16", surface="kubectl dumps", input="`timeline --pods pods.json`: saved as UTF-16",
         files={"pods.json": json.dumps(POD_DUMP).encode("utf-16")},
         argv=("cluster", "timeline", "--pods", "pods.json"),
         expect="pods.json: not UTF-8 text"),
    Case(id="events-dir", surface="kubectl dumps", input="`timeline --events events/`: a directory",
         files={"pods.json": json.dumps(POD_DUMP)}, setup=lambda d: (d / "events").mkdir(),
         argv=("cluster", "timeline", "--pods", "pods.json", "--events", "events"),
         expect="events: is a directory, expected a 'kubectl get events -o json' file"),
    Case(id="pods-unreadable", surface="unreadable files", input="`timeline --pods pods.json`: mode 000",
         files={"pods.json": json.dumps(POD_DUMP)}, unreadable=("pods.json",),
         argv=("cluster", "timeline", "--pods", "pods.json"),
         expect="pods.json: cannot read (Permission denied)"),
    Case(id="timeline-stdout-full", surface="full disk", input="`timeline --json > /dev/full`: stdout on a full device",
         files={"pods.json": json.dumps(POD_DUMP)}, stdout="/dev/full",
         argv=("cluster", "timeline", "--pods", "pods.json", "--json"),
         expect="standard output: cannot write the result (No space left on device)"),
    # ------------------------------------------------------------------ compiled YAML to a local runner
    Case(id="argo-kfp-package", surface="compiled YAML, local runner", program="argo",
         input="`python -m argo_workflows.local pipeline.yaml`: the KFP package", files={"pipeline.yaml": KFP_PACKAGE},
         argv=("pipeline.yaml", "--workdir", "wd"), expect="this is a KFP pipeline package, not an Argo Workflow"),
    Case(id="argo-two-docs", surface="compiled YAML, local runner", program="argo",
         input="`python -m argo_workflows.local wf.yaml`: two Workflows in one file",
         files={"wf.yaml": ARGO_WORKFLOW + "---\n" + ARGO_WORKFLOW}, argv=("wf.yaml", "--workdir", "wd"),
         expect="expected one Workflow document, found 2"),
    Case(id="argo-utf16", surface="compiled YAML, local runner", program="argo",
         input="`python -m argo_workflows.local wf.yaml`: saved as UTF-16",
         files={"wf.yaml": ARGO_WORKFLOW.encode("utf-16")},
         argv=("wf.yaml", "--workdir", "wd"), expect="workflow file wf.yaml is not UTF-8 text"),
    Case(id="argo-dir", surface="compiled YAML, local runner", program="argo",
         input="`python -m argo_workflows.local wf/`: a directory", setup=lambda d: (d / "wf").mkdir(),
         argv=("wf", "--workdir", "wd"), expect="workflow file wf is not a regular file"),
    Case(id="argo-unknown-param", surface="compiled YAML, local runner", program="argo",
         input="`python -m argo_workflows.local wf.yaml -p learning_rate=1`", files={"wf.yaml": ARGO_WORKFLOW},
         argv=("wf.yaml", "-p", "learning_rate=1", "--workdir", "wd"),
         expect="unknown workflow parameter 'learning_rate'"),
    Case(id="argo-unreadable", surface="unreadable files", program="argo",
         input="`python -m argo_workflows.local wf.yaml`: mode 000", files={"wf.yaml": ARGO_WORKFLOW},
         unreadable=("wf.yaml",),
         argv=("wf.yaml", "--workdir", "wd"), expect="workflow file wf.yaml: cannot read (Permission denied)"),
    Case(id="kfp-argo-yaml", surface="compiled YAML, local runner", program="kfp",
         input="`python -m kfp_pipelines.local wf.yaml`: the Argo Workflow as a KFP package",
         files={"wf.yaml": ARGO_WORKFLOW, "args.json": "{}"},
         argv=("wf.yaml", "--pipeline-root", "root", "--arguments", "args.json"),
         expect="package wf.yaml: not a compiled KFP pipeline (it is a Workflow)"),
    Case(id="kfp-bad-arguments", surface="compiled YAML, local runner", program="kfp",
         input="`python -m kfp_pipelines.local pipeline.yaml --arguments args.json`: not JSON",
         files={"pipeline.yaml": KFP_PACKAGE, "args.json": "lr: 0.1\n"},
         argv=("pipeline.yaml", "--pipeline-root", "root", "--arguments", "args.json"),
         expect="--arguments args.json: line 1 column 1: not valid JSON"),
    Case(id="step-unknown-param", surface="compiled YAML, local runner", program="step",
         input="`python -m components.run …prepare_data --param nosuch=1`",
         argv=("components.steps.prepare_data:prepare_data", "--output", "dataset=out", "--param", "nosuch=1"),
         expect="step 'prepare-data': unknown parameter 'nosuch'"),
    # ------------------------------------------------------------------ environment variables
    Case(id="env-price", surface="env vars", input="`LLMPACK_PRICE_PER_GPU_HOUR=cheap llmpack run`",
         env={"LLMPACK_PRICE_PER_GPU_HOUR": "cheap"}, argv=run(),
         expect="LLMPACK_PRICE_PER_GPU_HOUR: price 'cheap' is not a number"),
    Case(id="env-price-file", surface="env vars", input="`LLMPACK_PRICE_FILE=missing.yaml llmpack run`",
         env={"LLMPACK_PRICE_FILE": "missing.yaml"}, argv=run(),
         expect="missing.yaml: cannot read price file (No such file or directory)"),
    Case(id="env-provider", surface="env vars", input="`LLMPACK_PRICE_PROVIDER=acme llmpack run`",
         env={"LLMPACK_PRICE_PROVIDER": "acme"}, argv=run(),
         expect="LLMPACK_PRICE_PROVIDER='acme': no price list from that provider"),
    Case(id="env-tracking-uri", surface="env vars", input="`MLFLOW_TRACKING_URI=nosuch://x llmpack report`",
         env={"MLFLOW_TRACKING_URI": "nosuch://x"}, argv=("report", "--run-group", "rg-x", "--out", "report"),
         expect="MLflow tracking URI nosuch://x: MLflow cannot open it"),
    # ------------------------------------------------------------------ run-group ids
    Case(id="rg-too-long", surface="run-group ids", input="`run --run-group` of 64 characters",
         argv=run("--run-group", "r" * 64), expect="--run-group 'rrrr"),
    Case(id="rg-unicode", surface="run-group ids", input="`compare --run-group rg-ü`",
         argv=compare("--run-group", "rg-ü"), expect="--run-group 'rg-ü': must be a DNS-1123 label"),
    Case(id="rg-space-submit", surface="run-group ids",
         input="`submit argo --run-group 'x y'` (checked before any request)",
         argv=("cluster", "submit", "argo", "--host", "127.0.0.1:9", "--run-group", "x y"),
         expect="--run-group 'x y': must be a DNS-1123 label"),
    Case(id="rg-empty-report", surface="run-group ids", input="`report --run-group ''`",
         argv=("report", "--run-group", ""), expect="--run-group '': must be a DNS-1123 label"),
    # ------------------------------------------------------------------ a full disk
    Case(id="compile-full-disk", surface="full disk",
         input="`compile --out 'full/out dir'` on a full 64 KiB file system",
         full_disk="full", argv=("compile", "--out", "full/out dir"),
         expect="--out full/out dir: cannot write the compiled artifacts (No space left on device); "
                "nothing was written"),
    # ============================================================ secrets in URIs, YAML bombs (one block: merges apart)
    Case(id="uri-port-letters-run", surface="secrets in URIs",
         input="`run --tracking-uri 'https://alice:CANARYPASS@host:50OO'`",
         argv=run("--tracking-uri", f"https://alice:{CANARY}@host:50OO"),
         expect="--tracking-uri https://***@host:50OO: port '50OO' is not a number from 1 to 65535"),
    Case(id="uri-port-99999-report", surface="secrets in URIs",
         input="`report --tracking-uri 'https://alice:CANARYPASS@host:99999'`",
         argv=("report", "--run-group", "rg-x", "--tracking-uri", f"https://alice:{CANARY}@host:99999",
               "--out", "report"),
         expect="--tracking-uri https://***@host:99999: port '99999' is not a number from 1 to 65535"),
    Case(id="uri-ipv6-sync", surface="secrets in URIs",
         input="`sync RUN_DIR --tracking-uri 'https://alice:CANARYPASS@[::1:5000'`",
         argv=("sync", "runs/rg-x", "--tracking-uri", f"https://alice:{CANARY}@[::1:5000"),
         expect="--tracking-uri https://***@[::1:5000: host '[::1:5000': an IPv6 address needs its closing ']'"),
    Case(id="uri-query-token-compare", surface="secrets in URIs",
         input="`compare --tracking-uri 'https://[::1]:99999/?access_token=CANARYPASS'`",
         argv=compare("--tracking-uri", f"https://[::1]:99999/?access_token={CANARY}"),
         expect="--tracking-uri https://[::1]:99999/?access_token=***: port '99999' is not a number"),
    Case(id="uri-env-run", surface="secrets in URIs",
         input="`MLFLOW_TRACKING_URI='https://alice:CANARYPASS@host:50OO' llmpack run`",
         env={"MLFLOW_TRACKING_URI": f"https://alice:{CANARY}@host:50OO"}, argv=run(),
         expect="MLFLOW_TRACKING_URI https://***@host:50OO: port '50OO' is not a number"),
    Case(id="uri-doctor-host", surface="secrets in URIs", input="`doctor --kfp-host 'alice:CANARYPASS@host:50OO'`",
         argv=("cluster", "doctor", "--kfp-host", f"alice:{CANARY}@host:50OO"),
         expect="--kfp-host ***@host:50OO: port '50OO' is not a number"),
    Case(id="yaml-bomb-price", surface="YAML bombs",
         input="`run --price-file bomb.yaml`: nine levels of nine aliases (342 bytes)",
         files={"bomb.yaml": BOMB}, argv=run("--price-file", "bomb.yaml"),
         expect="bomb.yaml: not valid YAML (line 2: alias *a is not accepted"),
    Case(id="yaml-bomb-control-plane", surface="YAML bombs",
         input="`compare --control-plane-costs bomb.yaml`: the same bomb",
         files={"bomb.yaml": BOMB}, argv=compare("--control-plane-costs", "bomb.yaml"),
         expect="bomb.yaml: not valid YAML (line 2: alias *a is not accepted"),
    Case(id="yaml-merge-key", surface="YAML bombs", input="`run --price-file p.yaml`: a merge key `<<: *base`",
         files={"p.yaml": "base: &base {gpu: nvidia-l4}\nprices:\n  - <<: *base\n    per_gpu_hour: 1\n"},
         argv=run("--price-file", "p.yaml"), expect="p.yaml: not valid YAML (line 3: alias *base is not accepted"),
    Case(id="yaml-too-big", surface="YAML bombs", input="`compare --control-plane-costs big.yaml`: 16 MiB + 1 byte",
         setup=sparse("big.yaml", 16 * 1024 * 1024 + 1), argv=compare("--control-plane-costs", "big.yaml"),
         expect="big.yaml: larger than the 16 MiB limit for a YAML file"),
    # ------------------------------------------------------------------ the parameter gate: names, stores, mounts
    # (components.names; each row's input names its test id; `mlflow run` itself: tests/llmpack/test_names_gate.py)
    Case(id="gate-argo-run-dotdot", surface="run ids", program="argo", files={"wf.yaml": ARGO_WORKFLOW},
         input="`python -m argo_workflows.local wf.yaml -p pipeline_run=../../X` (test `gate-argo-run-dotdot`)",
         argv=("wf.yaml", "-p", "pipeline_run=../../X"),
         expect="workflow parameter pipeline_run: '../../X' must be a DNS-1123 label"),
    Case(id="gate-argo-run-quote", surface="run ids", program="argo", files={"wf.yaml": ARGO_WORKFLOW},
         input="`python -m argo_workflows.local wf.yaml -p \"pipeline_run=it's\"` (test `gate-argo-run-quote`)",
         argv=("wf.yaml", "-p", "pipeline_run=it's"),
         expect="""workflow parameter pipeline_run: "it's" must be a DNS-1123 label"""),
    Case(id="gate-kfp-run-dotdot", surface="run ids", program="kfp",
         files={"pipeline.yaml": KFP_PACKAGE, "args.json": '{"pipeline_run": "../../X"}'},
         input="`python -m kfp_pipelines.local pipeline.yaml --arguments args.json`: `pipeline_run` `../../X` "
               "(test `gate-kfp-run-dotdot`)",
         argv=("pipeline.yaml", "--pipeline-root", "root", "--arguments", "args.json"),
         expect="--arguments args.json: pipeline_run: '../../X' must be a DNS-1123 label"),
    Case(id="gate-kfp-run-quote", surface="run ids", program="kfp",
         files={"pipeline.yaml": KFP_PACKAGE, "args.json": '{"pipeline_run": "it\'s", "run_group": "rg"}'},
         input="`python -m kfp_pipelines.local pipeline.yaml --arguments args.json`: `pipeline_run` `it's` "
               "(test `gate-kfp-run-quote`)",
         argv=("pipeline.yaml", "--pipeline-root", "root", "--arguments", "args.json"),
         expect="""--arguments args.json: pipeline_run: "it's" must be a DNS-1123 label"""),
    Case(id="gate-model-name-slash", surface="--param",
         input="`run --param model_name=team/llama` (test `gate-model-name-slash`)",
         argv=run("--param", "model_name=team/llama"),
         expect="--param model_name: 'team/llama' is not allowed; must be an MLflow "
         "registered-model name"),
    Case(id="gate-model-name-100k", surface="--param",
         input="`run --param model_name=` 100,000 characters (test `gate-model-name-100k`)",
         argv=run("--param", "model_name=" + "m" * 100_000),
         expect="--param model_name: 100,000 characters; at most 6,000"),
    Case(id="gate-model-name-300", surface="--param",
         input="`run --param model_name=` 300 characters: MLflow registers at most 256 (test `gate-model-name-300`)",
         argv=run("--param", "model_name=" + "m" * 300),
         expect="(300 characters) is not allowed; must be an MLflow registered-model name"),
    Case(id="gate-argo-model-name", surface="--param", program="argo", files={"wf.yaml": ARGO_WORKFLOW},
         input="`python -m argo_workflows.local wf.yaml -p model_name=team/llama` (test `gate-argo-model-name`)",
         argv=("wf.yaml", "-p", "model_name=team/llama"),
         expect="model_name: 'team/llama' must not contain '/' or ':'"),
    Case(id="gate-sqlite-read-only", surface="tracking store",
         input="`run --tracking-uri sqlite:///ro/mlflow.db`: the file mode 444 (test `gate-sqlite-read-only`)",
         files={"ro/mlflow.db": b""}, read_only=("ro/mlflow.db",), argv=run("--tracking-uri", "sqlite:///ro/mlflow.db"),
         expect="MLflow tracking store ro/mlflow.db: not writable (read-only file)"),
    Case(id="gate-sqlite-read-only-dir", surface="tracking store",
         input="`run --tracking-uri sqlite:///ro/mlflow.db`: its directory mode 555 (test `gate-sqlite-read-only-dir`)",
         files={"ro/mlflow.db": b""}, read_only=("ro",), argv=run("--tracking-uri", "sqlite:///ro/mlflow.db"),
         expect="MLflow tracking store ro/mlflow.db: its directory ro is not writable"),
    Case(id="gate-model-pvc-etc", surface="pod flags",
         input="`compile --model-pvc pvc:/etc` (test `gate-model-pvc-etc`)",
         argv=("compile", "--model-pvc", "pvc:/etc", "--out", "out"),
         expect="--model-pvc 'pvc:/etc': /etc is in the system directory /etc"),
    Case(id="gate-checkpoint-pvc-secrets", surface="pod flags",
         input="`compile --checkpoint-pvc ck:/var/run/secrets` (test `gate-checkpoint-pvc-secrets`)",
         argv=("compile", "--checkpoint-pvc", "ck:/var/run/secrets", "--out", "out"),
         expect="--checkpoint-pvc 'ck:/var/run/secrets': /var/run/secrets is in the system directory /var/run/secrets"),
    Case(id="gate-data-pvc-var", surface="pod flags",
         input="`submit argo --data-pvc d:/var` (test `gate-data-pvc-var`)",
         argv=("cluster", "submit", "argo", "--host", "127.0.0.1:9", "--data-pvc", "d:/var"),
         expect="--data-pvc 'd:/var': /var would hide the system directory"),
    Case(id="gate-repository-uri-shell", surface="pod flags",
         input="`compile --mlflow-repository-uri '$(id)'` (test `gate-repository-uri-shell`)",
         argv=("compile", "--mlflow-repository-uri", "$(id)", "--out", "out"),
         expect="--mlflow-repository-uri '$(id)': not an image repository"),
)


@dataclass(frozen=True, kw_only=True)
class Elsewhere:
    """A hostile case one command's one line cannot show (a step's resume, a traceback, a whole run's files): its
    test."""

    surface: str
    input: str
    behaviour: str
    test: str  # tests/<file>.py::<function>


ELSEWHERE: tuple[Elsewhere, ...] = (
    Elsewhere(surface="Kubernetes API", input="a server that answers every call with an HTML page, not JSON",
              behaviour="one line `the Kubernetes API answered with something that is not JSON (it starts ...)`, "
              "a short redacted excerpt, no traceback",
              test="tests/llmpack/cluster/k8s/test_hostile_api.py::test_an_answer_that_is_not_json_is_one_line"),
    Elsewhere(surface="Kubernetes API",
              input="a watch stream with a line that is not JSON and an event whose object is "
              "a string", behaviour="both passed over; the watch ends at its deadline with the rows it has",
              test="tests/llmpack/cluster/k8s/test_hostile_api.py::test_broken_watch_events_are_passed_over"),
    Elsewhere(surface="Kubernetes API", input="a server that takes 20 s to answer, the watch given 3 s",
              behaviour="one line `... (timed out) while trying to read namespace ...` within the deadline (a "
              "timed-out read is not retried; the first reads are bounded by the run's deadline)",
              test="tests/llmpack/cluster/k8s/test_hostile_api.py::test_a_slow_server_cannot_hold_the_watch_past_its_deadline"),
    # ============================================================== checkpoints, redaction, YAML bombs, the canary scan
    Elsewhere(surface="checkpoints",
              input="a pickle whose `__reduce__` creates a file, planted as every state file of the "
              "newest checkpoint, its manifest's sha256 rewritten to match",
              behaviour="no code runs (the file is never created); one line `finetune: warning: skipping unreadable "
              "checkpoint ...`; resumed from the previous checkpoint",
              test="tests/components/test_checkpoint_security.py::test_a_planted_pickle_with_a_matching_manifest_runs_no_code"),
    Elsewhere(surface="checkpoints", input="the same, on the real finetune step rerun with `checkpoint_dir` (slow)",
              behaviour="no code runs; resumed from step 2; the adapter byte-identical to the first run's",
              test="tests/components/test_checkpoint_security.py::"
                   "test_the_finetune_step_resumes_past_a_planted_pickle_without_running_it"),
    Elsewhere(surface="checkpoints", input="random bytes as `state.safetensors` or `state.json`, the manifest matching",
              behaviour="one warning naming the file; the previous checkpoint is used",
              test="tests/components/test_checkpoint_security.py::"
                   "test_garbage_with_a_matching_manifest_falls_back_to_the_previous_checkpoint"),
    Elsewhere(surface="checkpoints", input="a checkpoint whose manifest names another run, or other settings or data",
              behaviour="one line `finetune: refusing checkpoint ...: its manifest is for another run or step` (or "
              "`other settings or data`); nothing loaded",
              test="tests/components/test_checkpoint_security.py::test_a_checkpoint_of_another_run_or_other_settings_is_refused"),
    Elsewhere(surface="secrets in URIs", input="`run`, `report`, `sync`, `compare`, `doctor` with `:50OO`, `:99999`, "
              "`[::1:5000`, `?access_token=` URIs carrying `CANARYPASS`, with and without `llmpack --debug`",
              behaviour="exit 2; one line (with `--debug`: the traceback, redacted, then the line); the canary in "
              "neither stdout nor stderr",
              test="tests/llmpack/test_secret_redaction.py::test_a_uri_with_a_password_is_one_line_exit_2_and_never_printed"),
    Elsewhere(surface="secrets in URIs",
              input="MLflow's own `InvalidUrlException` for `https://alice:CANARYPASS@host:50OO` "
              "and its traceback",
              behaviour="redacted by structure alone (`https://***@host:50OO`)",
              test="tests/components/test_redaction.py::test_mlflows_own_invalid_url_message_and_traceback_are_redacted"),
    Elsewhere(surface="YAML bombs", input="the 342-byte bomb as `--price-file` / `--control-plane-costs`, peak memory "
              "measured", behaviour="one line under 300 characters, exit 2, about 30 MB peak, nothing written",
              test="tests/llmpack/test_yaml_bombs.py::test_an_alias_bomb_is_one_short_line_exit_2_quickly_in_bounded_memory"),
    Elsewhere(surface="YAML bombs", input="the bomb as `doctor --compiled` artifacts, `submit kfp/argo/mlflow` files, "
              "the Argo and KFP local runners' input", behaviour="one line each: `alias *a is not accepted`",
              test="tests/llmpack/test_yaml_bombs.py::test_every_other_loader_of_a_file_refuses_the_bomb"),
    Elsewhere(surface="canary scan",
              input="a real local run with a canary in every credential variable the docs name and "
              "a tracking URI with userinfo",
              behaviour="no canary in any file the run wrote (run directory, MLflow store, "
              "JSONL, report) nor in its output",
              test="tests/llmpack/test_canary_scan.py::test_no_canary_in_anything_a_run_writes_or_prints"),
)
