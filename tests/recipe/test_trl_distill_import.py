"""`grpo import trl` on TRL 1.16's distillation configs (grpocli.recipe.trl_distill): DistillationConfig (a
`trl distillation --config` YAML, a config TRL itself builds, a script with DistillationTrainer), GKDConfig,
IWOPDConfig and the teacher servers. The teacher becomes distill.teacher; beta 1.0 on-policy (and IW-OPD with
gamma 0) becomes distill.objective 'reverse_kl'; what grpo cannot train is an 'unsupported' line."""

from __future__ import annotations

import dataclasses
import textwrap
import typing

import pytest
import tomllib
from cli_runner import run_grpo

from grpocli.errors import UserError
from grpocli.recipe.openr1_names import OPENR1_FIELDS
from grpocli.recipe.trl_distill import DISTILL_TYPES, KINDS
from grpocli.recipe.trl_import import convert
from grpocli.recipe.trl_names import TRL_FIELDS

trl = pytest.importorskip("trl", reason="TRL is not installed (pip install 'grpocli[bench]')")


def _classes():
    from trl.experimental.async_distillation.async_distillation_config import AsyncDistillationConfig
    from trl.experimental.gkd.gkd_config import GKDConfig
    from trl.experimental.iw_opd.iw_opd_config import IWOPDConfig
    from trl.experimental.server_distillation.server_distillation_config import ServerDistillationConfig

    return {c.__name__: c for c in (trl.DistillationConfig, ServerDistillationConfig, GKDConfig, IWOPDConfig,
                                     AsyncDistillationConfig)}


def _lines(lines, kind=None):
    return {ln.name: ln.text for ln in lines if kind is None or ln.kind == kind}


def test_the_fields_types_and_defaults_are_trls():
    classes = _classes()
    for name, kind in DISTILL_TYPES.items():
        having = [c for c in classes.values() if name in {f.name for f in dataclasses.fields(c)}]
        assert having, f"{name} is no field of TRL's distillation configs"
        for cls in having:
            assert typing.get_type_hints(cls)[name] == kind, (cls.__name__, name)
    assert not any("teacher" in f.name for f in dataclasses.fields(trl.GRPOConfig))  # GRPOConfig has no teacher
    grpo = {f.name for f in dataclasses.fields(trl.GRPOConfig)} | set(TRL_FIELDS) | set(OPENR1_FIELDS)
    assert not grpo & set(DISTILL_TYPES)  # a field that says "distillation" is no GRPO (or open-r1) config's
    for kind, _, defaults in KINDS:
        own = {f.name: f.default for f in dataclasses.fields(classes[kind])}
        assert {k: own[k] for k in defaults} == defaults, kind


def test_a_trl_distillation_yaml_writes_distill(tmp_path):
    """What `trl distillation --config` reads (trl/scripts/distillation.py's docstring), as a user writes it."""
    yaml = {"model_name_or_path": "Qwen/Qwen2.5-0.5B-Instruct", "teacher_model_name_or_path": "runs/teacher",
            "dataset_name": "trl-lib/ultrafeedback-prompt", "learning_rate": 2.0e-5, "max_steps": 50,
            "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "beta": 1.0, "bf16": False}
    fields = {f.name for f in dataclasses.fields(trl.DistillationConfig)} | {"model_name_or_path", "dataset_name"}
    assert set(yaml) <= fields
    (tmp_path / "distill.yaml").write_text("".join(f"{k}: {v}\n" for k, v in yaml.items()))
    done = run_grpo("import", "trl", "distill.yaml", "-o", "recipe.toml", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    recipe = tomllib.loads((tmp_path / "recipe.toml").read_text())
    assert recipe["distill"] == {"teacher": "runs/teacher", "objective": "reverse_kl"}
    assert "beta" not in recipe.get("algorithm", {})  # TRL's distillation beta is no KL penalty
    # one completion per prompt in TRL: grpo's least group, the same 8 completions a step
    assert recipe["generation"]["num_generations"] == 2 and recipe["train"]["prompts_per_step"] == 4
    assert "converted   beta: distill.objective = 'reverse_kl'" in done.stdout
    assert "reward_funcs: DistillationConfig has no reward" in done.stdout


def test_a_config_trl_builds_with_a_jsd_reports_beta():
    from grpocli.recipe.trl_script_run import set_fields

    built = trl.DistillationConfig(output_dir="out", teacher_model_name_or_path="big/teacher", beta=0.5,
                                   bf16=False, use_cpu=True, max_completion_length=128)
    recipe, lines = convert(set_fields(built))
    assert recipe["distill"] == {"teacher": "big/teacher"}  # the objective stays [distill]'s default, reverse_kl
    assert "0.5 (TRL's generalized JSD" in _lines(lines, "unsupported")["beta"]
    assert recipe["generation"]["max_completion_length"] == 128


def test_gkd_off_policy_and_seq_kd_are_reported():
    recipe, lines = convert({"teacher_model_name_or_path": "t", "lmbda": 0.25, "seq_kd": True, "max_new_tokens": 64})
    unsupported = _lines(lines, "unsupported")
    assert set(unsupported) >= {"beta", "lmbda", "seq_kd"}  # GKDConfig's default beta 0.5 too
    assert unsupported["lmbda"].startswith("0.25: a share 0.75 of the batches")
    assert recipe["generation"]["max_completion_length"] == 64 and recipe["generation"]["temperature"] == 0.9
    assert recipe["distill"] == {"teacher": "t"}


def test_iw_opd_with_gamma_zero_is_exactly_reverse_kl_and_serves_the_teacher():
    recipe, lines = convert({"teacher_model_server_url": "http://teacher:8000", "use_teacher_server": True,
                             "iw_opd_gamma": 0.0, "num_generations": 4})
    assert recipe["distill"] == {"teacher": "http://teacher:8000", "objective": "reverse_kl"}
    assert recipe["generation"]["num_generations"] == 4
    said = _lines(lines)
    assert "exactly grpo's" in said["iw_opd_gamma"] and "grpo ref-serve" in said["teacher_model_server_url"]
    _, lines = convert({"teacher_model_name_or_path": "t", "distillation_objective": "iw_opd"})  # gamma 0.5
    assert "IW-OPD weights each token" in _lines(lines, "unsupported")["iw_opd_gamma"]


def test_server_and_async_teachers():
    recipe, _ = convert({"teacher_model_server_url": "http://127.0.0.1:8011"})  # ServerDistillationConfig
    assert recipe["distill"] == {"teacher": "http://127.0.0.1:8011", "objective": "reverse_kl"}
    recipe, lines = convert({"teacher_server_urls": '{"a": "http://a:8001", "b": "http://b:8001"}', "beta": 1.0})
    assert "distill" not in recipe and "(MOPD)" in _lines(lines, "unsupported")["teacher_server_urls"]
    recipe, lines = convert({"teacher_server_urls": "http://a:8001"})  # AsyncDistillationConfig's beta 0.0
    assert recipe["distill"] == {"teacher": "http://a:8001"} and "beta" in _lines(lines, "unsupported")


def test_grpo_configs_keep_their_beta_and_odd_batches_are_refused():
    recipe, _ = convert({"beta": 0.04})
    assert recipe["algorithm"]["beta"] == 0.04 and "distill" not in recipe
    with pytest.raises(UserError, match="3 completions, one per prompt"):
        convert({"teacher_model_name_or_path": "t", "per_device_train_batch_size": 3})


def test_a_distillation_script_is_read(tmp_path):
    """TRL's DistillationTrainer example (its docstring), run with stand-ins."""
    from grpocli.recipe.trl_config_file import read_config

    script = tmp_path / "distill.py"
    script.write_text(textwrap.dedent("""
        from datasets import load_dataset
        from trl import DistillationConfig, DistillationTrainer

        dataset = load_dataset("trl-lib/tldr", split="train")
        args = DistillationConfig(output_dir="out", per_device_train_batch_size=4, max_steps=10, beta=1.0)
        trainer = DistillationTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", teacher_model="Qwen/Qwen2.5-1.5B-Instruct",
                                      args=args, train_dataset=dataset)
        trainer.train()
    """))
    fields = read_config(script)
    assert fields["teacher_model_name_or_path"] == "Qwen/Qwen2.5-1.5B-Instruct"
    recipe, _ = convert(fields)
    assert recipe["distill"] == {"teacher": "Qwen/Qwen2.5-1.5B-Instruct", "objective": "reverse_kl"}
    assert recipe["model"]["name_or_path"] == "Qwen/Qwen2.5-0.5B-Instruct" and recipe["train"]["steps"] == 10
