"""Step outputs made once by hand (the session's ``tokens`` and ``finetuned`` fixtures: sealed outside any pipeline
run) handed to steps of a named run: a copy sealed for that run with this environment's key, as the run's own
tokenize or finetune would have sealed it. A step of a named run takes only its own run's outputs (issue 46, round
17: one sealed outside any run used to be taken by every run)."""

from __future__ import annotations

import shutil
from pathlib import Path

from components.serving import sealed


def for_run(src: Path, dest: Path, run: str, kind: sealed.Kind = sealed.TOKENS, **fields: str) -> Path:
    """``src`` (a sealed output) copied to ``dest`` and sealed for pipeline run ``run``; ``fields`` override the
    seal's own (a model's ``tokens_seal``). Returns ``dest``."""
    seal = sealed.verified_seal(src, "", kind)
    own = {k: v for k, v in seal.items() if k not in ("files", "pipeline_run")}
    with sealed.sealed_output(dest, kind, run, **{**own, **fields}) as private:
        for name in seal["files"]:
            (private / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / name, private / name)
    return dest


def chain_for_run(tokens: Path, model: Path | None, root: Path, run: str) -> tuple[Path, Path | None]:
    """The tokens (and the model trained on them, its seal naming the copy's) sealed for ``run`` under ``root``."""
    tok = for_run(tokens, root / f"{run}-tokens", run)
    if model is None:
        return tok, None
    tokens_seal = sealed.seal_id(sealed.verified_seal(tok, run, sealed.TOKENS))
    return tok, for_run(model, root / f"{run}-model", run, sealed.MODEL, tokens_seal=tokens_seal)
