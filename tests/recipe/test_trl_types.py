"""The types `grpo import trl` checks TRL's fields against, and how it reads strings, against TRL 1.16
itself (its GRPOConfig and `trl grpo`'s argument dataclasses, and its own config parser): skipped
where TRL is not installed."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from grpocli.errors import UserError
from grpocli.recipe.trl_import import SCRIPT_FIELDS
from grpocli.recipe.trl_names import TRL_FIELDS
from grpocli.recipe.trl_types import DIFFERS, TRL_TYPES, check_fields, checked

#: One value of each kind a YAML, JSON or Python config can hold.
SAMPLES = [None, 0, 7, -1, 0.5, True, "x", "{}", [], [1.0], ["a"], [1], {}, {"a": 1}, {1: "a"}]


def _trl_annotations() -> dict[str, typing.Any]:
    trl = pytest.importorskip("trl")
    import trl.scripts.grpo as grpo_script

    out = {}
    for cls in (grpo_script.GRPOScriptArguments, trl.ModelConfig, trl.GRPOConfig):  # GRPOConfig's win
        hints = typing.get_type_hints(cls)
        out.update({f.name: hints[f.name] for f in dataclasses.fields(cls)})
    return out


def _accepts(kind: typing.Any, value: typing.Any) -> bool:
    from pydantic import ConfigDict, TypeAdapter, ValidationError

    try:
        TypeAdapter(kind, config=ConfigDict(arbitrary_types_allowed=True)).validate_python(value, strict=True)
    except ValidationError:
        return False
    return True


def test_every_field_the_import_reads_has_a_type():
    assert set(TRL_FIELDS) | set(SCRIPT_FIELDS) | {"reward_funcs", "reward_weights",
                                                    "reward_model_name_or_path"} == set(TRL_TYPES)


@pytest.mark.parametrize("name", sorted(TRL_TYPES))
def test_each_type_is_trls_own_or_its_difference_is_said(name):
    """What the table lets through, TRL's annotation takes too, and the other way round, for one
    value of each kind; the fields where they differ are exactly DIFFERS (each with why)."""
    trl = _trl_annotations()
    if name not in trl:
        pytest.skip(f"{name} is no field of TRL 1.16 (an older TRL's, still read)")
    ours = {repr(v): _accepts(TRL_TYPES[name], v) for v in SAMPLES}
    theirs = {repr(v): _accepts(trl[name], v) for v in SAMPLES}
    if name in DIFFERS:
        assert ours != theirs, f"{name} is in DIFFERS but takes what TRL's {trl[name]} takes"
    else:
        assert ours == theirs, f"{name}: ours {TRL_TYPES[name]}, TRL's {trl[name]}"


@pytest.mark.parametrize(("name", "text"), [
    ("max_steps", "10"), ("learning_rate", "1e-5"), ("num_train_epochs", "2"), ("bf16", "no"),
    ("gradient_checkpointing", "True"), ("seed", "7"), ("warmup_steps", "0.1"), ("vllm_mode", "server"),
    ("min_p", "0.05"), ("max_completion_length", "64"),
])
def test_strings_read_as_trl_grpo_config_reads_them(name, text, tmp_path):
    """`trl grpo --config` applies a field's type to a string value (argparse converts string
    defaults), and YAML reads 1e-5 as a string: the import reads it as TRL's own parser does."""
    trl = pytest.importorskip("trl")
    import yaml

    (tmp_path / "c.yaml").write_text(yaml.safe_dump({name: text, "output_dir": str(tmp_path / "o"), "bf16": False}
                                                    | ({name: text} if name == "bf16" else {})))
    parsed = trl.TrlParser((trl.GRPOConfig,)).parse_args_and_config(["--config", str(tmp_path / "c.yaml")])[0]
    assert checked(name, text, "c.yaml", from_text=True) == getattr(parsed, name)


def test_a_python_file_s_strings_stay_strings():
    """GRPOConfig(max_steps="10") keeps the string (nothing converts it, and TRL fails on it later)."""
    with pytest.raises(UserError, match=r"max_steps is '10' \(str\): TRL takes an integer"):
        checked("max_steps", "10", "train.py", from_text=False)
    assert checked("max_steps", "10", "c.yaml", from_text=True) == 10


def test_fields_trl_does_not_have_pass_unchecked():
    assert check_fields({"max_prompt_length": -1, "my_key": [None]}, "c.yaml", from_text=True) == {
        "max_prompt_length": -1, "my_key": [None]}
