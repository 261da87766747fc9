"""`grpo ref-serve`: the reference model of the KL term on its own server (transformers + torch, no vLLM)."""

from __future__ import annotations

import typer

DTYPES = ("auto", "float32", "bfloat16", "float16")

HELP = """Serve a reference model's per-token log-probs, so training processes need not hold it.

Training uses it with algorithm.beta > 0, algorithm.reference = "server" and
algorithm.reference_url; with algorithm.ref_sync_steps it mixes in the policy's weights.

Example:

  grpo ref-serve --model ./my-base-model --port 8001
"""


def add_to(app: typer.Typer) -> None:
    app.command("ref-serve", help=HELP, no_args_is_help=True)(ref_serve)


def ref_serve(
    model: str = typer.Option(..., "--model", help="Model directory or hub id (the policy's starting weights)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (default: loopback only)."),
    port: int = typer.Option(8001, "--port", min=1, max=65535, help="Port to listen on."),
    api_key: str = typer.Option(None, "--api-key", envvar="GRPO_REF_API_KEY",
                                help="Require this key on every endpoint (or set GRPO_REF_API_KEY)."),
    dtype: str = typer.Option("auto", "--dtype", help="Weights dtype (auto, float32, bfloat16, float16)."),
    max_batch_tokens: int = typer.Option(16384, "--max-batch-tokens", min=1,
                                         help="Prompt + completion tokens per forward pass (requests are batched up to it)."),
    request_timeout: float = typer.Option(600.0, "--request-timeout", min=1.0,
                                          help="Seconds a request may wait for its answer (then 504)."),
) -> None:
    from grpocli.errors import UserError, did_you_mean

    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}{did_you_mean(dtype, DTYPES)}", where="--dtype",
                        valid=", ".join(DTYPES), hint=f"grpo ref-serve --model {model} --dtype auto")
    from grpocli.models.source import resolve

    resolve(model, key="--model")  # a wrong path fails here, before torch's import
    try:
        from grpocli.reference.app import run_server
    except ImportError as exc:
        raise UserError(f"the reference server is not available here: {exc}", valid="fastapi and uvicorn installed",
                        hint="pip install 'grpocli[serve]'   (or: pip install fastapi uvicorn)") from None
    run_server(model=model, host=host, port=port, api_key=api_key, dtype=dtype, max_batch_tokens=max_batch_tokens,
               request_timeout=request_timeout)
