"""One side of `grpo bench --vs-trl` in this (fresh) process: `grpo` or TRL's GRPOTrainer, N steps of a
recipe at equal work, one `BENCH {json}` line out.

    python -m grpocli.benchmark.workers grpo RECIPE [--override key=value ...] --steps N
    python -m grpocli.benchmark.workers trl  RECIPE [--override key=value ...] --steps N

Both sides get the recipe's model (the same weights: a tiny model from the same config and seed, or
the same checkpoint), tokenizer, rendered prompts in grpo's order, reward functions and weights, B
prompts x G completions, max_completion_length, micro-batch size, learning rate, temperature and
top_p, and the same loss: dapo, beta = 0, one iteration, epsilon 0.2, constant learning rate, no
weight decay (`EQUAL_WORK`, applied to grpo as overrides). End-of-sequence is suppressed on both
sides (transformers' `suppress_tokens`; on grpo's colocated vLLM engine `min_tokens = max_tokens`
and `ignore_eos`), so every completion has exactly max_completion_length tokens and both generate,
score and back-propagate the same number of tokens (the grpo worker fails if they differ).

Phases are timed the same way on both sides by wrapping the framework's own functions:
    generation      grpo: backend.generate          TRL: _generate_single_turn
    logprobs        grpo: frozen_logprobs (old/ref) TRL: _get_per_token_logps_and_entropies without grad
    loss_backward   grpo: micro_batch_loss + accelerator.backward
                    TRL: compute_loss + accelerator.backward
    optimizer       accelerator.clip_grad_norm_ + torch.optim.AdamW.step (both)
    weight_sync     grpo: backend.sync_weights      TRL: none (transformers generation, same model)
    other           the rest of the step (rewards, advantages, batching, logging, ...)
A step ends when TRL's AdamW.step returns, and when grpo records it (a grpo step whose groups all lack
reward spread skips the update).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import resource
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")

PHASES = ("generation", "logprobs", "loss_backward", "optimizer", "weight_sync")
#: The loss and optimizer settings both sides train with (TRL's GRPOConfig below says the same).
EQUAL_WORK = ("algorithm.loss=dapo", "algorithm.beta=0.0", "algorithm.num_iterations=1", "algorithm.epsilon_low=0.2",
              "algorithm.epsilon_high=0.2", "train.lr_scheduler=constant", "train.warmup_steps=0",
              "train.weight_decay=0.0", "train.steps_per_generation=1", "eval.every=0", "train.save_steps=0",
              "log.rollouts_every=0", "log.progress=none", "log.report_to=[]")


class PhaseClock:
    """Seconds per phase, cut into optimizer steps by `end_step`."""

    def __init__(self) -> None:
        self.current = dict.fromkeys(PHASES, 0.0)
        self.steps: list[dict[str, float]] = []
        self.tokens = 0            # completion tokens generated since the last step
        self.last = time.perf_counter()
        self.rss: list[int] = []   # peak resident set (KiB) after each step
        self.cuda: list[int] = []  # torch.cuda.max_memory_allocated after each step (bytes; GPU only)
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
        import torch

        now = time.perf_counter()
        row = {**self.current, "total": now - self.last, "completion_tokens": self.tokens}
        row["other"] = row["total"] - sum(self.current[p] for p in PHASES)
        self.steps.append(row)
        self.rss.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        if torch.cuda.is_available():
            self.cuda.append(torch.cuda.max_memory_allocated())
        self.current = dict.fromkeys(PHASES, 0.0)
        self.tokens = 0
        self.last = now


def time_optimizer(clock: PhaseClock, *, ends_step: bool) -> None:
    """AdamW.step is a phase for both frameworks, and the end of a step for TRL."""
    import torch

    step = torch.optim.AdamW.step

    def timed_step(self, *args, **kwargs):
        with clock.phase("optimizer"):
            out = step(self, *args, **kwargs)
        if ends_step:
            clock.end_step()
        return out

    torch.optim.AdamW.step = timed_step


def bench_recipe(a: argparse.Namespace, out_dir: str) -> Any:
    from grpocli.recipe import load_recipe

    return load_recipe(a.recipe, [*a.override, *EQUAL_WORK, f"train.steps={a.steps}", f"train.output_dir={out_dir}"])


def run_grpo(a: argparse.Namespace, clock: PhaseClock) -> str:
    from grpocli.benchmark.measurement import force_lengths
    from grpocli.trainer import loop as loop_module
    from grpocli.trainer import step as step_module
    from grpocli.trainer.session import Session

    resolved = bench_recipe(a, tempfile.mkdtemp(prefix="bench-grpo-"))
    r = resolved.recipe
    threads = r.train.torch_threads
    if threads and r.generation.backend in ("vllm", "auto"):  # before vLLM is imported (it binds every core)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{threads - 1}")
    s = Session.open(resolved)
    clock.parameters = sum(p.numel() for p in s.policy.parameters())
    force_lengths(s)
    length = r.generation.max_completion_length
    generate = s.backend.generate

    def counted_generate(*args, **kwargs):
        with clock.phase("generation"):
            g = generate(*args, **kwargs)
        lengths = {len(c) for c in g.completion_ids}
        if lengths != {length}:
            raise SystemExit(f"grpo completion lengths {sorted(lengths)}, expected all {length} (forced)")
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
    backend = type(s.backend).__name__
    clock.last = time.perf_counter()
    try:
        loop_module.Loop(s).run()
    finally:
        s.close()
    return backend


def trl_reward(rf: Any) -> Callable[..., list]:
    """A grpo reward (function, args, name) as TRL calls one: by __name__, with TRL's keywords
    (only those it declares, unless it takes **kwargs)."""
    params = inspect.signature(rf.fn).parameters
    open_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    def reward(prompts, completions, **kwargs):
        kwargs = kwargs if open_kwargs else {k: v for k, v in kwargs.items() if k in params}
        return rf.fn(prompts, completions, **{**kwargs, **rf.args})

    reward.__name__ = rf.name.replace(".", "_")
    return reward


def run_trl(a: argparse.Namespace, clock: PhaseClock) -> str:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from grpocli.benchmark.measurement import eos_ids
    from grpocli.data.stream import PromptStream
    from grpocli.data.template import RenderedPrompts
    from grpocli.models.loader import load_policy, load_tokenizer
    from grpocli.trainer.preflight import preflight

    out = tempfile.mkdtemp(prefix="bench-trl-")
    r = bench_recipe(a, out).recipe
    if r.train.torch_threads:
        torch.set_num_threads(r.train.torch_threads)
    checked = preflight(r)
    tok, model = load_tokenizer(r.model), load_policy(r.model, r.train.seed)
    b, g, length = r.train.prompts_per_step, r.generation.num_generations, r.generation.max_completion_length
    # the prompts grpo trains on, in grpo's order (same rendering, same shuffle)
    stream = PromptStream(RenderedPrompts(checked.dataset, r.data, tok), seed=r.train.seed, shuffle=r.data.shuffle)
    rows = stream.take(b * (a.steps + 1))
    skip = {r.data.prompt_column, "prompt", "prompt_text"}
    columns = {k: [row[k] for row in rows] for k in rows[0] if k not in skip}
    clock.parameters = sum(p.numel() for p in model.parameters())
    config = GRPOConfig(
        output_dir=out, use_cpu=not torch.cuda.is_available(), report_to="none", save_strategy="no",
        disable_tqdm=True, logging_steps=1, max_steps=a.steps, seed=r.train.seed, shuffle_dataset=False,
        per_device_train_batch_size=r.train.micro_batch_size,
        gradient_accumulation_steps=max(b * g // r.train.micro_batch_size, 1),
        num_generations=g, max_completion_length=length, temperature=r.generation.temperature,
        top_p=r.generation.top_p, generation_kwargs={"suppress_tokens": eos_ids(model)},
        loss_type="dapo", beta=0.0, num_iterations=1, epsilon=0.2, scale_rewards="group",
        learning_rate=r.train.learning_rate, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=r.train.max_grad_norm, mask_truncated_completions=False, log_completions=False,
        dataloader_num_workers=0, reward_weights=[float(rf.weight) for rf in checked.reward_fns],
        # grpo's settings: the model's own dtype without autocast, no gradient checkpointing (TRL's
        # defaults are bf16 autocast and checkpointing, several times slower on a CPU)
        bf16=False, gradient_checkpointing=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=[trl_reward(rf) for rf in checked.reward_fns], args=config,
                          processing_class=tok,
                          train_dataset=Dataset.from_dict({"prompt": [row["prompt_text"] for row in rows], **columns}))
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
    return "transformers"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("framework", choices=["grpo", "trl"])
    p.add_argument("recipe", help="recipe path or built-in name")
    p.add_argument("--override", action="append", default=[], help="section.key=value (repeatable)")
    p.add_argument("--steps", type=int, default=4)
    a = p.parse_args(argv)
    import torch
    import transformers

    clock = PhaseClock()
    time_optimizer(clock, ends_step=a.framework == "trl")
    backend = (run_grpo if a.framework == "grpo" else run_trl)(a, clock)
    result = {
        "framework": a.framework, "steps": clock.steps, "peak_rss_kib": clock.rss, "cuda_max_allocated": clock.cuda,
        "parameters": clock.parameters, "torch": torch.__version__, "transformers": transformers.__version__,
        "backend": backend, "threads": torch.get_num_threads(),
    }
    print("BENCH " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
