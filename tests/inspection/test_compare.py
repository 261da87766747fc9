"""`grpo compare RUN_A RUN_B [...]` on real tiny runs (same seed and data, different learning rates):
the config keys that differ with their sources, a sparkline per metric and run, the PNG, the eval
table, the same prompt's rollouts side by side; a run still being written; bad input (exit 2)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys

import pytest
from cli_runner import ROOT
from rich.console import Console
from tiny_runs import FAST

from grpocli.errors import UserError
from grpocli.inspection.comparison import config_diff, open_runs, rollout_match
from grpocli.inspection.comparison_view import show_comparison, step_sparkline
from grpocli.inspection.overview import SPARKS

TRAIN = [*FAST, "train.steps=3", "train.torch_threads=1", "eval.every=3", "eval.num_prompts=4", "eval.n=2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two real 3-step runs, a (the recipe's learning rate) and b (train.learning_rate=0.01), and c:
    a copy of b as a run still being written (torn last metrics line, no eval yet, step 3's
    rollouts not flushed: an empty file)."""
    from grpocli.recipe import load_recipe
    from grpocli.trainer.loop import train

    root = tmp_path_factory.mktemp("compare")
    train(load_recipe("quickstart", [*TRAIN, f"train.output_dir={root / 'a'}"]))
    train(load_recipe("quickstart", [*TRAIN, f"train.output_dir={root / 'b'}", "train.learning_rate=0.01"]))
    shutil.copytree(root / "b", root / "c")
    lines = (root / "c" / "metrics.jsonl").read_text().splitlines()
    (root / "c" / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2])
    shutil.rmtree(root / "c" / "eval")
    (root / "c" / "rollouts" / "step-3.jsonl").write_text("")
    return root


def render(*paths, **kwargs) -> str:
    out = io.StringIO()
    show_comparison([str(p) for p in paths], console=Console(file=out, width=160), **kwargs)
    return out.getvalue()


@pytest.mark.slow
def test_config_diff_lists_exactly_the_differing_keys_with_their_sources(runs):
    diff = {d.key: d for d in config_diff(open_runs([str(runs / "a"), str(runs / "b")]))}
    assert set(diff) == {"train.learning_rate", "train.output_dir"}
    lr = diff["train.learning_rate"]
    assert lr.values == (0.001, 0.01)
    assert lr.sources[0].startswith("file ") and lr.sources[0].endswith("quickstart.toml")
    assert lr.sources[1] == "argument train.learning_rate=0.01"
    assert diff["train.output_dir"].sources == (f"argument train.output_dir={str(runs / 'a')!r}",
                                                f"argument train.output_dir={str(runs / 'b')!r}")


@pytest.mark.slow
def test_compare_shows_sparklines_evals_rollouts_and_writes_the_png(runs, tmp_path):
    png = tmp_path / "compare.png"
    text = render(runs / "a", runs / "b", png=png)
    assert "config: the 2 key(s) that differ" in text and "argument train.learning_rate=0.01" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    for key in ("reward", "kl", "entropy", "learning_rate", "completions/mean_length"):
        sparks = [word for word in rows[key].split() if set(word) <= set(SPARKS)]
        assert len(sparks) == 2 and all(len(s) == 3 for s in sparks), rows[key]  # one per run, 3 steps
    assert rows["learning_rate"].split()[-3:] == ["0.01", "███", "+0.009"]  # a's ▁▁▁ on the shared scale
    evals = [line.split() for line in text.splitlines() if line.strip().startswith("step-3-test")]
    assert [row[1] for row in evals] == ["a", "b"]
    assert "rollouts: step 3, prompt 1 of the 4 that every run drew" in text
    assert "rollouts of step 3: the same prompt in every run" in text
    assert text.count("mean reward") == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert f"plot: {png}" in text


@pytest.mark.slow
def test_rollouts_of_one_prompt_at_one_step_side_by_side(runs):
    compared = open_runs([str(runs / "a"), str(runs / "b")])
    match, _ = rollout_match(compared, step=1, prompt=2)
    assert match.step == 1 and len(match.groups) == 2
    for group in match.groups:
        assert len(group) == 4 and {row["prompt"] for row in group} == {match.prompt}
        assert {row["step"] for row in group} == {1}
    assert "answer" in match.columns
    with pytest.raises(UserError, match="not every run wrote rollouts for step 9"):
        rollout_match(compared, step=9)
    with pytest.raises(UserError, match="has 4 prompt"):
        rollout_match(compared, step=1, prompt=5)


@pytest.mark.slow
def test_a_run_still_being_written_compares_and_says_what_is_missing(runs):
    text = render(runs / "a", runs / "c", png=None)
    assert "c: /" in text and "steps logged 2 of 3" in text
    assert "the last line of metrics.jsonl is incomplete" in text
    assert "c: no evaluation results (eval/*/summary.json) yet" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert [len(w) for w in rows["reward"].split() if set(w) <= set(SPARKS)] == [3, 2]  # c: 2 of 3 steps
    assert "the rollouts of step 3 in c hold no complete row yet" in text
    assert "rollouts of step 2: the same prompt" in render(runs / "a", runs / "c", step=2)


def test_step_sparkline_shares_the_step_axis_and_the_scale():
    assert step_sparkline([1, 2], [0.0, 1.0], last=4, width=4, low=0.0, high=1.0) == SPARKS[0] + SPARKS[-1]
    assert step_sparkline([4], [0.5], last=4, width=4, low=0.0, high=1.0) == "   " + SPARKS[4]  # eval at step 4
    assert step_sparkline([1, 2, 3, 4], [1.0] * 4, last=4, width=2, low=1.0, high=1.0) == SPARKS[3] * 2


@pytest.mark.slow
def test_cli_bad_input_exits_2_without_a_traceback_or_torch(runs, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    cases = {  # arguments: (exit code, what stderr or stdout says)
        (str(runs / "a"), str(runs / "b")): (0, "rollouts of step 3: the same prompt in every run"),
        (str(runs / "a"),): (2, "grpo compare needs at least two runs, got 1"),
        (str(runs / "a"), str(tmp_path / "notes")): (2, "is not a run directory"),
        (str(runs / "a"), str(tmp_path / "nowhere")): (2, "no run directory at"),
        (str(runs / "a"), str(runs / "a") + "/"): (2, "the same run is named twice"),
        (str(runs / "a"), str(runs / "b"), "--step", "7"): (2, "not every run wrote rollouts for step 7"),
    }
    probe = ("import sys; from grpocli.cli.app import main; sys.argv = ['grpo', 'compare', *sys.argv[1:]]\n"
             "try:\n    main()\nfinally:\n    print('HEAVY:' + ','.join(m for m in ('torch', 'vllm') if m in sys.modules))")
    for args, (code, message) in cases.items():
        out = subprocess.run([sys.executable, "-c", probe, *args, "--no-plot"], check=False, capture_output=True, text=True,
                             cwd=ROOT, timeout=120, env={**os.environ, "COLUMNS": "160"})
        assert out.returncode == code, (args, out.stdout, out.stderr)
        assert message in (out.stderr if code else out.stdout) and "Traceback" not in out.stderr, out.stderr
        assert "HEAVY:\n" in out.stdout  # compare reads run directories without torch
