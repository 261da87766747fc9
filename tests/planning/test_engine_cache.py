"""`grpo plan` and the colocated vLLM engine's KV cache: the sequences it holds at once (in flight:
the carried-over groups too) and their cache at full length, by hand."""

from __future__ import annotations

from grpocli.planning import make_plan, shape_of
from grpocli.recipe import load_recipe

GIB = 2**30
SHAPE = ["model.tiny.hidden_size=64", "model.tiny.num_layers=2", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
         "model.tiny.intermediate_size=128"]


def _cache(*keys: str, gpus: int = 1):
    r = load_recipe("quickstart", [*SHAPE, "train.prompts_per_step=8", "generation.num_generations=8",
                                   "data.max_prompt_length=40", "generation.max_completion_length=24",
                                   "vllm.gpu_memory_utilization=0.5", *keys]).recipe
    shape = shape_of(r.model)
    return shape, make_plan(r, shape, gpus=gpus, gpu_memory=8 * GIB, knobs=False).engine_cache


def test_sync_holds_one_batch_and_inflight_the_carried_over_ones():
    shape, sync = _cache("generation.backend=vllm")
    per_sequence = 64 * 2 * 2 * 1 * 32 * 2      # 64 tokens x (k, v) x 2 layers x 1 kv head x 32 x bf16
    assert (shape.num_kv_heads, shape.head_dim) == (1, 32)
    assert (sync.sequences, sync.batches, sync.needed) == (64, 1, 64 * per_sequence)
    assert sync.available == 4 * GIB - shape.params * 2 and sync.fits
    assert _cache("generation.backend=vllm", "generation.async_steps=1")[1].sequences == 64
    _, inflight = _cache("generation.backend=vllm", "generation.pipeline=inflight", "generation.max_staleness=2")
    assert (inflight.sequences, inflight.batches) == (192, 3)        # L = 2 cycles carried over, + this one
    _, paced = _cache("generation.backend=vllm", "generation.pipeline=inflight", "train.steps_per_generation=2",
                      "generation.max_staleness=3")
    assert (paced.sequences, paced.batches) == (2 * 128, 2)          # 3 // 2 = 1 cycle carried over, at least 1


def test_other_backends_have_none_and_a_small_share_is_said_not_refused():
    assert _cache("generation.backend=hf")[1] is None
    _, small = _cache("generation.backend=vllm", "vllm.gpu_memory_utilization=0.01", "generation.pipeline=inflight",
                      "generation.max_completion_length=4000")
    assert not small.fits and "preempt and recompute" in small.text(lambda n: f"{n / GIB:.2f} GiB")


#: Qwen2.5-7B-Instruct's config.json (the numbers of its public config).
QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 152064, "hidden_act": "silu",
             "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16", "hidden_size": 3584, "intermediate_size": 18944,
             "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4}


def test_adapter_syncs_send_the_adapters_and_the_engine_holds_their_buffers(tmp_path):
    """7B with r = 16 on q and v (in bfloat16): 28 layers x 16 x ((3584 + 3584) + (3584 + 512)) x 2 bytes a sync,
    against the whole model's 15 GB; the engine's buffers hold one adapter at vLLM's rank 16."""
    import json

    folder = tmp_path / "q7"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN25_7B))
    r = load_recipe("quickstart", [f"model.name_or_path={folder}", "model.dtype=bfloat16", "generation.backend=vllm",
                                   "model.lora.enabled=true", "model.lora.r=16", 'model.lora.target_modules=["q_proj", "v_proj"]',
                                   "vllm.gpu_memory_utilization=0.5"]).recipe
    shape = shape_of(r.model, str(folder))
    cache = make_plan(r, shape, gpus=1, gpu_memory=80 * GIB, knobs=False).engine_cache
    adapters = 28 * 16 * ((3584 + 3584) + (3584 + 512))
    assert shape.params == 7_615_616_512
    assert (cache.sync, cache.lora, cache.merged) == (adapters * 2, adapters * 2, shape.params * 2)
    assert cache.available == 40 * GIB - shape.params * 2 - adapters * 2
    merged = make_plan(load_recipe("quickstart", [f"model.name_or_path={folder}", "model.dtype=bfloat16",
                                                  "generation.backend=vllm", "model.lora.enabled=true",
                                                  "vllm.lora_sync=merged"]).recipe, shape, gpus=1,
                       gpu_memory=80 * GIB, knobs=False).engine_cache
    assert (merged.lora, merged.sync) == (0, shape.params * 2)
    assert "sends the adapters alone" in cache.text(lambda n: f"{n / GIB:.2f} GiB")
