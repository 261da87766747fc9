"""`trl vllm-serve`'s flags (TRL 1.16's ScriptArguments) as `grpo vllm-serve` takes them.

Every TRL flag is accepted under its own name (``--tensor_parallel_size`` and
``--tensor-parallel-size`` alike). Those vLLM honours here go to the engine (``engine_kwargs``);
those that cannot work in grpo's server are refused by ``refusal`` before vLLM is imported, with
the reason. Pure: imports neither torch nor vLLM.
"""

from __future__ import annotations

from typing import Any

#: vLLM's --kv-cache-dtype names (vllm.config.cache.CacheDType).
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
#: vLLM's model implementations (vllm.config.model.ModelImpl; TRL's vllm_model_impl).
MODEL_IMPLS = ("auto", "vllm", "transformers", "terratorch")
#: uvicorn's log levels (TRL's --log_level).
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
#: distributed_executor_backend values that keep the engine in this process (weight updates write into it).
IN_PROCESS_EXECUTORS = (None, "uni")

ONE_ENGINE = ("grpo vllm-serve runs one vLLM engine in its own process on one device: weight updates are written "
              "into that process's model")


def refusal(*, tensor_parallel_size: int = 1, data_parallel_size: int = 1,
            distributed_executor_backend: str | None = None, speculative_config: str | None = None,
            kv_cache_dtype: str = "auto", vllm_model_impl: str | None = None, log_level: str = "warning",
            model: str = "MODEL") -> tuple[str, str, str, str] | None:
    """(what, where, valid, hint) for the first TRL flag that cannot work here, or None."""
    if tensor_parallel_size > 1:
        return (f"tensor parallelism over {tensor_parallel_size} devices cannot work here: {ONE_ENGINE}; tensor parallelism needs vLLM's "
                "multi-process executor, whose workers grpo's weight updates cannot reach",
                "--tensor_parallel_size", "1",
                f"start one server per GPU (grpo vllm-serve --model {model} --port 8000, --port 8001, ...) and list "
                "them all in vllm.server_url: prompts are spread over them, weights go to all")
    if data_parallel_size > 1:
        return (f"{data_parallel_size} data-parallel engines cannot work in one server: {ONE_ENGINE}",
                "--data_parallel_size", "1",
                f"start {data_parallel_size} servers (grpo vllm-serve --model {model} --port 8000, --port 8001, "
                "...; CUDA_VISIBLE_DEVICES picks each one's GPU) and list them in vllm.server_url")
    if distributed_executor_backend not in IN_PROCESS_EXECUTORS:
        return (f"executor {distributed_executor_backend!r} cannot work here: {ONE_ENGINE}, vLLM's 'uni' "
                "executor; other executors put the model in other processes",
                "--distributed_executor_backend", "uni (or leave it out)", "leave --distributed_executor_backend out")
    if speculative_config:
        return ("speculative decoding is not supported by grpo vllm-serve (weight updates "
                "replace the target model's weights, not a draft model's, which would drift from the policy)",
                "--speculative_config", "leave it out", "serve without speculative decoding")
    for flag, value, names in (("--kv_cache_dtype", kv_cache_dtype, KV_CACHE_DTYPES),
                               ("--vllm_model_impl", vllm_model_impl, MODEL_IMPLS),
                               ("--log_level", log_level, LOG_LEVELS)):
        if value is not None and value not in names:
            return (f"unknown value {value!r}", flag, ", ".join(names), f"grpo vllm-serve --model {model} {flag} "
                    f"{names[0] if flag != '--log_level' else 'warning'}")
    return None


def engine_kwargs(*, revision: str | None = None, enable_prefix_caching: bool | None = None,
                  kv_cache_dtype: str = "auto", trust_remote_code: bool = False,
                  vllm_model_impl: str | None = None) -> dict[str, Any]:
    """vllm.LLM's keyword arguments for the TRL flags it honours; a flag left at vLLM's default adds nothing."""
    out: dict[str, Any] = {}
    if revision is not None:
        out["revision"] = revision
    if enable_prefix_caching is not None:
        out["enable_prefix_caching"] = enable_prefix_caching
    if kv_cache_dtype != "auto":
        out["kv_cache_dtype"] = kv_cache_dtype
    if trust_remote_code:
        out["trust_remote_code"] = True
    if vllm_model_impl is not None:
        out["model_impl"] = vllm_model_impl
    return out


__all__ = ["KV_CACHE_DTYPES", "LOG_LEVELS", "MODEL_IMPLS", "engine_kwargs", "refusal"]
