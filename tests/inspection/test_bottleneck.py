"""The bottleneck doctor on hand-written metrics lines: the bounding phase (medians, step 1 left out),
the remedies each phase gets for a tiny recipe (real keys, the values to set, the measured bound), the
section's text, and `grpo inspect RUN` printing it through the real command line (no torch)."""

from __future__ import annotations

import json

import pytest

from grpocli.inspection.bottleneck import PHASES, find_bottleneck
from grpocli.inspection.remedies import RULES, remedies, report
from grpocli.recipe import load_recipe
from grpocli.recipe.fields import describe


def line(step: int, generation: float = 0.1, training: float = 0.3, rewards: float = 0.01,
         sync: float = 0.0, **extra) -> dict:
    seconds = {"time/generation": generation, "time/rewards": rewards, "time/logprobs": 0.0,
               "time/training": training, "time/weight_sync": sync}
    return {"step": step, **seconds, "step_time": sum(seconds.values()), **extra}


def recipe(*overrides: str):
    return load_recipe("quickstart", list(overrides)).recipe


def test_the_bounding_phase_is_the_median_share_without_the_warm_up_step():
    history = [line(1, generation=9.0), *(line(s) for s in range(2, 7)), line(7, training=5.0),
               {"step": 5, "eval/reward": 0.5}]  # an evaluation line has no phases
    b = find_bottleneck(history)
    assert (b.phase, b.first, b.last, b.warmup_left_out) == ("training", 2, 7, True)
    assert b.seconds["training"] == pytest.approx(0.3) and b.step_s == pytest.approx(0.41)
    assert b.share == pytest.approx(0.3 / 0.41) and b.bounding() == ("training",)
    assert "training 73% of a 0.41 s step (median of steps 2-7; step 1 warm-up left out)" in b.headline()
    assert find_bottleneck([line(1, generation=0.5)]).phase == "generation"  # one step: counted
    assert find_bottleneck([{"step": 1, "reward": 0.1}]) is None
    even = find_bottleneck([line(s, generation=0.3, training=0.25) for s in (1, 2, 3)])
    assert even.bounding() == ("generation", "training")  # both take a third or more


def test_every_key_a_remedy_sets_is_a_recipe_key():
    keys = {row["key"] for row in describe()}
    cases = [("generation", "generation.backend=vllm", "model.lora.enabled=true"),
             ("generation", "generation.backend=vllm", "generation.pipeline=inflight"),
             ("generation", "generation.backend=vllm-server"),
             ("training", "model.gradient_checkpointing=true", "train.activation_offloading=true"),
             ("training", "train.max_tokens_per_micro_batch=64"),
             ("logprobs", "algorithm.beta=0.1"), ("weight_sync", "generation.backend=vllm", "model.lora.enabled=true")]
    for phase, *overrides in cases:
        b = find_bottleneck([line(2, **{"generation" if phase == "generation" else "training": 1.0})])
        found = RULES[phase](b, recipe(*overrides))
        assert found, (phase, overrides)
        for x in found:
            for key, _, _ in x.changes:
                assert key.split("[")[0] == "rewards" or key in keys, key
    assert set(RULES) == set(PHASES)


def test_a_trainer_bound_step_doubles_the_micro_batch_and_turns_checkpointing_off():
    b = find_bottleneck([line(s, generation=0.1, training=0.4) for s in (1, 2, 3)])
    found = remedies(b, recipe("train.micro_batch_size=2", "model.gradient_checkpointing=true"))
    assert [x.changes for x in found] == [(("train.micro_batch_size", 2, 4),),
                                          (("model.gradient_checkpointing", True, False),)]
    assert found[0].gain == "at most 32 -> 16 passes a step" and found[0].check == "memory"
    assert found[0].overrides == ("train.micro_batch_size=4",) and "~0.1 s a step" in found[1].gain
    one_pass = remedies(b, recipe("train.micro_batch_size=64"))  # the step's 64 completions in one pass already
    assert one_pass[0].changes[0][0] == "train.num_processes"
    sized = remedies(b, recipe("train.micro_batch_size=auto", "model.gradient_checkpointing=auto"))
    assert [x.changes[0][0] for x in sized] == ["train.num_processes"] and sized[0].why.startswith("'auto' sizes")
    text = report(b, found, notes=("memory not checked",), command="grpo bench quickstart",
                  given=("train.micro_batch_size=2", "train.steps=9"))
    assert text[1] == "  training bounds the step (78%):"
    assert text[2].startswith("    train.micro_batch_size 2 -> 4: fewer, larger passes")
    assert text[-1] == "  measure it: grpo bench quickstart train.steps=9 train.micro_batch_size=4"


def test_a_generation_bound_step_generates_ahead_in_flight_and_with_more_cache():
    b = find_bottleneck([line(s, generation=0.7, training=0.2) for s in (1, 2, 3)])
    on_policy = remedies(b, recipe())  # hf: an engine apart from the policy
    assert on_policy[0].overrides == ("generation.backend=vllm", "generation.async_steps=1")
    assert "at best 0.7 s a step (from 0.91 s)" in on_policy[0].gain
    engine = remedies(b, recipe("generation.backend=vllm"))
    assert [x.overrides for x in engine] == [("generation.async_steps=1",), ("generation.pipeline=inflight",),
                                             ("vllm.gpu_memory_utilization=0.5",)]
    assert [x.check for x in engine] == ["", "kv", "kv"]
    assert len(remedies(b, recipe("generation.backend=vllm"), gpu=False)) == 2  # a CPU run: no GPU share to raise
    inflight = remedies(b, recipe("generation.backend=vllm", "generation.pipeline=inflight"))
    assert inflight[0].overrides == ("generation.max_staleness=2",)
    uneven = find_bottleneck([line(2, generation=0.7, **{"completions/mean_length": 5.0,
                                                         "completions/max_length": 24.0})])
    assert remedies(uneven, recipe())[1].overrides == ("generation.backend=paged",)


def test_a_rewards_bound_step_names_the_slow_reward_where_it_is_logged():
    two = ('rewards=[{name = "length", args = {target = 8}}, {name = "format.soft"}]',)
    steady = [line(s, rewards=0.5, training=0.1, **{"rewards/length/seconds": 0.05,
                                                    "rewards/format.soft/seconds": 0.45}) for s in (1, 2, 3)]
    found = remedies(find_bottleneck(steady), recipe(*two))
    assert found[0].text() == "rewards[1].url unset -> 2 servers" and found[0].overrides == ()
    assert found[0].why.startswith("format.soft takes 0.45 s of the step's 0.5 s") and len(found) == 1
    spiky = [line(s, rewards=r, training=0.1) for s, r in ((1, 0.5), (2, 0.5), (3, 0.5), (4, 4.0))]
    found = remedies(find_bottleneck(spiky), recipe(*two))  # not logged: the first reward, said so
    assert "which reward is slow is not recorded" in found[0].why
    assert found[1].changes == (("rewards[0].timeout", 300.0, 2.0),) and "counts as failing" in found[1].why


def test_a_sync_bound_step_sends_the_adapters_and_syncs_less_often():
    b = find_bottleneck([line(s, generation=0.1, training=0.1, sync=0.5) for s in (1, 2)])
    found = remedies(b, recipe("generation.backend=vllm", "model.lora.enabled=true"))
    assert [x.overrides for x in found] == [("vllm.lora_sync=adapter",), ("train.steps_per_generation=2",)]
    assert remedies(b, recipe()) == ()  # hf syncs nothing: nothing to turn


def test_grpo_inspect_prints_the_bottleneck_of_a_run(grpo, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.resolved.toml").write_text(
        '[model]\nname_or_path = "tiny"\n[data]\ndataset = "arithmetic"\n[[rewards]]\nname = "length"\n'
        '[generation]\nbackend = "hf"\n[train]\nsteps = 4\nmicro_batch_size = 2\n')
    (run / "metrics.jsonl").write_text("".join(json.dumps(line(s, reward=0.1)) + "\n" for s in range(1, 5)))
    out = grpo("inspect", str(run), "--no-plot", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    text = out.stdout.split("bottleneck", 1)[1]
    assert "Bottleneck: training 73% of a 0.41 s step (median of steps 2-4" in text
    assert "train.micro_batch_size 2 -> 4: fewer, larger passes" in text
    assert f"memory not checked: the plan needs a device size (grpo inspect {run} --gpu-memory 80GiB)" in text
    assert f"measure it: grpo bench {run}/config.resolved.toml train.micro_batch_size=4" in text
