"""What the plan says of a bottleneck's remedies, on the tiny model: a doubled micro-batch that fits or
does not, a larger vLLM share as KV tokens per sequence (stepped down to what fits), the bytes of a
sync, and the note where no device size is known (a CPU run; `grpo bench` on a CPU says the same)."""

from __future__ import annotations

from grpocli.planning import make_plan, shape_of
from grpocli.planning.headroom import diagnose
from grpocli.recipe import load_recipe

GIB = 2**30


def line(step: int, generation: float = 0.1, training: float = 0.4, sync: float = 0.0) -> dict:
    seconds = {"time/generation": generation, "time/rewards": 0.0, "time/logprobs": 0.0, "time/training": training,
               "time/weight_sync": sync}
    return {"step": step, **seconds, "step_time": sum(seconds.values())}


TRAINER_BOUND = [line(s) for s in (1, 2, 3)]
GENERATION_BOUND = [line(s, generation=0.8, training=0.1) for s in (1, 2, 3)]


def recipe(*overrides: str):
    return load_recipe("quickstart", list(overrides)).recipe


def test_without_a_device_size_nothing_is_asked_and_the_note_says_how():
    d = diagnose(TRAINER_BOUND, recipe("train.micro_batch_size=2"), memory_hint="grpo inspect RUN --gpu-memory 80GiB")
    assert d.remedies[0].plan == "" and d.checked_on == ""
    assert d.notes == ("memory not checked: the plan needs a device size (grpo inspect RUN --gpu-memory 80GiB)",)
    assert diagnose([{"step": 1}], recipe()) is None
    assert "no advice" in diagnose(TRAINER_BOUND, None).notes[0]
    elsewhere = recipe("train.micro_batch_size=2", "model.name_or_path=/nonexistent/model")
    note = diagnose(TRAINER_BOUND, elsewhere, gpu_memory=GIB).notes[0]  # a model this machine cannot read
    assert note.startswith("memory not checked: ") and "--config PATH/config.json" in note


def test_a_doubled_micro_batch_is_asked_of_the_plan():
    r = recipe("train.micro_batch_size=2", "generation.backend=vllm-server")  # no engine here: training is the peak
    fits = diagnose(TRAINER_BOUND, r, gpu_memory=GIB).remedies[0]
    assert fits.plan.startswith("plan: fits (its training phase ") and fits.plan.endswith("per process of 1.00 GiB)")
    plan = make_plan(r, shape_of(r.model), gpus=1, gpu_memory=GIB, knobs=False)
    tight = plan.peak.total + 1024  # micro-batches of 2 fit, of 4 not
    said = diagnose(TRAINER_BOUND, r, gpu_memory=tight).remedies[0].plan
    assert said.startswith("plan: does not fit (its training phase") and said.endswith("train.micro_batch_size=2")
    budget = diagnose(TRAINER_BOUND, recipe("train.max_tokens_per_micro_batch=1100"), gpu_memory=GIB).remedies[0]
    assert budget.overrides == ("train.max_tokens_per_micro_batch=2200",)
    assert "32 -> 16 micro-batches a step" in budget.plan  # rows of 536 tokens: 2 in a micro-batch, then 4


def test_a_larger_vllm_share_buys_kv_tokens_per_sequence_and_steps_down_to_what_fits():
    r = recipe("generation.backend=vllm")
    shape = shape_of(r.model)
    d = diagnose(GENERATION_BOUND, r, gpu_memory=8 * GIB)
    share = next(x for x in d.remedies if x.changes[0][0] == "vllm.gpu_memory_utilization")
    per_token = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * 2  # keys and values, bfloat16
    extra = 0.2 * 8 * GIB / per_token / 64                                    # 8 prompts x 8 completions
    assert share.changes == (("vllm.gpu_memory_utilization", 0.3, 0.5),)
    assert f"+{extra / 1000:.1f}k tokens of KV per sequence (64 sequences at once)" in share.plan
    assert "already holds them all at full length" in share.plan  # the tiny model's cache: nothing preempted
    trainer = make_plan(recipe("generation.backend=vllm-server"), shape, gpus=1, gpu_memory=8 * GIB,
                        knobs=False).peak.total  # the same phases without the engine's share
    room = int(trainer / 0.55)  # a share of 0.45 at most fits beside the trainer: 0.5 not, 0.4 yes
    stepped = next(x for x in diagnose(GENERATION_BOUND, r, gpu_memory=room).remedies if x.check == "kv"
                   and x.changes[0][0] == "vllm.gpu_memory_utilization")
    assert stepped.changes == (("vllm.gpu_memory_utilization", 0.3, 0.4),) and "0.5 would not fit" in stepped.plan
    inflight = next(x for x in d.remedies if x.changes[0][0] == "generation.pipeline").plan
    assert inflight.startswith("plan: the engine holds 128 sequences (2 batch(es))")


def test_a_sync_change_is_said_in_bytes():
    r = recipe("generation.backend=vllm", "model.lora.enabled=true", "vllm.lora_sync=merged")
    d = diagnose([line(s, generation=0.1, training=0.1, sync=0.6) for s in (1, 2)], r, gpu_memory=8 * GIB)
    assert d.remedies[0].overrides == ("vllm.lora_sync=adapter",)
    assert d.remedies[0].plan.startswith("plan: a sync sends ") and " instead of " in d.remedies[0].plan


def test_grpo_bench_on_a_cpu_says_the_memory_check_needs_a_device_size():
    from grpocli.cli.bench import _bottleneck

    found = _bottleneck(TRAINER_BOUND, recipe("train.micro_batch_size=2"), "cpu", None, recipe="quickstart")
    assert found.notes == ("memory not checked: the plan needs a device size (grpo bench quickstart ... "
                           "--gpu-memory 80GiB)",)
    assert found.as_dict()["advice"][0]["set"] == ["train.micro_batch_size=4"]
