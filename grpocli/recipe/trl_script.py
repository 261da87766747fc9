"""Reading a TRL training script for `grpo import trl SCRIPT.py [-- ARGS]`: what it builds, as the
fields a `trl grpo --config` YAML would hold.

The script runs in a child process (grpocli.recipe.trl_script_run) as `python SCRIPT.py ARGS` would,
with stand-ins for GRPOTrainer, load_dataset and from_pretrained, and no network. This side turns
what it recorded into fields: the dataclasses its parser filled (ScriptArguments, ModelConfig,
open-r1's GRPOScriptArguments), the GRPOConfig it built, and GRPOTrainer's arguments (the model's
name, the reward functions, the dataset's name and split, a LoraConfig).
A reward function defined in the script itself is copied, with the script's imports, functions,
classes and constants, into REWARDS_FILE beside the recipe (the script trains at import; the copy
does not).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from grpocli.errors import UserError

TIMEOUT_S = 600
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
           "TRACKIO_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
HINT = "grpo import trl SCRIPT.py -o recipe.toml -- --config config.yaml  (the script's own arguments after --)"
#: Trainer arguments -> the YAML fields that say the same.
LORA = {"r": "lora_r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout", "target_modules": "lora_target_modules"}


def run_script(path: Path, args: list[str]) -> dict[str, Any]:
    """What the script built when it ran (the child's record); UserError when it failed."""
    import importlib.util

    if importlib.util.find_spec("trl") is None:
        raise UserError(f"reading {path} needs TRL, which the script imports", valid="TRL installed, or a YAML of "
                        "the GRPOConfig fields", hint="pip install trl   (or: pip install 'grpocli[bench]')")
    with tempfile.TemporaryDirectory(prefix="grpo-import-") as tmp:
        out = Path(tmp) / "record.json"
        cmd = [sys.executable, "-m", "grpocli.recipe.trl_script_run", str(out), str(path), *args]
        try:
            done = subprocess.run(cmd, env={**os.environ, **OFFLINE}, capture_output=True, text=True,
                                  timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise UserError(f"{path} ran for more than {TIMEOUT_S} s while it was read", valid="a script that "
                            "builds its GRPOConfig and GRPOTrainer (training and downloads are stand-ins)",
                            hint=HINT) from None
        if not out.is_file():
            tail = "\n".join(done.stderr.strip().splitlines()[-8:])
            raise UserError(f"{path} could not be read (exit {done.returncode}):\n{tail}", valid="a TRL training "
                            "script", hint=HINT)
        record = json.loads(out.read_text(encoding="utf-8"))
    if record.get("error"):
        raise UserError(f"{path} raised {record['error']} while it ran with stand-ins for training and downloads",
                        valid="a script that runs as `python SCRIPT.py ARGS` does (its arguments after --)",
                        hint=HINT)
    return record


def script_fields(path: Path, args: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The fields the script sets (as a `trl grpo --config` YAML would hold them) and notes on what was
    not carried."""
    record = run_script(path, args)
    fields: dict[str, Any] = {}
    notes: list[str] = []
    for parsed in record["parsed"]:
        fields.update(parsed["fields"])
    trainers = record["trainers"]
    if len(trainers) > 1:
        raise UserError(f"{path} built {len(trainers)} GRPOTrainers; `grpo import trl` reads one", valid="a script "
                        "that builds one GRPOTrainer", hint="import each run's config on its own")
    trainer = trainers[0] if trainers else {}
    fields.update(_config(path, record["configs"], trainer.get("args")))
    if trainer:
        fields.update(_trainer_fields(path, trainer, fields, notes))
    for note in record["notes"]:
        if "peft_config" in note:
            fields.update(_lora(note["peft_config"]))
    if not trainers and not record["configs"] and not record["parsed"]:
        raise UserError(f"{path} built no GRPOConfig and no GRPOTrainer when it ran", valid="a TRL GRPO training "
                        "script", hint=HINT)
    return fields, notes


def _config(path: Path, configs: list[dict[str, Any]], given: Any) -> dict[str, Any]:
    if isinstance(given, dict) and given.get("id") is not None:
        for config in configs:
            if config["id"] == given["id"]:
                return config["fields"]
        return given.get("fields", {})
    if len(configs) > 1:
        raise UserError(f"{path} built {len(configs)} GRPOConfig objects and passed none to GRPOTrainer",
                        valid="a script that builds one GRPOConfig (or passes one as args=)", hint=HINT)
    return configs[0]["fields"] if configs else {}


def _trainer_fields(path: Path, t: dict[str, Any], known: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    model = t.get("model")
    if isinstance(model, str):
        out["model_name_or_path"] = model
    elif isinstance(model, dict) and model.get("name"):
        out["model_name_or_path"] = model["name"]
        kwargs = model.get("kwargs") or {}
        dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
        if isinstance(dtype, str):
            out["dtype"] = dtype.removeprefix("torch.")
        if isinstance(kwargs.get("attn_implementation"), str):
            out["attn_implementation"] = kwargs["attn_implementation"]
    for key, split_field in (("train_dataset", "dataset_train_split"), ("eval_dataset", "dataset_test_split")):
        data = t.get(key)
        if isinstance(data, dict) and "path" in data:
            if key == "train_dataset":
                out.update(_dataset(data, notes))
            if data.get("split") and data.get("part") is None:
                out[split_field] = data["split"]
        elif data is not None and key == "train_dataset":
            notes.append(f"train_dataset: a {data.get('object', 'dataset')} built in the script, not a named "
                         "dataset: save it (dataset.to_json('prompts.jsonl')) and set data.dataset to the file")
    if isinstance(t.get("peft_config"), dict):
        out.update(_lora(t["peft_config"]))
    teacher = t.get("teacher_model")  # DistillationTrainer's: a name, or a model from_pretrained loaded
    if isinstance(teacher, str) or isinstance(teacher, dict) and isinstance(teacher.get("name"), str):
        out["teacher_model_name_or_path"] = teacher if isinstance(teacher, str) else teacher["name"]
    if "reward_funcs" in t and not known.get("reward_funcs"):
        names = [_reward_name(path, r, notes) for r in _listed(t["reward_funcs"])]
        out["reward_funcs"] = [n for n in names if n]
    return out


def _dataset(data: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    files = data.get("data_files")
    if data.get("path") in ("json", "csv", "parquet", "text") and isinstance(files, (str, list)):
        out["dataset_name"] = files if isinstance(files, str) else files[0]
    elif isinstance(data.get("path"), str):
        out["dataset_name"] = data["path"]
    if isinstance(data.get("name"), str):
        out["dataset_config"] = data["name"]
    for op in data.get("ops", []):
        notes.append(f"dataset.{op}: not run by grpo; data.prompt_column, data.system_prompt and data.template "
                     "shape prompts (`grpo inspect fields data`), a dataset plugin does the rest")
    return out


def _lora(config: dict[str, Any]) -> dict[str, Any]:
    fields = config.get("fields", config)
    out: dict[str, Any] = {"use_peft": True}
    for key, name in LORA.items():
        if key in fields:
            value = fields[key]
            out[name] = sorted(value) if isinstance(value, list) else value
    return out


def _listed(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _reward_name(path: Path, r: Any, notes: list[str]) -> str | None:
    if isinstance(r, str):
        return r  # a reward model's name
    if not isinstance(r, dict) or "function" not in r:
        notes.append(f"reward_funcs: {r!r} is not a function grpo can name: add it to [[rewards]] by hand")
        return None
    fn, module = r["function"], r.get("module")
    if "<locals>" in fn or "<lambda>" in fn:
        notes.append(f"reward_funcs: {fn} is built inside a function (a closure or lambda): grpo names rewards by "
                     "module:function; move it to module level")
        return None
    if r.get("kwargs"):
        notes.append(f"reward_funcs: functools.partial({fn}, {r['kwargs']}): set them as [[rewards]] args")
    if module == "__main__" or (r.get("file") and Path(r["file"]).resolve() == path.resolve()):
        return f"__script__:{fn}"
    if module and module.startswith("trl.rewards"):
        return fn
    return f"{module}:{fn}"


def copy_rewards(script: Path, target: Path, names: list[str]) -> None:
    """``target``: the script's imports, functions, classes and constant assignments (what its reward
    functions may use), without the statements that load, build or train."""
    tree = ast.parse(script.read_text(encoding="utf-8"), str(script))
    kept = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                                                            ast.AsyncFunctionDef, ast.ClassDef))
            or (isinstance(node, (ast.Assign, ast.AnnAssign)) and _constant(node.value))]
    header = (f'"""The reward functions of {script.name} ({", ".join(names)}), with its imports, functions, classes and '
              'constants, copied by `grpo import trl`: the script trains when it runs, this file does not."""\n\n')
    target.write_text(header + ast.unparse(ast.Module(body=kept, type_ignores=[])) + "\n", encoding="utf-8")


def _constant(value: ast.expr | None) -> bool:
    """A value that loads nothing: a literal, or re.compile / a call of str methods on literals."""
    if value is None:
        return False
    for node in ast.walk(value):
        if isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if func not in ("re.compile", "frozenset", "set", "dict", "list", "tuple"):
                return False
    return True
