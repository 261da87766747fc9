"""One benchmark trial in this process: `grpo` or TRL's GRPOTrainer, N optimizer steps, a JSON line out.

Both sides get the same work: the same tiny Qwen2 model (grpocli.models.build_tiny_model, same
seed), the same character tokenizer, the same rendered prompts in the same order, the same G,
micro-batch size, completion length, loss (dapo, beta = 0, one iteration, epsilon 0.2), AdamW
settings and constant learning rate. End-of-sequence tokens are suppressed in both (transformers'
`suppress_tokens` logits processor), so every completion has exactly `max_completion_length`
tokens and both sides generate, score and back-propagate the same number of tokens.
With `--backend vllm` grpo generates with its colocated vLLM engine (generation.backend = "vllm");
there every request gets `min_tokens = max_tokens` (vLLM masks the stop tokens until then, as
`suppress_tokens` does) and `ignore_eos`, so completions again have exactly the forced length
(checked: the worker fails if a step's completion tokens differ from B * G * length).

Phases are timed the same way on both sides by wrapping the framework's own functions:
    generation      grpo: backend.generate          TRL: _generate_single_turn
    logprobs        grpo: frozen_logprobs (old/ref) TRL: _get_per_token_logps_and_entropies without grad
    loss_backward   grpo: micro_batch_loss + accelerator.backward
                    TRL: compute_loss + accelerator.backward
    optimizer       accelerator.clip_grad_norm_ + torch.optim.AdamW.step (both)
    weight_sync     grpo: backend.sync_weights      TRL: none (transformers generation, same model)
    other           the rest of the step (rewards, advantages, batching, logging, ...)
A step ends when TRL's AdamW.step returns, and when grpo records it (a grpo step whose groups all lack
reward spread skips the update); step 1 (warm-up) is reported apart from the median.

Run through bench_vs_trl.py; by hand:
    python tests/bench/bench_workers.py grpo --model tiny --threads 1 --steps 8
    python tests/bench/bench_workers.py grpo --backend vllm --model smollm2 --threads 1 --length 48 --micro-batch 16 --lr 5e-6
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

#: Model shapes (Qwen2, vocabulary 104): about 1M and 30M parameters; "smollm2" is the built-in
#: recipe smollm2_arithmetic (SmolLM2-135M-Instruct from the packaged GGUF, its chat template,
#: arithmetic prompts and the arithmetic.exact reward) with the bench's B, G, length and micro-batch.
MODELS = {
    "tiny": dict(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512),
    "small": dict(hidden_size=512, num_layers=8, num_heads=8, intermediate_size=1792),
    "smollm2": None,
}
REAL_RECIPE = "smollm2_arithmetic"
PHASES = ("generation", "logprobs", "loss_backward", "optimizer", "weight_sync")


class PhaseClock:
    """Seconds per phase, cut into optimizer steps at each `AdamW.step`."""

    def __init__(self) -> None:
        self.current = dict.fromkeys(PHASES, 0.0)
        self.steps: list[dict[str, float]] = []
        self.tokens = 0            # completion tokens generated since the last step
        self.last = time.perf_counter()
        self.rss: list[int] = []   # peak resident set (KiB) after each step
        self.parameters = 0
        self._depth = 0

    @contextmanager
    def phase(self, name: str):
        if self._depth:  # nested (e.g. clip inside a timed phase): count once, in the outer one
            yield
            return
        self._depth += 1
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.current[name] += time.perf_counter() - t0
            self._depth -= 1

    def wrap(self, obj: Any, attr: str, name: str, when: Callable[[], bool] = lambda: True) -> None:
        fn = getattr(obj, attr)

        def timed(*args, **kwargs):
            if not when():
                return fn(*args, **kwargs)
            with self.phase(name):
                return fn(*args, **kwargs)

        setattr(obj, attr, timed)

    def end_step(self) -> None:
        now = time.perf_counter()
        row = {**self.current, "total": now - self.last, "completion_tokens": self.tokens}
        row["other"] = row["total"] - sum(self.current[p] for p in PHASES)
        self.steps.append(row)
        self.rss.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        self.current = dict.fromkeys(PHASES, 0.0)
        self.tokens = 0
        self.last = now


def time_optimizer(clock: PhaseClock, *, ends_step: bool) -> None:
    """AdamW.step is a phase, for both frameworks, and the end of a step for TRL (grpo ends a step
    when it records it: an update it skips, a batch whose groups all lack reward spread, is a
    step that calls no AdamW.step)."""
    import torch

    step = torch.optim.AdamW.step

    def timed_step(self, *args, **kwargs):
        with clock.phase("optimizer"):
            out = step(self, *args, **kwargs)
        if ends_step:
            clock.end_step()
        return out

    torch.optim.AdamW.step = timed_step


def recipe_overrides(a: argparse.Namespace, out_dir: str) -> list[str]:
    shape = MODELS[a.model]
    model = ["model.name_or_path=tiny", *(f"model.tiny.{k}={v}" for k, v in shape.items()),
             "data.dataset=arithmetic", "data.args.num_samples=2000"] if shape else []
    return [
        *model, "eval.every=0", "train.save_steps=0", f"train.torch_threads={a.threads}",
        f"generation.num_generations={a.g}", f"generation.max_completion_length={a.length}",
        "algorithm.loss=dapo", "algorithm.beta=0.0", "algorithm.num_iterations=1",
        f"train.prompts_per_step={a.b}", f"train.micro_batch_size={a.micro_batch}",
        f"train.steps={a.steps}", f"train.learning_rate={a.lr}", f"train.seed={a.seed}",
        f"train.output_dir={out_dir}", "log.rollouts_every=0", "log.progress=none",
        f"generation.backend={a.backend}", *a.grpo_override,
    ]


def eos_ids(model: Any) -> list[int]:
    """The model's end-of-sequence ids as a list (generation_config holds an int or a list)."""
    eos = model.generation_config.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos)


def length_reward_fn(target: int) -> Callable[..., list[float]]:
    from grpocli.rewards.builtin import length

    def length_reward(prompts, completions, **kwargs):  # TRL names a reward by __name__
        return length(prompts, completions, target=target)

    return length_reward


def bind_vllm_threads(threads: int) -> None:
    """Bind the engine's OpenMP threads to the first `threads` cores, before vLLM is imported.

    vLLM binds all cores by default and then disables torch.set_num_threads in this process, so
    this is what makes --threads hold for the grpo + vLLM process (generation and training alike).
    """
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}"


def force_vllm_lengths(engine: Any) -> None:
    """vLLM side of the forced lengths: every request of this engine gets `min_tokens = max_tokens`
    (the stop tokens' logits are masked until max_tokens, so EOS is never sampled, like
    transformers' `suppress_tokens`) and `ignore_eos`. Wraps the engine's own `vllm.LLM.generate`
    (VllmEngine.raw calls it with one SamplingParams for all prompts)."""
    generate = engine.llm.generate

    def forced_generate(prompts, params, *args, **kwargs):
        params.min_tokens, params.ignore_eos = params.max_tokens, True
        return generate(prompts, params, *args, **kwargs)

    engine.llm.generate = forced_generate


def run_grpo(a: argparse.Namespace, clock: PhaseClock) -> None:
    from grpocli.recipe import load_recipe
    from grpocli.trainer import loop as loop_module
    from grpocli.trainer import step as step_module
    from grpocli.trainer.session import Session

    if a.backend == "vllm":
        bind_vllm_threads(a.threads)
    out = tempfile.mkdtemp(prefix="bench-grpo-")
    resolved = load_recipe(REAL_RECIPE if a.model == "smollm2" else None, recipe_overrides(a, out))
    if MODELS[a.model]:
        resolved.recipe.rewards[0].args["target"] = a.target  # the default reward is `length`
    s = Session.open(resolved)
    model = s.policy
    clock.parameters = sum(p.numel() for p in model.parameters())
    model.generation_config.suppress_tokens = eos_ids(model)
    if a.backend == "vllm":
        force_vllm_lengths(s.backend.engine)
    generate = s.backend.generate

    def counted_generate(*args, **kwargs):
        with clock.phase("generation"):
            g = generate(*args, **kwargs)
        lengths = {len(c) for c in g.completion_ids}
        if a.backend == "vllm" and lengths != {a.length}:
            raise SystemExit(f"vLLM completion lengths {sorted(lengths)}, expected all {a.length} (forced)")
        clock.tokens += sum(len(c) for c in g.completion_ids)
        return g

    s.backend.generate = counted_generate
    record = loop_module.Loop.record

    def recorded(self, *args, **kwargs):  # the end of a grpo step, skipped update or not
        record(self, *args, **kwargs)
        clock.end_step()

    loop_module.Loop.record = recorded
    clock.wrap(s.backend, "sync_weights", "weight_sync")
    clock.wrap(loop_module, "frozen_logprobs", "logprobs")
    clock.wrap(step_module, "micro_batch_loss", "loss_backward")
    clock.wrap(s.parallel.accelerator, "backward", "loss_backward")
    clock.wrap(s.parallel.accelerator, "clip_grad_norm_", "optimizer")
    clock.last = time.perf_counter()
    try:
        loop_module.Loop(s).run()
    finally:
        s.close()


def run_trl(a: argparse.Namespace, clock: PhaseClock) -> None:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from grpocli.data.source import load_dataset_for
    from grpocli.data.stream import PromptStream
    from grpocli.data.template import RenderedPrompts
    from grpocli.models import build_char_tokenizer, build_tiny_model
    from grpocli.recipe import load_recipe
    from grpocli.registry import load_plugins

    out = tempfile.mkdtemp(prefix="bench-trl-")
    r = load_recipe(REAL_RECIPE if a.model == "smollm2" else None, recipe_overrides(a, out)).recipe
    if MODELS[a.model]:
        tok = build_char_tokenizer()
        model = build_tiny_model(r.model.tiny, tok, r.train.seed)
        reward = length_reward_fn(a.target)
    else:  # the same float32 model grpo trains (dequantized from the GGUF file), the recipe's reward
        from grpocli.models.loader import load_policy, load_tokenizer
        from grpocli.rewards.builtin import arithmetic_exact as reward

        tok, model = load_tokenizer(r.model), load_policy(r.model, r.train.seed)
    # the prompts grpo trains on, in grpo's order (same rendering, same shuffle)
    rows = load_dataset_for(r.data, load_plugins().datasets, r.data.split, r.train.seed)
    stream = PromptStream(RenderedPrompts(rows, r.data, tok), seed=r.train.seed, shuffle=r.data.shuffle)
    rows = stream.take(a.b * (a.steps + 1))
    prompts = [row["prompt_text"] for row in rows]  # chat template applied, as grpo renders them
    columns = {"answer": [row["answer"] for row in rows]} if not MODELS[a.model] else {}
    eos = eos_ids(model)
    clock.parameters = sum(p.numel() for p in model.parameters())
    config = GRPOConfig(
        output_dir=out, use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True,
        logging_steps=1, max_steps=a.steps, seed=r.train.seed, shuffle_dataset=False,
        per_device_train_batch_size=a.micro_batch, gradient_accumulation_steps=a.b * a.g // a.micro_batch,
        num_generations=a.g, max_completion_length=a.length, temperature=r.generation.temperature, top_p=r.generation.top_p,
        generation_kwargs={"suppress_tokens": eos},
        loss_type="dapo", beta=0.0, num_iterations=1, epsilon=0.2, scale_rewards="group",
        learning_rate=a.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, mask_truncated_completions=False, log_completions=False,
        dataloader_num_workers=0,
        # grpo's settings: float32 without autocast, no gradient checkpointing (TRL's defaults
        # are bf16 autocast and checkpointing, several times slower on this CPU; --trl-defaults)
        bf16=a.trl_defaults, gradient_checkpointing=a.trl_defaults,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=config, processing_class=tok,
                          train_dataset=Dataset.from_dict({"prompt": prompts, **columns}))
    single_turn = trainer._generate_single_turn

    def counted_generate(*args, **kwargs):
        with clock.phase("generation"):
            completion_ids, logprobs = single_turn(*args, **kwargs)
        clock.tokens += sum(len(c) for c in completion_ids)
        return completion_ids, logprobs

    trainer._generate_single_turn = counted_generate
    clock.wrap(trainer, "_get_per_token_logps_and_entropies", "logprobs", when=lambda: not torch.is_grad_enabled())
    clock.wrap(trainer, "compute_loss", "loss_backward")
    clock.wrap(trainer.accelerator, "backward", "loss_backward")
    clock.wrap(trainer.accelerator, "clip_grad_norm_", "optimizer")
    clock.last = time.perf_counter()
    trainer.train()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("framework", choices=["grpo", "trl"])
    p.add_argument("--model", choices=sorted(MODELS), default="tiny")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--b", type=int, default=8, help="prompts per step")
    p.add_argument("--g", type=int, default=8, help="completions per prompt")
    p.add_argument("--length", type=int, default=24, help="completion tokens (forced)")
    p.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward")
    p.add_argument("--target", type=int, default=16, help="length reward target (characters)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-4, help="learning rate (both)")
    p.add_argument("--backend", choices=["hf", "vllm"], default="hf",
                   help="grpo's generation.backend (vllm: colocated engine; needs vllm installed)")
    p.add_argument("--trl-defaults", action="store_true", help="TRL's bf16 + gradient checkpointing")
    p.add_argument("--grpo-override", action="append", default=[], help="extra grpo recipe key=value")
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    clock = PhaseClock()
    time_optimizer(clock, ends_step=a.framework == "trl")
    (run_grpo if a.framework == "grpo" else run_trl)(a, clock)
    import transformers

    result = {
        "framework": a.framework, "model": a.model, "threads": a.threads, "steps": clock.steps,
        "peak_rss_kib": clock.rss, "parameters": clock.parameters, "torch": torch.__version__,
        "transformers": transformers.__version__, "backend": a.backend if a.framework == "grpo" else "hf",
    }
    if a.framework == "grpo" and a.backend == "vllm":
        import vllm

        result["vllm"] = vllm.__version__
    print("BENCH " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    main()
