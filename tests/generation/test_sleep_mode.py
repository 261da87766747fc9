"""vllm.sleep_mode: refused with exit 2 where it cannot apply (this CPU's vLLM has no sleep mode; other
backends; generating ahead), through the real command line; the engine argument; the order of the
engine's sleep and wake calls; and on a CUDA GPU (marker `gpu`, skipped elsewhere with the reason) two
training steps with levels 1 and 2: the engine's memory drops while it sleeps and, woken, it generates
from the trained policy."""

from __future__ import annotations

import pytest
from tiny_runs import FAST

from grpocli.errors import UserError
from grpocli.generation.engine_options import engine_options
from grpocli.generation.engine_sleep import EngineSleep, check_sleep_mode


def test_this_cpus_vllm_refuses_sleep_mode_before_anything_loads(grpo, tmp_path):
    pytest.importorskip("vllm.platforms", reason="vLLM is not installed: pip install 'grpocli[vllm]'")
    out = grpo("train", "quickstart", *FAST, "generation.backend=vllm", "vllm.sleep_mode=1",
               f"train.output_dir={tmp_path / 'run'}")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert "vllm.sleep_mode: vLLM's sleep mode (level 1) needs a CUDA GPU" in out.stderr
    assert "is_sleep_mode_available" in out.stderr and "vllm.sleep_mode=0" in out.stderr
    assert not (tmp_path / "run" / "config.resolved.toml").exists()  # refused before the run, model or engine


def test_sleep_mode_with_another_backend_is_refused(grpo, tmp_path):
    out = grpo("train", "quickstart", *FAST, "generation.backend=hf", "vllm.sleep_mode=2",
               f"train.output_dir={tmp_path / 'run'}")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "sleep mode (level 2) applies only to the colocated vLLM engine, not to generation.backend = 'hf'" in (
        out.stderr)
    assert 'generation.backend = "vllm"' in out.stderr and "vllm.sleep_mode=0" in out.stderr
    with pytest.raises(UserError, match="not to generation.backend = 'vllm-server'"):
        check_sleep_mode(1, backend="vllm-server")
    with pytest.raises(UserError, match="cannot generate ahead"):
        check_sleep_mode(2, backend="vllm", async_steps=1)
    check_sleep_mode(0, backend="hf", async_steps=1)  # off: nothing to check


def test_the_keys_are_documented(grpo):
    out = grpo("inspect", "fields", env={"COLUMNS": "250"})
    assert out.returncode == 0, out.stderr
    for key in ("vllm.sleep_mode", "train.activation_offloading", "train.logprob_micro_batch_size"):
        assert key in out.stdout, key
    found = grpo("inspect", "fields", "--trl", "vllm_enable_sleep_mode", env={"COLUMNS": "250"})
    assert "vllm.sleep_mode" in found.stdout and "level 2" in found.stdout


def test_the_engine_is_started_with_sleep_mode_only_when_asked():
    assert engine_options("m", None, sleep_mode=True).kwargs["enable_sleep_mode"] is True
    assert "enable_sleep_mode" not in engine_options("m", None).kwargs


class Calls:
    """Records what is asked of an engine, in order (a CPU's vLLM cannot sleep; the GPU test below runs vLLM's)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags: list[str]) -> None:
        self.calls.append(("wake_up", *tags))


@pytest.mark.parametrize("level", [1, 2])
def test_weights_wake_before_a_sync_and_level_2_sends_them_again(level):
    engine = Calls()

    def sync(policy):  # the backend's sync_weights: wake the weights, load them
        state.wake_weights()
        engine.calls.append(("load", policy))
        state.weights_sent()

    state = EngineSleep(engine, level, sync)
    state.sleep()                       # after the engine starts
    state.before_generation("policy-0")  # first generation
    state.sleep()
    sync("policy-1")                    # after the optimizer steps
    state.before_generation("policy-1")
    state.sleep()
    first = [("load", "policy-0")] if level == 2 else []  # level 2 dropped the first weights: sent again
    assert engine.calls == [
        ("sleep", level), ("wake_up", "weights"), *first, ("wake_up", "kv_cache"), ("sleep", level),
        ("wake_up", "weights"), ("load", "policy-1"), ("wake_up", "kv_cache"), ("sleep", level),
    ]
    assert state.sleeps == 3
    off = EngineSleep(Calls(), 0, sync)  # vllm.sleep_mode = 0: nothing is asked of the engine
    off.sleep()
    off.before_generation("p")
    off.wake_weights()
    assert off.engine.calls == []


@pytest.mark.gpu
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("level", [1, 2])
def test_two_steps_beside_a_sleeping_engine_on_a_gpu(level, tmp_path):
    """Train 2 steps with vllm.sleep_mode = level; asleep the engine holds at least 1 GiB less of the
    GPU than awake; woken (level 2: its weights dropped, so sent again) its log-probs are the trained
    policy's (float32 engine), not the first policy's."""
    import copy

    import torch

    pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed: pip install 'grpocli[vllm]'")
    from grpocli.generation.base import Sampling
    from grpocli.recipe import load_recipe
    from grpocli.trainer.loop import Loop
    from grpocli.trainer.session import Session

    s = Session.open(load_recipe("quickstart", [
        *FAST, "model.tiny.hidden_size=64", "generation.backend=vllm", f"vllm.sleep_mode={level}",
        "vllm.dtype=float32", "vllm.enforce_eager=true", "vllm.gpu_memory_utilization=0.3",
        "train.learning_rate=1e-3", f"train.output_dir={tmp_path / 'run'}"]))
    try:
        first = copy.deepcopy(s.policy).to("cpu")
        Loop(s).run()
        backend = s.backend
        backend.sleep.sleep()
        torch.cuda.synchronize()
        asleep = torch.cuda.mem_get_info()[0]
        backend.sleep.before_generation(s.policy)
        awake = torch.cuda.mem_get_info()[0]
        assert asleep - awake > 2**30, (asleep, awake)
        backend.sleep.sleep()
        generated = backend.generate(["12+7=", "3*4="], 2, Sampling(max_tokens=8, temperature=1.0))
        trained = copy.deepcopy(s.policy).to("cpu")
        now, then = _gap(trained, generated, 2), _gap(first, generated, 2)
        assert now < 0.05 and now < then / 2, (now, then)
        assert backend.sleep.weights_asleep and backend.sleep.kv_asleep  # asleep again after generating
    finally:
        s.close()


def _gap(model, generated, n: int) -> float:
    """Mean |engine log-prob - the model's| over the generated tokens."""
    import torch

    diffs = []
    with torch.no_grad():
        for i, (ids, logp) in enumerate(zip(generated.completion_ids, generated.logprobs, strict=True)):
            prompt = generated.prompt_ids[i // n]
            logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
            want = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids)[:, None])[:, 0]
            diffs += (torch.tensor(logp) - want).abs().tolist()
    return sum(diffs) / len(diffs)
