"""One training process of tests/engines/test_vllm_gpu2.py (run by torchrun, one per GPU): builds the
colocated engine through accelerate and grpo's strategy as `grpo train` does, generates, syncs,
generates again on the prefetch thread, and writes what it saw to OUT/rank-R.json.

Usage: python -m torch.distributed.run --nproc-per-node 2 gpu2_colocate_worker.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

TINY = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128}


def main(out: Path) -> None:
    from accelerate import Accelerator

    from grpocli.generation.base import Sampling
    from grpocli.generation.devices import gpu_identity
    from grpocli.generation.vllm_colocate import VllmColocateBackend
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.parallel import Parallel
    from grpocli.recipe import load_recipe
    from grpocli.recipe.schema import TinyModel
    from grpocli.trainer.prefetch import Prefetcher

    accelerator = Accelerator()
    parallel = Parallel(accelerator)
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(TinyModel(**TINY), tokenizer, 0).to(parallel.device)
    r = load_recipe(None, ["generation.backend='vllm'", "vllm.gpu_memory_utilization=0.3",
                           "vllm.enforce_eager=true"]).recipe
    backend = VllmColocateBackend(model, tokenizer, max_prompt_length=64, max_completion_length=16,
                                  vllm_section=r.vllm, dtype="float32", seed=parallel.rank, parallel=parallel)
    current_after_start = torch.cuda.current_device()
    engine_device = backend.engine.llm.apply_model(lambda m: str(next(m.parameters()).device))[0]
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)
    backend.sync_weights(model)
    pf = Prefetcher(backend, ahead=0, n=2, sampling=Sampling(max_tokens=8))
    try:
        _, generated, _ = pf.next(lambda: [{"prompt_text": "12+7="}], step=0)
    finally:
        pf.close()
    report = {
        "rank": parallel.rank, "size": parallel.size, "device": str(parallel.device),
        "current_after_start": current_after_start, "current_at_end": torch.cuda.current_device(),
        "engine_device": engine_device, "engine_uuid": gpu_identity(backend.engine.device)["uuid"],
        "own_uuid": gpu_identity(parallel.device)["uuid"],
        "allocated": [torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count())],
        "completions": len(generated.completion_ids),
        "backend": backend.engine.llm.llm_engine.vllm_config.parallel_config.distributed_executor_backend,
    }
    (out / f"rank-{parallel.rank}.json").write_text(json.dumps(report))
    backend.close()
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
