"""Input faults a user meets (issue 13): broken data files, stray args, non-UTF-8 bytes, empty
recipes. Each runs the real `grpo` command on real files and must end in one message that names
the file or key, with exit code 2 and no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import run_grpo
from tiny_runs import FAST

ROWS = [{"prompt": "1+2=", "answer": 3}, {"prompt": "5-1=", "answer": 4}]


def grpo(tmp_path: Path, *args: str):
    """`grpo ARGS` with the datasets cache under tmp_path (not ~/.cache)."""
    return run_grpo(*args, env={"HF_DATASETS_CACHE": str(tmp_path / "hf-cache")}, timeout=120)


def assert_user_error(out, *needles: str) -> str:
    """Exit 2, no traceback, one `error:` message holding every needle; returns stderr."""
    text = out.stdout + out.stderr
    assert out.returncode == 2, (out.returncode, text[-3000:])
    assert "Traceback" not in text, text[-3000:]
    assert out.stderr.count("error: ") == 1, out.stderr
    for needle in needles:
        assert needle in out.stderr, f"{needle!r} not in:\n{out.stderr}"
    return out.stderr


def jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


#: name, file contents, what the message must say (the file path is always checked).
BROKEN_FILES = {
    "bad_line.jsonl": (
        jsonl(ROWS[:1]) + b'{"prompt": "2+2=", "answer": 4\n' + jsonl(ROWS[1:]),
        [":2:", "line 2 of the data file is not valid JSON", "one JSON object per line"],
    ),
    "empty.jsonl": (b"", ["the data file is empty", "valid:", "grpo inspect data"]),
    "blank.jsonl": (b"\n  \n", ["empty (only white space)"]),
    "header_only.csv": (b"prompt,answer\n", ["header line ('prompt,answer') and no rows"]),
    "latin1.jsonl": (
        jsonl(ROWS[:1]) + '{"prompt": "café 1+1=", "answer": 2}\n'.encode("latin-1"),
        [":2:", "not UTF-8 text: byte 0xe9 at offset 47 (line 2, column 16)",
         'data.args={encoding="latin-1"}'],
    ),
    "latin1.csv": ("prompt,answer\n\"naïve 1+1=\",2\n".encode("latin-1"), [":2:", "byte 0xef"]),
}


@pytest.mark.parametrize("name", list(BROKEN_FILES))
def test_broken_data_file_is_named_by_dry_run(tmp_path, name):
    content, needles = BROKEN_FILES[name]
    file = tmp_path / name
    file.write_bytes(content)
    out = grpo(tmp_path, "train", "quickstart", "--dry-run", f"data.dataset='{file}'", "data.args={}")
    assert_user_error(out, str(file), *needles)


@pytest.mark.slow  # two runs of grpo, seconds each
def test_inspect_data_names_a_non_utf8_file(tmp_path):
    """`datasets` reads these bytes without a word; showing the row raised UnicodeDecodeError."""
    file = tmp_path / "latin1.jsonl"
    file.write_bytes('{"prompt": "café", "answer": 1}\n'.encode("latin-1"))
    out = grpo(tmp_path, "inspect", "data", "quickstart", f"data.dataset='{file}'", "data.args={}")
    assert_user_error(out, f"{file}:1", "offset 15")
    # the hint works: with its encoding named, the same file loads and renders
    named = grpo(tmp_path, "inspect", "data", "quickstart", f"data.dataset='{file}'",
                 'data.args={encoding="latin-1"}')
    assert named.returncode == 0, named.stderr[-2000:]
    assert "café" in named.stdout


@pytest.mark.slow  # a real `grpo train` (it stops before the model loads)
def test_training_stops_on_a_bad_line_before_any_model_loads(tmp_path):
    file = tmp_path / "train.jsonl"
    file.write_bytes(jsonl(ROWS) + b"{not json}\n")
    out_dir = tmp_path / "run"
    out = grpo(tmp_path, "train", "quickstart", *FAST, f"data.dataset='{file}'", "data.args={}",
               f"train.output_dir='{out_dir}'")
    assert_user_error(out, f"{file}:3", "line 3")
    assert not (out_dir / "checkpoints").exists()


@pytest.mark.slow  # two runs of grpo, seconds each
def test_leftover_generator_args_are_refused_with_how_to_clear_them(tmp_path):
    """quickstart's data.args = {num_samples = 2000} are for 'arithmetic'; they reached
    datasets.load_dataset as "JsonConfig.__init__() got an unexpected keyword argument"."""
    file = tmp_path / "rows.jsonl"
    file.write_bytes(jsonl(ROWS))
    out = grpo(tmp_path, "train", "quickstart", "--dry-run", f"data.dataset='{file}'")
    assert_user_error(out, "data.args.num_samples", str(file), "data.args={}", "valid:", "encoding")
    cleared = grpo(tmp_path, "train", "quickstart", "--dry-run", f"data.dataset='{file}'",
                   "data.args={}")
    assert cleared.returncode == 0, cleared.stderr[-2000:]


def test_missing_local_path_is_not_looked_up_on_the_hub(tmp_path):
    """A path with no data-file suffix used to be taken for a hub id (and a network error)."""
    (tmp_path / "data").mkdir()
    missing = tmp_path / "data" / "train"
    out = grpo(tmp_path, "train", "quickstart", "--dry-run", f"data.dataset='{missing}'",
               "data.args={}")
    stderr = assert_user_error(out, str(missing), "does not exist", "data.dataset")
    assert "hub" not in stderr.lower()


def test_dry_run_checks_the_eval_split_file_too(tmp_path):
    """With eval.every the test split loads at the first evaluation: dry-run looks at it now."""
    (tmp_path / "train.jsonl").write_bytes(jsonl(ROWS))
    out = grpo(tmp_path, "train", "quickstart", "--dry-run", f"data.dataset='{tmp_path}/{{split}}.jsonl'",
               "data.args={}", "eval.every=5")
    assert_user_error(out, str(tmp_path / "test.jsonl"), "does not exist", "train.jsonl")


def test_non_utf8_recipe_names_file_line_and_offset(tmp_path):
    recipe = tmp_path / "latin1.toml"
    recipe.write_bytes('[train]\nsteps = 2\n# caf\xe9\n'.encode("latin-1"))
    out = grpo(tmp_path, "train", str(recipe), "--dry-run")
    assert_user_error(out, f"{recipe}:3", "byte 0xe9 at offset 23 (line 3, column 6)", "UTF-8")


def test_empty_recipe_is_refused_and_a_table_runs_the_defaults_on_purpose(tmp_path):
    for text in ("", "# a recipe, some day\n\n"):
        recipe = tmp_path / "empty.toml"
        recipe.write_text(text)
        out = grpo(tmp_path, "train", str(recipe), "--dry-run")
        assert_user_error(out, str(recipe), "sets nothing", "[train]")
    recipe.write_text("[train]\n")
    out = grpo(tmp_path, "inspect", "recipe", str(recipe))
    assert out.returncode == 0, out.stderr[-2000:]


def test_empty_output_dir_is_refused(tmp_path):
    out = grpo(tmp_path, "train", "quickstart", "--dry-run", "train.output_dir=")
    assert_user_error(out, "train.output_dir", "current directory", "argument train.output_dir=''")


@pytest.mark.parametrize(
    "overrides, needles",
    [
        (["train.curriculum=replay_unsolved", "train.curriculum_args={treshold=0.3}"],
         ["train.curriculum_args.treshold", 'did you mean "threshold"', "replay_fraction"]),
        (["train.curriculum=skip_solved", "train.curriculum_args={replay_fraction=0.5}"],
         ["train.curriculum_args.replay_fraction", "valid: max_skip_factor, threshold"]),
        (["train.curriculum_args={threshold=0.3}"],
         ["train.curriculum_args", "no train.curriculum", "train.curriculum_args={}"]),
    ],
)
def test_unknown_curriculum_args_are_refused(tmp_path, overrides, needles):
    out = grpo(tmp_path, "train", "quickstart", "--dry-run", *overrides)
    assert_user_error(out, *needles)
