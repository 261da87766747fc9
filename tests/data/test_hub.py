"""Hub datasets fail fast and helpfully without a network; GSM8K rows are mapped as documented."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import grpocli
from grpocli.data.hub import gsm8k_row
from grpocli.data.source import load_dataset_for
from grpocli.errors import UserError
from grpocli.recipe.schema import DataSection

OFFLINE_SCRIPT = """
import time
from grpocli.data import builtin
from grpocli.data.source import load_dataset_for
from grpocli.errors import UserError
from grpocli.recipe.schema import DataSection
from grpocli.registry.names import Registry
reg = Registry("dataset")
builtin.register_datasets(register=reg.registrar("grpocli.data.builtin", "grpocli"))
start = time.monotonic()
try:
    load_dataset_for(DataSection(dataset="openai/gsm8k", args={"name": "main"}), reg, "train", 0)
except UserError as exc:
    print(f"SECONDS {time.monotonic() - start:.2f}")
    print(exc)
"""


def test_offline_env_gives_a_fast_user_error(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    root = str(Path(grpocli.__file__).parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-c", OFFLINE_SCRIPT], env=env, capture_output=True, text=True, timeout=60
    )
    assert "SECONDS" in out.stdout, out.stderr
    seconds = float(out.stdout.split("SECONDS ")[1].split()[0])
    assert seconds < 5
    assert "the Hugging Face Hub cannot be reached (HF_HUB_OFFLINE is set)" in out.stdout
    assert "datasets.load_dataset('openai/gsm8k', 'main')" in out.stdout
    assert 'data.dataset = "path/to/{split}.jsonl"' in out.stdout


@pytest.mark.parametrize("dataset", ["openai/gsm8k", "gsm8k"])
def test_unreachable_endpoint_fails_fast_without_retries(registry, monkeypatch, dataset):
    import datasets
    from huggingface_hub import constants

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # discard port: refused
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    start = time.monotonic()
    with pytest.raises(UserError) as err:
        load_dataset_for(DataSection(dataset=dataset), registry, "train", 0)
    assert time.monotonic() - start < 5
    assert "cannot be reached (no connection to the hub)" in err.value.what
    assert err.value.where == "data.dataset"
    assert "HF_HUB_OFFLINE=1" in err.value.hint


def test_gsm8k_row_takes_the_number_after_the_marks():
    row = {
        "question": "Natalia sold clips to 48 of her friends in April, and then half as many in May. "
        "How many clips did she sell altogether?",
        "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72\n#### 72",
    }
    assert gsm8k_row(row) == {"prompt": row["question"], "answer": "72", "solution": row["answer"]}
    assert gsm8k_row({"question": "q", "answer": "1000+72 = 1072\n#### 1,072"})["answer"] == "1072"
