"""The pyfunc model files the register step writes without MLflow are the files MLflow itself writes."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from components.serving.package import CODE_FILE, SERVING_SPEC, serving_requirements, write_servable


def test_the_hand_written_mlmodel_is_mlflow_s_own_for_a_models_from_code_pyfunc(tmp_path: Path) -> None:
    import mlflow.pyfunc

    ours = tmp_path / "ours"  # a finetune output as write_servable reads it: the adapter's bytes are not opened
    (ours / "adapter").mkdir(parents=True)
    (ours / "adapter" / "adapter_config.json").write_text("{}")
    (ours / "llmpack-model.json").write_text(json.dumps({"base_model": "tiny", "method": "lora"}))
    write_servable(ours, ours)
    theirs = tmp_path / "theirs"
    mlflow.pyfunc.save_model(path=str(theirs), python_model=str(CODE_FILE),
                             pip_requirements=serving_requirements("lora"),
                             artifacts={"serving": str(ours / SERVING_SPEC), "weights": str(ours / "adapter"),
                                        "base": str(ours / "base")})
    mine, mlflows = (yaml.safe_load((d / "MLmodel").read_text()) for d in (ours, theirs))
    conf, their_conf = mine["flavors"]["python_function"], mlflows["flavors"]["python_function"]
    assert set(mine["flavors"]) == set(mlflows["flavors"]) == {"python_function"}
    # every key MLflow writes, less what names a pickle or only adds metadata
    assert set(conf) == set(their_conf) - {"cloudpickle_version"}
    for key in ("loader_module", "code", "env", "python_version", "streamable"):
        assert conf[key] == their_conf[key], key
    assert conf["model_code_path"] == Path(their_conf["model_code_path"]).name == CODE_FILE.name
    assert (ours / conf["model_code_path"]).read_bytes() == (theirs / CODE_FILE.name).read_bytes()
    assert mine["mlflow_version"] == mlflows["mlflow_version"]
    # the same artifacts by name; ours name the weights where register logs them (no copy)
    assert {k: v["path"] for k, v in conf["artifacts"].items()} == {"serving": SERVING_SPEC, "weights": "adapter",
                                                                    "base": "base"}
    assert set(conf["artifacts"]) == set(their_conf["artifacts"])
    envs = {name: [yaml.safe_load((d / name).read_text()) for d in (ours, theirs)]
            for name in ("requirements.txt", "python_env.yaml", "conda.yaml")}
    assert envs["requirements.txt"][0] == envs["requirements.txt"][1]
    assert envs["conda.yaml"][0] == envs["conda.yaml"][1]
    assert envs["python_env.yaml"][0]["dependencies"] == envs["python_env.yaml"][1]["dependencies"]
    assert envs["python_env.yaml"][0]["python"] == envs["python_env.yaml"][1]["python"]
    assert (ours / "requirements.txt").read_text().split() == serving_requirements("lora")
    assert not [r for r in serving_requirements("lora") if r.split("==")[0] in ("llmpack", "components")]
