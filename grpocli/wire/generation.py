"""The protocol of `grpo vllm-serve` (grpo's own; TRL's paths are grpocli/server/trl.py's): its version,
paths and API-key variable, the request bodies as pydantic models (a malformed body is a 422 naming the
field) and the answers the trainer reads (grpocli.generation.server_client checks each against its model).

Protocol version 1. Paths (state-changing ones need the API key when the server has one):

    GET  /health                    {"status": "ok"}; 200 {"status": "updating" | "weights_incomplete", "detail",
                                    "weights_version"} while the weights are not one complete version (generation
                                    is refused with 409 then); 503 {"status": "unhealthy", "detail"}: stuck or dead
    GET  /info                      EngineInfo: protocol, model, max_model_len, world_size, dtype, weights_version,
                                    transports, device
    POST /generate                  GenerateRequest -> GenerateAnswer: prompt_ids, completion_ids, logprobs,
                                    truncated, weights_version
    POST /weights/begin        key  BeginUpdate -> UpdateBegun: update_id, checked (the spec if given: names,
                                    shapes, dtypes)
    POST /weights/bucket       key  ?update_id=...; body: one bucket as a safetensors file
    POST /weights/broadcast    key  BroadcastBucket; the bucket itself arrives over the process group
    POST /weights/end          key  EndUpdate -> weights_version, tensors, seconds
    POST /weights/abort        key  EndUpdate
    POST /weights/group        key  OpenGroup -> GroupOpened: port (of the store to join as rank 0), backend,
                                    rank, world_size
    POST /reset_prefix_cache   key  -> reset
    POST /close                key  -> closing; the server stops

Every body is checked before anything reaches the engine: each number anywhere in it (also inside
free-form fields such as /v1/completions' vLLM extras) must be finite and fit a 64-bit integer,
each text must be valid Unicode (no lone surrogate), and seeds must lie in vLLM's range
(``SEED_MIN`` .. ``SEED_MAX``, a torch long). A body that fails gets a 422 naming the field and the
reason. The check walks every token id (a quarter of a second for 100,000), so the trainer builds
its GenerateRequest with ``model_construct``, unchecked: the server checks it.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

PROTOCOL_VERSION = 1
KEY_ENV = "GRPO_VLLM_API_KEY"
HEALTH_PATH, INFO_PATH, GENERATE_PATH = "/health", "/info", "/generate"
BEGIN_PATH, BUCKET_PATH, BROADCAST_PATH = "/weights/begin", "/weights/bucket", "/weights/broadcast"
END_PATH, ABORT_PATH, GROUP_PATH = "/weights/end", "/weights/abort", "/weights/group"
RESET_PATH, CLOSE_PATH = "/reset_prefix_cache", "/close"
#: vLLM's own server bounds a seed by torch.long; -1 means "no seed" to vLLM.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
#: Largest top_k: vLLM keeps it in an int32 tensor.
TOP_K_MAX = 2**31 - 1

Seed = Annotated[StrictInt, Field(ge=SEED_MIN, le=SEED_MAX, description="vLLM's per-request seed")]


def check_values(value: Any, where: str = "body") -> None:
    """Refuse NaN, infinities, integers beyond 64 bits and text with a lone surrogate anywhere in a
    JSON value, keys too (ValueError naming the place): vLLM would turn the numbers into tensors or
    generators inside its step, where an error fails every request, not this one, and a surrogate
    (JSON's "\\ud800" with no pair) is no text any tokenizer can encode."""
    if isinstance(value, bool):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: {value} is not a finite number")
    if isinstance(value, int) and not SEED_MIN <= value <= SEED_MAX:
        raise ValueError(f"{where}: {value} does not fit a 64-bit integer")
    if isinstance(value, str):
        _check_text(value, where)
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                _check_text(key, f"{where} (a key)")
            check_values(item, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_values(item, f"{where}[{i}]")


def _check_text(text: str, where: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{where}: a lone surrogate ({text[exc.start]!a}) at character {exc.start} is not "
                         "text; send valid UTF-8 (a surrogate pair, or the character itself)") from None


class Checked(BaseModel):
    """A request body whose numbers and texts are all checked (see ``check_values``)."""

    model_config = ConfigDict(allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _finite_numbers(cls, data: Any) -> Any:
        check_values(data)
        return data


class Body(Checked):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class GenerateRequest(Body):
    prompts: list[str] | None = Field(None, description="Prompt strings (tokenized by the engine).")
    prompt_ids: list[list[int]] | None = Field(None, description="Prompts as token ids.")
    n: int = Field(1, ge=1, le=1024)
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1, le=TOP_K_MAX)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0)
    stop: list[str] = Field(default_factory=list)
    seed: Seed | list[Seed] | None = Field(None, description="One seed for every prompt, or one per prompt.")
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
        if isinstance(self.seed, list) and len(self.seed) != len(rows):
            raise ValueError(f"'seed' lists {len(self.seed)} seeds for {len(rows)} prompts: give one per prompt")
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


# -- answers -------------------------------------------------------------------------------------
class EngineInfo(BaseModel):
    """GET /info: what the trainer reads of it (the server says more: extra fields are kept)."""

    model_config = ConfigDict(extra="allow")

    protocol: int
    dtype: str
    weights_version: int
    transports: list[str]
    device: dict[str, Any] | None = None


class GenerateAnswer(BaseModel):
    """POST /generate: per prompt its ids; per completion (prompt-major, n per prompt) its ids, whether
    it ran into max_tokens, and each token's log-prob when asked."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    truncated: list[bool]
    logprobs: list[list[float]] | None = None
    weights_version: int


class UpdateBegun(BaseModel):
    """POST /weights/begin: the update's id, and whether the server checked the spec."""

    update_id: str
    checked: bool


class GroupOpened(BaseModel):
    """POST /weights/group: where to join the server's group (as rank 0 of world_size)."""

    port: int
    backend: str
    rank: int
    world_size: int


__all__ = [
    "ABORT_PATH",
    "BEGIN_PATH",
    "BROADCAST_PATH",
    "BUCKET_PATH",
    "CLOSE_PATH",
    "END_PATH",
    "GENERATE_PATH",
    "GROUP_PATH",
    "HEALTH_PATH",
    "INFO_PATH",
    "KEY_ENV",
    "PROTOCOL_VERSION",
    "RESET_PATH",
    "SEED_MAX",
    "SEED_MIN",
    "TOP_K_MAX",
    "BeginUpdate",
    "Body",
    "BroadcastBucket",
    "Checked",
    "EndUpdate",
    "EngineInfo",
    "GenerateAnswer",
    "GenerateRequest",
    "GroupOpened",
    "OpenGroup",
    "Seed",
    "Tensor",
    "UpdateBegun",
    "check_values",
]
