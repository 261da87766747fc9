"""`grpo inspect RUN_DIR` on a run directory written by hand: a torn last line, a run still going,
warnings that fire, rollouts, the PNG, and no torch import."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from grpocli.errors import UserError
from grpocli.inspection import plot
from grpocli.inspection.overview import read_metrics, show_run, sparkline

CONFIG = """\
[model]
name_or_path = "tiny"
[data]
dataset = "arithmetic"
[[rewards]]
name = "format.soft"
[[rewards]]
name = "arithmetic.exact"
[train]
steps = 100
"""


def step_metrics(step: int) -> dict:
    """Zero-spread groups from step 11, truncation from step 21, a format-only reward rise."""
    return {
        "step": step, "reward": 0.1 + step / 40, "reward_std": 0.3, "kl": 0.02,
        "entropy": 1.5 - step / 100, "completions/mean_length": 30.0 + step,
        "completions/clipped_ratio": 0.9 if step > 20 else 0.1,
        "frac_reward_zero_std": 1.0 if step > 10 else 0.3,
        "rewards/format.soft/mean": step / 30, "rewards/arithmetic.exact/mean": 0.1,
        "grad_norm": 0.5, "time/generation": 1.0, "time/training": 0.5,
    }


@pytest.fixture
def run_dir(tmp_path) -> Path:
    root = tmp_path / "run"
    (root / "rollouts").mkdir(parents=True)
    (root / "checkpoints" / "step-10").mkdir(parents=True)
    (root / "checkpoints" / "step-20.tmp").mkdir()  # being written: not listed
    (root / "config.resolved.toml").write_text(CONFIG)
    lines = [json.dumps(step_metrics(s)) for s in range(1, 31)]
    lines.insert(10, json.dumps({"step": 10, "eval/reward": 0.42, "eval/pass@1": 0.25}))  # eval line
    torn = '{"step": 31, "reward": 0.8, "kl'
    (root / "metrics.jsonl").write_text("\n".join(lines) + "\n" + torn)
    rollouts = [{"step": 10, "group": i // 3, "prompt": f"<|im_start|>user\n{i}+1=<|im_end|>\n",
                 "completion": f"completion-{i}", "rewards": {"format.soft": float(i % 2), "arithmetic.exact": 0.0},
                 "reward": float(i), "advantage": i - 2.5, "truncated": i == 0, "kept": True} for i in range(6)]
    (root / "eval" / "step-10-test").mkdir(parents=True)
    (root / "eval" / "step-10-test" / "summary.json").write_text(json.dumps(
        {"metrics": {"reward": 0.42, "pass@1": 0.25, "pass@4": 0.625, "mean@4": 0.25}}))
    (root / "rollouts" / "step-10.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rollouts))
    return root


def render(**kwargs) -> str:
    out = io.StringIO()
    show_run(console=Console(file=out, width=200), **kwargs)
    return out.getvalue()


def test_read_metrics_merges_steps_and_notes_the_torn_line(run_dir):
    m = read_metrics(run_dir / "metrics.jsonl")
    assert m.torn and not m.bad_lines
    assert [h["step"] for h in m.history] == list(range(1, 31))
    assert m.history[9]["eval/reward"] == 0.42 and m.history[9]["reward"] == pytest.approx(0.35)


def test_sparkline():
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([0, 0, 7, 7], width=2) == "▁█"  # averaged into buckets
    assert sparkline([None, 2.0, 2.0]) == "▄▄"
    assert sparkline([]) == ""


def test_inspect_summary_notes_warnings_and_png(run_dir):
    text = render(path=str(run_dir))
    assert "steps logged 30 of 100" in text
    assert "step-10-test" in text and "0.625" in text  # the eval summary
    assert "checkpoints: step-10" in text and "step-20" not in text.split("checkpoints:")[1].split("\n")[0]
    assert "last line of metrics.jsonl is incomplete" in text
    assert "may still be going" in text  # written just now, 30 of 100 steps
    for metric in ("reward", "eval/reward", "rewards/format.soft/mean", "frac_reward_zero_std", "kl"):
        assert f" {metric} " in text, metric
    assert "no_signal" in text and "20-now" in text       # steps 11..20 all zero-spread
    assert "truncated" in text and "format_only" in text
    assert "length_explosion" not in text and "kl_explosion" not in text
    png = run_dir / "metrics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_says_how_to_install(run_dir, monkeypatch):
    monkeypatch.setattr(plot, "plot_available", lambda: False)
    text = render(path=str(run_dir))
    assert "pip install 'grpocli[plot]'" in text
    assert not (run_dir / "metrics.png").exists()


def test_stopped_run_names_the_checkpoint_to_resume(run_dir):
    old = 1_000_000_000
    os.utime(run_dir / "metrics.jsonl", (old, old))
    text = render(path=str(run_dir), write_png=False)
    assert "stopped at step 30 of 100" in text and "step-10" in text


def test_rollouts_best_and_worst(run_dir):
    text = render(path=str(run_dir), rollouts_step=10, n=2)
    best, worst = text.split("worst")
    assert "completion-5" in best and "completion-4" in best and "completion-0" not in best
    assert "completion-0" in worst and "completion-1" in worst and "(truncated)" in worst


def test_missing_rollouts_step_lists_available(run_dir):
    with pytest.raises(UserError) as err:
        render(path=str(run_dir), rollouts_step=7)
    assert "steps with rollouts: 10" in err.value.valid and err.value.where == "--rollouts"


def test_not_a_run_directory(tmp_path):
    with pytest.raises(UserError, match="not a run directory"):
        render(path=str(tmp_path))
    with pytest.raises(UserError, match='did you mean "plugins"'):
        render(path="plugin")


def test_inspect_never_imports_torch(run_dir):
    code = textwrap.dedent(f"""
        import sys
        from grpocli.cli.app import app
        app(["inspect", {str(run_dir)!r}], standalone_mode=False)
        app(["inspect", {str(run_dir)!r}, "--rollouts", "10"], standalone_mode=False)
        assert "torch" not in sys.modules, "grpo inspect RUN_DIR imported torch"
        print("NO-TORCH")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "NO-TORCH" in out.stdout and "no_signal" in out.stdout and "completion-5" in out.stdout


def test_inspect_exit_code_2_for_a_missing_run(grpo, tmp_path):
    out = grpo("inspect", str(tmp_path / "nope"))
    assert out.returncode == 2 and "no run directory" in out.stderr and "Traceback" not in out.stderr
