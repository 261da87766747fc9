"""The GenerationBackend protocol every backend (transformers, vLLM, vLLM server) follows, and
what they share: ``Sampling`` (the parameters), ``Generated`` (the result) and ``PromptEncoder``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from grpocli.errors import UserError

if TYPE_CHECKING:
    from grpocli.recipe.schema import GenerationSection


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters, from [generation]."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()

    @classmethod
    def from_section(cls, gen: GenerationSection) -> Sampling:
        return cls(
            max_tokens=gen.max_completion_length,
            temperature=gen.temperature,
            top_p=gen.top_p,
            top_k=gen.top_k,
            min_p=gen.min_p,
            repetition_penalty=gen.repetition_penalty,
            stop=tuple(gen.stop),
        )


@dataclass
class Generated:
    """Completions of len(prompts) x n, prompt-major: rows [i*n : (i+1)*n] belong to prompt i."""

    prompt_ids: list[list[int]]          # [B][Tp]   one per prompt
    completion_ids: list[list[int]]      # [B*G][Tc] ends with EOS unless truncated
    truncated: list[bool]                # [B*G]     no EOS within max_tokens
    logprobs: list[list[float]] | None = field(default=None)  # [B*G][Tc] engine's, if any
    versions: list[list[int]] | None = field(default=None)    # [B*G][Tc] policy version that sampled each
                                                              # token (generation.pipeline = "inflight")


class PromptEncoder:
    """Shared by the backends: rendered prompt strings to token ids, left-truncated (as TRL)."""

    tokenizer: Any
    max_prompt_length: int
    lockstep = False  # GenerationBackend.lockstep: engines generate on their own

    def encode_prompts(self, prompts: list[str]) -> list[list[int]]:
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        return [row[-self.max_prompt_length :] for row in ids]


class LivePolicyBackend(PromptEncoder):
    """Shared by the backends that sample from the training model itself ('hf', 'paged'): no copy of
    the weights, so `sync_weights` only points at the model; prompt strings are encoded here."""

    model: Any

    def sync_weights(self, model: Any) -> None:
        self.model = model

    def close(self) -> None:
        pass

    def generate(self, prompts: list[str], n: int, sampling: Sampling) -> Generated:
        """n completions of each prompt; no prompts: none (where forwards are collectives the call still takes part)."""
        return self.generate_ids(self.encode_prompts(prompts) if prompts else [], n, sampling)

    def generate_ids(self, prompt_ids: list[list[int]], n: int, sampling: Sampling) -> Generated:
        raise NotImplementedError

    def eos_ids(self) -> list[int]:
        """The ids that end a completion: the model's generation config's, else the tokenizer's."""
        config = getattr(self.model, "generation_config", None)
        ids = config.eos_token_id if config is not None else None
        ids = ids if ids is not None else self.tokenizer.eos_token_id
        return list(ids) if isinstance(ids, (list, tuple)) else [ids]


def cut_at_eos(seq: list[int], eos: list[int]) -> tuple[list[int], bool]:
    """Keep tokens up to and including the first EOS; truncated when there is none."""
    for i, tok in enumerate(seq):
        if tok in eos:
            return seq[: i + 1], False
    return seq, True


def paged_on_sharded_policy(where_sharded: str) -> UserError:
    """The refusal of generation.backend = 'paged' with a policy whose forward passes are collectives
    (FSDP2, DeepSpeed ZeRO-3): said by preflight for train.sharding and by the backend for ZeRO-3."""
    return UserError(
        "generation.backend = \"paged\" cannot generate with a sharded policy: each forward pass of a "
        f"{where_sharded} policy is a collective that transformers' continuous batching does not keep in "
        "step across processes", where="generation.backend",
        valid="'paged' with one process, DDP or ZeRO-2; 'hf' (synced generate), 'vllm' or 'vllm-server' "
        "with a sharded policy", hint="set generation.backend = \"hf\" (or \"vllm\"), or train.sharding = \"none\"")


class GenerationBackend(Protocol):
    #: Every process must make as many generate calls, because each is a collective (the 'hf'
    #: backend on a model whose forwards are: FSDP2, ZeRO-3); a process without prompts still calls.
    lockstep: bool

    def generate(self, prompts: list[str], n: int, sampling: Sampling) -> Generated:
        """Sample n completions for each prompt string (already chat-templated)."""
        ...

    def generate_ids(self, prompt_ids: list[list[int]], n: int, sampling: Sampling) -> Generated:
        """Sample n completions for each prompt given as token ids (multi-turn rollouts; the 'hf'
        and 'vllm' backends have it)."""
        ...

    def sync_weights(self, model: Any) -> None:
        """Make the backend sample from `model`'s current weights."""
        ...

    def close(self) -> None: ...
