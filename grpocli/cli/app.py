"""`grpo`: the typer application and the one place user errors become exit code 2."""

from __future__ import annotations

import sys

import typer

from grpocli.cli import (
    bench,
    check_rewards,
    compare,
    evaluate,
    export,
    failures,
    imports,
    inspect,
    new,
    plan,
    ref_serve,
    reward_serve,
    serve,
    shutdown,
    train,
)
from grpocli.errors import Stopped, UserError
from grpocli.version import __version__

app = typer.Typer(
    name="grpo",
    help="Train language models with GRPO from a TOML recipe.\n\n"
    "Example: [bold]grpo train quickstart[/bold] (tiny model, CPU, offline, minutes).",
    epilog="Recipes: `grpo inspect recipes`. Plugins: `grpo inspect plugins`. "
    "Docs: docs/ (mkdocs serve), from docs/index.md.",
    rich_markup_mode="rich",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
train.add_to(app)
serve.add_to(app)
ref_serve.add_to(app)
reward_serve.add_to(app)
evaluate.add_to(app)
export.add_to(app)
inspect.add_to(app)
compare.add_to(app)
plan.add_to(app)
bench.add_to(app)
imports.add_to(app)
check_rewards.add_to(app)
new.add_to(app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"grpo {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Train language models with GRPO from a TOML recipe."""


def report(exc: UserError) -> None:
    """Print a user error (no traceback) on stderr."""
    from rich.console import Console
    from rich.text import Text

    console = Console(stderr=True, highlight=False, soft_wrap=True)
    console.print(Text("error: ", style="bold red") + Text(exc.render()))


def main() -> None:
    """Run the command; exit with its code, never held open by a thread that hangs (cli/shutdown.py)."""
    import threading

    before = set(threading.enumerate())
    try:
        code = _run()
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - a bug: its traceback, as Python prints it, then exit 1
        import traceback

        traceback.print_exc()
        code = 1
    shutdown.leave(code, before)


def _run() -> int | str | None:
    try:
        app()
    except UserError as exc:
        report(exc)
        return exc.exit_code
    except Stopped as exc:  # SIGTERM / SIGINT during `grpo train`: not an error
        if exc.kept:
            print(f"stopped by {exc.name}: {exc.kept}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except (OSError, MemoryError, RuntimeError) as exc:  # a full disk, a read-only place, memory
        error = failures.as_user_error(exc, _command())
        if error is None:
            raise
        report(error)
        return error.exit_code
    return 0


def _command() -> str:
    """The subcommand this process runs (train, eval, ...), from its command line."""
    return next((a for a in sys.argv[1:] if not a.startswith("-")), "")


if __name__ == "__main__":
    main()
