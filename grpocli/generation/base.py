"""The GenerationBackend protocol every backend (transformers, vLLM, vLLM server) follows, and
what they share: ``Sampling`` (the parameters), ``Generated`` (the result) and ``PromptEncoder``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

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


class PromptEncoder:
    """Shared by the backends: rendered prompt strings to token ids, left-truncated (as TRL)."""

    tokenizer: Any
    max_prompt_length: int
    lockstep = False  # GenerationBackend.lockstep: engines generate on their own

    def encode_prompts(self, prompts: list[str]) -> list[list[int]]:
        ids = self.tokenizer(prompts, add_special_tokens=False)["input_ids"]
        return [row[-self.max_prompt_length :] for row in ids]


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
