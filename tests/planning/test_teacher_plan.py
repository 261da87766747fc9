"""`grpo plan` counts a [distill] teacher: in process, its weights in every phase (in model.dtype, as the
reference's) and its forward pass in the log-prob phase; served (an http(s):// distill.teacher), nothing.
The student and the teacher are small Qwen2 models saved here with save_pretrained (no hub); the teacher is
wider and deeper, with the student's vocabulary."""

from __future__ import annotations

import pytest

from grpocli.errors import UserError

VOCAB = 512
#: The plan's worst case: long enough that the teacher's pass outweighs the student's.
SIZES = ["data.max_prompt_length=64", "generation.max_completion_length=64", "train.micro_batch_size=8",
         "model.dtype=float32"]


def _save(folder, hidden: int, layers: int, intermediate: int) -> int:
    """A Qwen2 model written by save_pretrained; its parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(folder)
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(student dir, teacher dir, the teacher's parameters)."""
    root = tmp_path_factory.mktemp("distill")
    _save(root / "student", hidden=64, layers=2, intermediate=128)
    params = _save(root / "teacher", hidden=256, layers=4, intermediate=1024)
    return root / "student", root / "teacher", params


def _plan(student, *overrides, gpu_memory=80 * 2**30, gpus=1):
    from grpocli.planning import make_plan, shape_of
    from grpocli.recipe import load_recipe

    r = load_recipe("quickstart", [f"model.name_or_path='{student}'", *SIZES, *overrides]).recipe
    return make_plan(r, shape_of(r.model), gpus=gpus, gpu_memory=gpu_memory)


def test_a_teacher_in_process_adds_its_weights_and_its_log_prob_pass(models):
    student, teacher, params = models
    alone = _plan(student)
    taught = _plan(student, f"distill.teacher='{teacher}'")
    weights = params * 4  # model.dtype float32, as the reference's
    assert taught.settings.teacher.params == params and taught.settings.teacher.hidden_size == 256
    generation, logprob, training = (b.total - a.total for a, b in zip(alone.phases, taught.phases, strict=True))
    assert generation == training == weights  # held all along, no gradient, no optimizer state
    # the log-prob phase: the weights, and the teacher's pass where it is larger than the student's
    passes = dict(taught.phases[1].parts)
    teacher_pass = next(v for k, v in passes.items() if k.startswith("teacher's "))
    student_pass = sum(v for k, v in dict(alone.phases[1].parts).items()
                       if k in ("forward working memory", "logits and log-prob block"))
    assert teacher_pass > student_pass and logprob == weights + teacher_pass - student_pass
    assert taught.as_dict()["teacher"]["model"]["params"] == params
    # FSDP2 shards the policy (and a reference), not the teacher: grpocli.trainer.teacher loads it whole
    sharded = _plan(student, f"distill.teacher='{teacher}'", "train.sharding=fsdp2", gpus=2)
    assert sharded.phases[-1].get("teacher weights") == weights


def test_a_served_teacher_adds_nothing(models):
    from grpocli.planning.report import teacher_line

    student, _, _ = models
    alone = _plan(student)
    served = _plan(student, "distill.teacher='http://127.0.0.1:8011'")
    assert [p.total for p in served.phases] == [p.total for p in alone.phases]
    assert served.settings.teacher is None
    assert served.as_dict()["teacher"] == {"teacher": "http://127.0.0.1:8011", "served": True, "model": None}
    assert teacher_line(served) == ("teacher: served at http://127.0.0.1:8011: none here (its weights and passes "
                                    "are the server's)")


def test_a_run_directory_teacher_is_its_newest_checkpoint(models, tmp_path):
    import shutil

    student, teacher, params = models
    run = tmp_path / "teacher-run"
    shutil.copytree(teacher, run / "checkpoints" / "step-4")
    (run / "checkpoints" / "step-8").mkdir()  # newer, damaged: skipped
    (run / "checkpoints" / "step-8" / "config.json").write_text("{")
    for given in (run, run / "checkpoints" / "step-4"):
        assert _plan(student, f"distill.teacher='{given}'").settings.teacher.params == params


def test_the_auto_sizes_count_the_teacher(models):
    student, teacher, _ = models
    tight = 64 * 2**20
    alone = _plan(student, "train.micro_batch_size='auto'", gpu_memory=tight)
    taught = _plan(student, "train.micro_batch_size='auto'", f"distill.teacher='{teacher}'", gpu_memory=tight)
    auto = dict(alone.auto)["train.micro_batch_size"], dict(taught.auto)["train.micro_batch_size"]
    assert 0 < auto[1] < auto[0]


def test_a_teacher_that_cannot_be_read_is_named(models, tmp_path):
    student, _, _ = models
    with pytest.raises(UserError) as err:
        _plan(student, f"distill.teacher='{tmp_path / 'missing'}'")
    assert err.value.where == "distill.teacher" and str(tmp_path / "missing") in err.value.what


def test_grpo_plan_prints_the_teacher(models, grpo):
    student, teacher, params = models
    args = ("plan", "quickstart", f"model.name_or_path={student}", *SIZES, "--gpu-memory", "80GiB")
    shown = grpo(*args, f"distill.teacher={teacher}")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert f"teacher: Qwen2ForCausalLM from {teacher}: {params:,} parameters, 4 layers" in shown.stdout
    assert "teacher weights" in shown.stdout
