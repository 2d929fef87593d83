"""The step image's self-check: can this environment load, adapt and train a model?

``docker build`` runs it after ``pip install .`` (and ``.ci/floors`` in the floors venv), so an
image whose pins do not work together fails to build instead of failing its first GPU job:
importing ``components`` and ``torch`` alone passed with a torch that transformers 5 disables.

1. every installed requirement of llmpack is inside its declared range (torch from the base
   image included);
2. transformers' model classes and peft import (transformers 5 refuses a torch below 2.6 here);
3. the tiny model is built, saved in bf16 and loaded back through AutoModelForCausalLM in fp32,
   wrapped in LoRA adapters by peft, and takes one training step on the CPU.

No GPU, no network. Prints one line per check; exits non-zero at the first that fails.
"""

from __future__ import annotations

import sys
import tempfile
from importlib.metadata import PackageNotFoundError, requires, version


def check_requirements() -> None:
    from packaging.requirements import Requirement

    for line in requires("llmpack") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's (dev) requirement
        try:
            have = version(req.name)
        except PackageNotFoundError:
            raise SystemExit(f"selfcheck: {req.name} is not installed (llmpack requires {req})") from None
        if not req.specifier.contains(have, prereleases=True):
            raise SystemExit(f"selfcheck: {req.name} {have} is outside llmpack's range {req}")
    print(f"selfcheck: python {sys.version.split()[0]}, every requirement of llmpack {version('llmpack')} in range")


def check_training() -> None:
    import peft
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaForCausalLM  # noqa: F401 - the model classes must import

    from components.training.modeling import load_base_model, lora_target_modules
    from components.training.tiny import VOCAB_SIZE, build_tiny_model

    print(f"selfcheck: torch {torch.__version__} (cuda {torch.version.cuda}), transformers {transformers.__version__}, "
          f"peft {peft.__version__}")
    with tempfile.TemporaryDirectory() as tmp:
        build_tiny_model().to(torch.bfloat16).save_pretrained(tmp)
        net = load_base_model(tmp)  # AutoModelForCausalLM, fp32 whatever the checkpoint holds
    if not isinstance(net, LlamaForCausalLM) or {p.dtype for p in net.parameters()} != {torch.float32}:
        raise SystemExit(f"selfcheck: the tiny checkpoint loaded as {type(net).__name__} "
                         f"{sorted({str(p.dtype) for p in net.parameters()})}, not LlamaForCausalLM in float32")
    net = get_peft_model(net, LoraConfig(r=4, lora_alpha=8, target_modules=lora_target_modules(net),
                                         task_type="CAUSAL_LM"))
    trainable = [p for p in net.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in trainable]
    ids = torch.randint(0, VOCAB_SIZE, (2, 16), generator=torch.Generator().manual_seed(0))
    loss = net(input_ids=ids, labels=ids).loss
    loss.backward()
    torch.optim.AdamW(trainable, lr=1e-2).step()
    if not torch.isfinite(loss) or all(torch.equal(a, b.detach()) for a, b in zip(before, trainable, strict=True)):
        raise SystemExit(f"selfcheck: one LoRA training step did not train (loss {loss.item()})")
    print(f"selfcheck: tiny Llama loaded in float32, LoRA on {len(trainable)} tensors, "
          f"one step (loss {loss.item():.3f}): ok")


def main() -> int:
    check_requirements()
    check_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
