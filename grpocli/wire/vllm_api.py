"""What grpo sends to and reads from stock vLLM's server (vLLM 0.32's OpenAI API and RL API), as pydantic
models: the requests grpo builds and the parts of the answers it reads (anything else in them is
ignored). vLLM declares the whole protocol; these models are grpo's checked view of it, used by
grpocli.generation.server_client.

    GET  /health, /version                      {"version": "0.32.0"}
    GET  /server_info?config_format=json        {"vllm_config": {...}} (VLLM_SERVER_DEV_MODE=1 only)
    GET  /get_world_size                        {"world_size": N}
    POST /v1/completions                        CompletionRequest -> CompletionAnswer
    POST /inference/v1/generate                 TokensRequest -> TokensAnswer: token ids in and out, and which
                                                weight version sampled each token (--enable-scale-out only)
    POST /update_weight_version                 {"new_version": "N"}: the label of the weights from now on
    POST /abort_requests                        {}: every request in flight
    POST /pause?mode=keep|wait|abort, /resume   the RL API (dev mode)
    POST /init_weight_transfer_engine           {"init_info": {...}}  (the backend's own fields)
    POST /start_weight_update, /update_weights {"update_info": {...}}, /finish_weight_update {"weight_version"}
    POST /reset_prefix_cache
    POST /v1/load_lora_adapter {"lora_name", "lora_path"}, /v1/unload_lora_adapter {"lora_name"}: adapters
                                                read from the server's disk (--enable-lora, runtime updates on)
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: Where grpo train reads the server's API key from (an environment variable: never in config.resolved.toml).
KEY_ENV = "GRPO_VLLM_API_KEY"
HEALTH_PATH = "/health"
#: What `grpo vllm-serve`'s /health says (503) while an update is open (grpocli.server.guard).
INCOMPLETE = "the weights are not one complete version"
VERSION_PATH, SERVER_INFO_PATH, WORLD_SIZE_PATH = "/version", "/server_info?config_format=json", "/get_world_size"
COMPLETIONS_PATH, TOKENS_PATH = "/v1/completions", "/inference/v1/generate"
VERSION_LABEL_PATH, ABORT_PATH = "/update_weight_version", "/abort_requests"
PAUSE_PATH, RESUME_PATH = "/pause", "/resume"
INIT_TRANSFER_PATH, START_UPDATE_PATH = "/init_weight_transfer_engine", "/start_weight_update"
UPDATE_PATH, FINISH_UPDATE_PATH = "/update_weights", "/finish_weight_update"
RESET_PATH = "/reset_prefix_cache"
LOAD_LORA_PATH, UNLOAD_LORA_PATH = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
#: The first vLLM whose server has the RL API (pause/resume and the weight-transfer engine routes).
RL_API_SINCE = (0, 32)
#: The log-probs vLLM must return for grpo's importance-sampling correction: after temperature and top-k/p.
PROCESSED = "processed_logprobs"


class Loose(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class CompletionRequest(BaseModel):
    """One prompt's n samples, from token ids; the sampled tokens' ids and log-probs come back."""

    model: str
    prompt: list[int]
    n: int
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int  # -1: off
    min_p: float
    repetition_penalty: float
    stop: list[str]
    seed: int | None = None
    logprobs: int = 0  # the sampled token's log-prob, and no others
    return_token_ids: bool = True


class TokenLogprobs(Loose):
    token_logprobs: list[float | None]


class Choice(Loose):
    index: int
    token_ids: list[int]
    logprobs: TokenLogprobs | None = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None


class CompletionAnswer(Loose):
    choices: list[Choice]


class TokensRequest(BaseModel):
    """One prompt's n samples on the token-in/token-out route; ``sampling_params`` is vLLM's SamplingParams."""

    token_ids: list[int]
    sampling_params: dict[str, Any]
    model: str | None = None


class VersionSpan(Loose):
    version: str
    start: int
    end: int


class TokenLogprob(Loose):
    token_id: int
    logprob: float


class TokenLogprobList(Loose):
    content: list[TokenLogprob] | None = None


class TokensChoice(Loose):
    index: int
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    logprobs: TokenLogprobList | None = None
    weight_versions: list[VersionSpan] | None = None


class TokensAnswer(Loose):
    choices: list[TokensChoice]


class ModelConfig(Loose):
    model: str
    dtype: str
    max_model_len: int
    logprobs_mode: str = "raw_logprobs"
    served_model_name: Any = None


class VllmConfig(Loose):
    model_config_: ModelConfig = Field(alias="model_config")
    weight_transfer_config: dict[str, Any] | None = None
    lora_config: dict[str, Any] | None = None


class ServerInfo(Loose):
    vllm_config: VllmConfig


__all__ = [
    "ABORT_PATH", "COMPLETIONS_PATH", "Choice", "CompletionAnswer", "CompletionRequest", "FINISH_UPDATE_PATH",
    "HEALTH_PATH", "INCOMPLETE", "INIT_TRANSFER_PATH", "KEY_ENV", "LOAD_LORA_PATH", "PAUSE_PATH", "PROCESSED", "RESET_PATH", "RESUME_PATH",
    "RL_API_SINCE", "SERVER_INFO_PATH", "START_UPDATE_PATH", "ServerInfo", "TOKENS_PATH", "TokensAnswer",
    "TokensRequest", "UNLOAD_LORA_PATH", "UPDATE_PATH", "VERSION_LABEL_PATH", "VERSION_PATH", "WORLD_SIZE_PATH",
]
