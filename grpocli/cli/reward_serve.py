"""`grpo reward-serve`: rewards on their own server, for [[rewards]] entries with url (no torch, no vLLM)."""

from __future__ import annotations

import typer

HELP = """Serve rewards over HTTP, so training scores them elsewhere (another machine, a sandbox, a GPU).

REWARD is what a \\[\\[rewards]] name may be: a registered name (grpo inspect plugins), module.path:function, path/to/file.py:function, or a reward model directory.

Training scores one through it with url = "http://HOST:PORT" in its \\[\\[rewards]] entry (several URLs split each batch); the API key, if any, is read from GRPO_REWARD_API_KEY on both sides.

Example:

  grpo reward-serve math.accuracy my_rewards:reward_len --port 8100
"""


def add_to(app: typer.Typer) -> None:
    app.command("reward-serve", help=HELP, no_args_is_help=True)(reward_serve)


def reward_serve(
    rewards: list[str] = typer.Argument(..., metavar="REWARD...", help="The rewards to serve, by their \\[\\[rewards]] name."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (default: loopback only; others warn)."),
    port: int = typer.Option(8100, "--port", min=0, max=65535, help="Port to listen on (0: any free one, printed)."),
    api_key: str = typer.Option(None, "--api-key", envvar="GRPO_REWARD_API_KEY",
                                help="Require this key on every request (or set GRPO_REWARD_API_KEY)."),
    timeout: float = typer.Option(300.0, "--timeout", min=0.0,
                                  help="Seconds one reward call may take before it fails (0: no limit)."),
) -> None:
    try:
        from grpocli.reward_server.app import run_server
    except ImportError as exc:
        from grpocli.errors import UserError

        raise UserError(f"the reward server is not available here: {exc}", valid="fastapi and uvicorn installed",
                        hint="pip install fastapi uvicorn") from None
    run_server(rewards, host=host, port=port, api_key=api_key or None, timeout=timeout or None)
