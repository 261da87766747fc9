"""grpo's own protocol of `grpo vllm-serve`: the paths, and the request bodies as pydantic models (a
malformed body is a 422 naming the field). TRL's paths are in trl.py (their bodies: completions.py,
transfer.py).

Protocol version 1. Paths (state-changing ones need the API key when the server has one):

    GET  /health                    {"status": "ok"}
    GET  /info                      protocol, model, max_model_len, world_size, dtype, weights_version,
                                    transports
    POST /generate                  GenerateRequest -> prompt_ids, completion_ids, logprobs, truncated,
                                    weights_version
    POST /weights/begin        key  BeginUpdate -> update_id, checked (the spec if given: names, shapes, dtypes)
    POST /weights/bucket       key  ?update_id=...; body: one bucket as a safetensors file
    POST /weights/broadcast    key  BroadcastBucket; the bucket itself arrives over the process group
    POST /weights/end          key  EndUpdate -> weights_version, tensors, seconds
    POST /weights/abort        key  EndUpdate
    POST /weights/group        key  OpenGroup -> port (of the store to join as rank 0), backend, rank, world_size
    POST /reset_prefix_cache   key  -> reset
    POST /close                key  -> closing; the server stops
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

PROTOCOL_VERSION = 1


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GenerateRequest(Body):
    prompts: list[str] | None = Field(None, description="Prompt strings (tokenized by the engine).")
    prompt_ids: list[list[int]] | None = Field(None, description="Prompts as token ids.")
    n: int = Field(1, ge=1, le=1024)
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    stop: list[str] = Field(default_factory=list)
    seed: int | None = None
    logprobs: bool = True

    @model_validator(mode="after")
    def _one_kind_of_prompt(self) -> GenerateRequest:
        if (self.prompts is None) == (self.prompt_ids is None):
            raise ValueError("give exactly one of 'prompts' (strings) and 'prompt_ids' (token ids)")
        rows = self.prompts if self.prompts is not None else self.prompt_ids
        if not rows:
            raise ValueError("no prompts")
        if self.prompt_ids is not None and any(not row for row in self.prompt_ids):
            raise ValueError("an empty prompt in 'prompt_ids'")
        return self


class Tensor(Body):
    name: str
    shape: list[int]
    dtype: str


class BeginUpdate(Body):
    transport: Literal["http", "gloo", "nccl"] = "http"
    spec: list[Tensor] | None = Field(None, description="Every tensor of the update; checked when given.")
    aliases: dict[str, str] = Field(default_factory=dict, description="Tied names: alias -> name.")
    timeout: float = Field(120.0, gt=0.0, le=3600.0, description="Longest wait for each bucket (s).")


class BroadcastBucket(Body):
    update_id: str
    tensors: list[Tensor] = Field(min_length=1)


class EndUpdate(Body):
    update_id: str


class OpenGroup(Body):
    backend: Literal["gloo", "nccl"] = "gloo"
    timeout: float = Field(120.0, gt=0.0, le=3600.0)
