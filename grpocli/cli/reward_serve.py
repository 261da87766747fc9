"""`grpo reward-serve`: rewards on their own server, for [[rewards]] entries with url (no torch, no vLLM)."""

from __future__ import annotations

import typer

HELP = """Serve rewards over HTTP, so training scores them elsewhere (another machine, a sandbox, a GPU).

REWARD is what a \\[\\[rewards]] name may be: a registered name (grpo inspect plugins), module.path:function, path/to/file.py:function, or a reward model directory.

Training scores one through it with url = "http://HOST:PORT" in its \\[\\[rewards]] entry (several URLs split each batch); the API key, if any, is read from GRPO_REWARD_API_KEY on both sides. Without a key, anyone who reaches the port can call the rewards, and code.tests runs the code they send as this server's user.

A reward's args are fixed here, never by a request: --args 'REWARD=JSON' (or REWARD=@FILE, .json or .toml); a request's args may only repeat them, or pick a value --allow 'REWARD={"arg": \\[values]}' lists.

Example:

  grpo reward-serve math.accuracy my_rewards:reward_len --port 8100

  grpo reward-serve code.tests --args 'code.tests={"isolation": "bwrap", "memory_mb": 1024}' --api-key "$KEY"
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
    args: list[str] = typer.Option([], "--args", metavar="REWARD=JSON",
                                   help="The args REWARD is called with, a JSON object or @FILE (.json, .toml); "
                                        "requests may only repeat them. Once per reward."),
    allow: list[str] = typer.Option([], "--allow", metavar="REWARD=JSON",
                                    help='{"arg": \\[values]}: values a request may pick for REWARD\'s arg '
                                         "(never code.tests' python or isolation, judge's base_url or api_key_env)."),
    max_body_mb: float = typer.Option(256.0, "--max-body-mb", min=0.0,
                                      help="Largest request body in MiB (413 past it; 0: no limit)."),
) -> None:
    try:
        from grpocli.reward_server.app import run_server
    except ImportError as exc:
        from grpocli.errors import UserError

        raise UserError(f"the reward server is not available here: {exc}", valid="fastapi and uvicorn installed",
                        hint="pip install 'grpocli[serve]'   (or: pip install fastapi uvicorn)") from None
    run_server(rewards, host=host, port=port, api_key=api_key or None, timeout=timeout or None, args=args,
               allow=allow, max_body=int(max_body_mb * 2**20) or None)
