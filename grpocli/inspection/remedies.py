"""What to turn when a phase bounds the step: recipe keys and the values to set, each with why and the
gain the measured seconds allow (an upper bound, said so). No torch, no plan: where a change needs
device memory ("memory"), the engine's KV cache ("kv") or changes what a weight sync sends ("sync"),
grpocli.planning.headroom asks `grpo plan`'s model and fills in what it says.

    training    train.micro_batch_size / train.max_tokens_per_micro_batch doubled (fewer passes),
                model.gradient_checkpointing off, train.activation_offloading off
    logprobs    train.logprob_micro_batch_size doubled, algorithm.reference = "server"
    generation  an engine apart from the policy generating ahead (generation.async_steps, pipeline
                "inflight", max_staleness), backend "paged" for uneven lengths, a larger KV cache
                (vllm.gpu_memory_utilization, on a GPU), one more server (vllm.server_url)
    rewards     the slowest reward (rewards/<name>/seconds where logged) served by `grpo reward-serve`
                (its url, several splitting a batch), its timeout where a few slow calls hold steps up
    weight_sync vllm.lora_sync = "adapter", train.steps_per_generation doubled, vllm.sleep_mode 2 -> 1
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from grpocli.inspection.bottleneck import PHASES, SPIKY_REWARDS, Bottleneck

if TYPE_CHECKING:
    from grpocli.recipe.schema import Recipe

#: Completions whose mean length is under this share of the batch's longest: 'paged' pays.
UNEVEN = 0.6
#: The colocated engine's share is raised by this step (and by half of it, if that is what fits).
SHARE_STEP = 0.2
SHARE_MAX = 0.9


@dataclass(frozen=True)
class Remedy:
    """One change for a bounding phase: (key, value now, value to set) each, and what it should do."""

    phase: str
    changes: tuple[tuple[str, Any, Any], ...]
    why: str
    gain: str = ""       # from the measured seconds
    check: str = ""      # what the plan can tell: "memory", "kv", "sync"; "" nothing
    plan: str = ""       # what it told (grpocli.planning.headroom)
    paste: bool = True   # the changes are section.key=value overrides (not a [[rewards]] entry, not a description)
    gpu_only: bool = False  # a GPU's knob: left out where the run is known to be on a CPU

    @property
    def overrides(self) -> tuple[str, ...]:
        return tuple(f"{key}={value_text(to)}" for key, _, to in self.changes) if self.paste else ()

    def text(self) -> str:
        return ", ".join(f"{key} {value_text(now)} -> {value_text(to)}" for key, now, to in self.changes)

    def line(self) -> str:
        return f"{self.text()}: {self.why}" + "".join(f"; {x}" for x in (self.gain, self.plan) if x)

    def as_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "set": list(self.overrides) or [self.text()], "why": self.why,
                "gain": self.gain, "plan": self.plan}


def value_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "unset" if v is None else str(v)


def per_process(r: Recipe) -> int:
    """Completions of one optimizer step on one process."""
    return max(r.train.prompts_per_step * r.generation.num_generations // max(r.train.num_processes, 1), 1)


def _overlap(b: Bottleneck, gpu: bool | None, added: float = 0.0) -> str:
    """The bound of generating beside training: the longer side (`added`: seconds the change adds to training's)."""
    best = max(b.seconds["generation"], b.rest_s("generation") + added)
    return (f"at best {best:.3g} s a step (from {b.step_s:.3g} s) at this generation speed, where the device has "
            "room for both at once" + ("" if gpu else " (on a CPU the engine takes cores from training: measure it)"))


def _generation(b: Bottleneck, r: Recipe, gpu: bool | None = None) -> list[Remedy]:
    g, t = r.generation, r.train
    out: list[Remedy] = []
    if g.backend in ("hf", "paged"):
        lp = b.seconds["training"] / 3  # a no-grad forward over the same tokens: a third of forward + backward
        out.append(Remedy("generation", (("generation.backend", g.backend, "vllm"), ("generation.async_steps", 0, 1)),
                          "a vLLM engine apart from the policy generates the next batch while this one trains "
                          f"(needs vLLM installed; adds a weight sync and an old-policy log-prob pass, ~{lp:.2g} s, "
                          "each step)", _overlap(b, gpu, lp)))
        if g.backend == "hf" and b.mean_length and b.max_length and b.mean_length < UNEVEN * b.max_length:
            out.append(Remedy("generation", (("generation.backend", "hf", "paged"),),
                              f"continuous batching: each completion leaves the batch at its own end (mean "
                              f"{b.mean_length:.0f} tokens, the batch's longest {b.max_length:.0f}); no extra package"))
    elif g.async_steps == 0 and g.pipeline == "sync":
        out.append(Remedy("generation", (("generation.async_steps", 0, 1),),
                          "generate the next batch while this one trains (one step off-policy, corrected by "
                          "importance sampling)", _overlap(b, gpu)))
        if g.backend == "vllm":
            out.append(Remedy("generation", (("generation.pipeline", "sync", "inflight"),),
                              "the engine never stops: a step takes the first complete groups, the weight sync lands "
                              "between engine steps (docs/inflight.md)", _overlap(b, gpu), check="kv"))
    elif g.pipeline == "inflight":
        now = g.max_staleness or t.steps_per_generation * r.algorithm.num_iterations
        if 2 * now <= 64:
            out.append(Remedy("generation", (("generation.max_staleness", now, 2 * now),),
                              "more generation batches in flight, so complete groups are ready sooner (on SmolLM2 "
                              "here 1 -> 4 took 33.1 -> 20.5 s a step, docs/inflight.md)", check="kv"))
    elif g.backend == "vllm":
        out.append(Remedy("generation", (("generation.async_steps", g.async_steps, 0),
                                         ("generation.pipeline", "sync", "inflight")),
                          "generated ahead the trainer still waits (generation is the slower side); in flight the "
                          "engine never stops between batches", check="kv"))
    if g.backend == "vllm-server":
        n = len(r.vllm.server_url) if isinstance(r.vllm.server_url, list) else len(r.vllm.server_url.split(","))
        out.append(Remedy("generation", (("vllm.server_url", f"{n} server(s)", f"{n + 1} servers"),),
                          "a fleet spreads each batch's groups over the servers (docs/scale-out.md)",
                          f"at best {b.seconds['generation'] * n / (n + 1):.3g} s of generation a step", paste=False))
    if g.backend == "vllm":
        share = r.vllm.gpu_memory_utilization
        to = round(min(share + SHARE_STEP, SHARE_MAX), 2)
        if to > share:
            out.append(Remedy("generation", (("vllm.gpu_memory_utilization", share, to),),
                              "on a GPU, a larger KV cache: fewer sequences preempted and computed again", check="kv",
                              gpu_only=True))
    return out


def _training(b: Bottleneck, r: Recipe, gpu: bool | None = None) -> list[Remedy]:
    t, m = r.train, r.model
    n = per_process(r)
    length = r.data.max_prompt_length + r.generation.max_completion_length
    out: list[Remedy] = []
    same = ("fewer, larger passes (the gradient does not change)" if r.algorithm.loss != "bnpo" else
            "fewer, larger passes (loss 'bnpo' averages per micro-batch: the gradient changes)")
    auto = "auto" in (t.micro_batch_size, t.max_tokens_per_micro_batch)  # sized to the memory when it runs
    if not auto and t.max_tokens_per_micro_batch is not None:
        if t.max_tokens_per_micro_batch < n * length:
            now = t.max_tokens_per_micro_batch
            out.append(Remedy("training", (("train.max_tokens_per_micro_batch", now, 2 * now),), same, check="memory"))
    elif not auto and t.micro_batch_size < n:
        now, to = t.micro_batch_size, min(2 * t.micro_batch_size, n)
        out.append(Remedy("training", (("train.micro_batch_size", now, to),), same,
                          f"at most {math.ceil(n / now)} -> {math.ceil(n / to)} passes a step", check="memory"))
    if m.gradient_checkpointing is True:  # 'auto' turns it on only where it must
        out.append(Remedy("training", (("model.gradient_checkpointing", True, False),),
                          "backward no longer computes each layer's forward again",
                          f"about a quarter of training, ~{b.seconds['training'] / 4:.3g} s a step", check="memory"))
    if getattr(t, "activation_offloading", False):
        out.append(Remedy("training", (("train.activation_offloading", True, False),),
                          "no copies of the activations to host memory and back", check="memory"))
    if not out and t.num_processes * 2 <= 64 and t.prompts_per_step % (2 * t.num_processes) == 0:
        out.append(Remedy("training", (("train.num_processes", t.num_processes, 2 * t.num_processes),),
                          ("'auto' sizes the passes to the memory" if auto else "the passes are as large as the step "
                           "allows") + ": more devices each train a share of the batch",
                          f"at best {b.seconds['training'] / 2:.3g} s of training a step", check="memory"))
    return out


def _logprobs(b: Bottleneck, r: Recipe, gpu: bool | None = None) -> list[Remedy]:
    t, a = r.train, r.algorithm
    n = per_process(r)
    now = t.logprob_micro_batch_size
    rows = now or (t.micro_batch_size if isinstance(t.micro_batch_size, int) else None)
    out: list[Remedy] = []
    if rows is not None and rows < n:
        out.append(Remedy("logprobs", (("train.logprob_micro_batch_size", now, min(2 * rows, n)),),
                          "fewer no-grad passes (the log-probs do not change)",
                          f"at most {math.ceil(n / rows)} -> {math.ceil(n / min(2 * rows, n))} passes a step",
                          check="memory"))
    if a.beta > 0 and a.reference == "local":
        out.append(Remedy("logprobs", (("algorithm.reference", "local", "server"),),
                          "the reference model's pass runs in `grpo ref-serve` on another device", check="memory"))
    return out


def _rewards(b: Bottleneck, r: Recipe, gpu: bool | None = None) -> list[Remedy]:
    if not r.rewards:
        return []
    named = {spec.name: i for i, spec in enumerate(r.rewards)}
    slow = max((n for n in b.reward_seconds if n in named), key=lambda n: b.reward_seconds[n], default=None)
    i = named[slow] if slow is not None else 0
    spec = r.rewards[i]
    seconds = b.reward_seconds.get(spec.name, b.seconds["rewards"])
    which = (f"{spec.name} takes {seconds:.3g} s of the step's {b.seconds['rewards']:.3g} s" if slow is not None
             else f"{spec.name}" + ("" if len(r.rewards) == 1 else " (metrics.jsonl has no rewards/<name>/seconds: "
                                    "which reward is slow is not recorded; the first is named)"))
    urls = 0 if spec.url is None else len(spec.url) if isinstance(spec.url, list) else 1
    servers = max(urls, 1)
    out = [Remedy("rewards", ((f"rewards[{i}].url", f"{urls} server(s)" if urls else None, f"{servers + 1} servers"),),
                  f"{which}: `grpo reward-serve {spec.name}` on other cores or machines, the URLs in a list split "
                  "each batch between them (docs/reward-servers.md)",
                  f"at best {seconds * servers / (servers + 1):.3g} s a step", paste=False)]
    limit = max(1, math.ceil(SPIKY_REWARDS * b.seconds["rewards"]))
    if b.rewards_peak >= SPIKY_REWARDS * max(b.seconds["rewards"], 1e-9) and not 0 < spec.timeout <= limit:
        out.append(Remedy("rewards", ((f"rewards[{i}].timeout", spec.timeout, float(limit)),),
                          f"a few slow calls hold steps up (the slowest step's rewards took {b.rewards_peak:.3g} s, "
                          f"the median {b.seconds['rewards']:.3g} s): a call past the limit counts as failing, and "
                          f"its on_error ({spec.on_error!r} now) says what its rows score", paste=False))
    return out


def _weight_sync(b: Bottleneck, r: Recipe, gpu: bool | None = None) -> list[Remedy]:
    t, v, m = r.train, r.vllm, r.model
    out: list[Remedy] = []
    if r.generation.backend not in ("vllm", "vllm-server"):
        return out
    if m.lora.enabled and v.lora_sync != "adapter":
        out.append(Remedy("weight_sync", (("vllm.lora_sync", v.lora_sync, "adapter"),),
                          "a sync sends the adapters alone, not the merged model ('auto' does on a GPU, not on a CPU, "
                          "where vLLM's LoRA path generates slower: docs/vllm.md)", check="sync"))
    if t.steps_per_generation * 2 <= 64:
        out.append(Remedy("weight_sync", (("train.steps_per_generation", t.steps_per_generation,
                                           2 * t.steps_per_generation),),
                          "one sync per generation batch, so each step's share of it halves (later steps of a batch "
                          "train further off the policy that sampled it)",
                          f"~{b.seconds['weight_sync'] / 2:.3g} s of sync a step", check="memory"))
    if v.sleep_mode == 2:
        out.append(Remedy("weight_sync", (("vllm.sleep_mode", 2, 1),),
                          "level 1 keeps the engine's weights in host memory instead of sending them again on waking"))
    return out


RULES: dict[str, Callable[[Bottleneck, Recipe, bool | None], list[Remedy]]] = {
    "generation": _generation, "rewards": _rewards, "logprobs": _logprobs, "training": _training,
    "weight_sync": _weight_sync,
}


def remedies(b: Bottleneck, r: Recipe, *, gpu: bool | None = None) -> tuple[Remedy, ...]:
    """What to turn for each bounding phase of `b` (grpocli.inspection.bottleneck), largest first (`gpu`:
    whether the run is on a GPU; False leaves GPU-only knobs out, None: not known)."""
    return tuple(x for phase in b.bounding() for x in RULES[phase](b, r, gpu) if gpu is not False or not x.gpu_only)


def report(b: Bottleneck, found: tuple[Remedy, ...], *, notes: tuple[str, ...] = (),
           command: str | None = None, given: tuple[str, ...] = ()) -> list[str]:
    """The Bottleneck section: the headline, each bounding phase with its remedies, the notes, and the
    command that measures the first remedy that pastes (`command`: e.g. "grpo bench RECIPE", with the
    overrides `given` but those the remedy sets)."""
    lines = [f"Bottleneck: {b.headline()}"]
    for phase in b.bounding():
        mine = [x for x in found if x.phase == phase]
        lines.append(f"  {PHASES[phase]} bounds the step ({b.shares[phase]:.0%})"
                     + (":" if mine else ": nothing in the recipe to turn for it"))
        lines += [f"    {x.line()}" for x in mine]
    lines += [f"  {note}" for note in notes]
    first = next((x for x in found if x.overrides), None)
    if command and first is not None:
        keys = {key for key, _, _ in first.changes}
        kept = [shlex.quote(x) for x in given if x.partition("=")[0].strip() not in keys]
        lines.append(f"  measure it: {' '.join([command, *kept, *first.overrides])}")
    return lines


__all__ = ["RULES", "Remedy", "per_process", "remedies", "report", "value_text"]
