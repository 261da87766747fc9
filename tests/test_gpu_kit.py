"""The GPU acceptance kit on this CPU, as far as it goes: the wheel list, the kit built (grpocli's own
wheel only: no download in a test), installed with --no-index into a fresh venv that sees a
"node's" packages (this environment's, grpocli left out), `grpo --version` there, and the kit's
bench step `grpo bench --vs-trl --json` (grpo and TRL training for real, in fresh processes) at
a tiny shape, ending in the one JSON line. (`grpo bench` alone, the kit's other bench step, runs
in tests/benchmark/test_bench.py, in-process, to keep the suite's time.)"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KIT = ROOT / "gpu-kit"


def test_the_wheel_list_is_what_a_node_with_torch_transformers_accelerate_peft_lacks():
    done = subprocess.run([sys.executable, str(KIT / "wheel_list.py")], capture_output=True, text=True, check=True)
    names = {line.split("==")[0] for line in done.stdout.split()}
    assert {"typer", "rich", "pydantic", "pydantic-settings", "pluggy", "pytest", "trl", "datasets"} <= names
    assert not names & {"torch", "transformers", "accelerate", "peft", "numpy", "grpocli"}
    assert not any(n.startswith(("nvidia-", "triton")) for n in names)


def _node_site(tmp: Path) -> Path:
    """This environment's packages without grpocli (and without .pth files): what a node has."""
    node = tmp / "node" / "site-packages"  # named as one: dill (datasets' hashing) pickles by reference there
    node.mkdir(parents=True)
    source = Path(next(p for p in site.getsitepackages() if Path(p, "torch").is_dir()))
    for entry in source.iterdir():
        if entry.name.startswith(("grpocli", "__editable__", "_grpocli")) or entry.suffix == ".pth":
            continue
        (node / entry.name).symlink_to(entry)
    return node


@pytest.mark.slow
def test_the_kit_builds_installs_without_an_index_and_benches_at_a_tiny_shape(tmp_path):
    kit = tmp_path / "kit"
    built = subprocess.run(["bash", str(KIT / "build-wheelhouse.sh"), "--no-download", str(kit)],
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr
    assert "limit 60 MB" in built.stdout
    assert (kit / "wheelhouse.tar.xz").stat().st_size <= 60e6 and (kit / "run.sh").is_file()
    assert Path(f"{kit}.tar").is_file() and (kit / "tests" / "conftest.py").is_file()

    venv = tmp_path / "venv"  # a fresh venv; the node's packages through a .pth (as --system-site-packages)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "node.pth").write_text(str(_node_site(tmp_path)) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHON=str(py), KIT_SKIP="tests plan bench", KIT_SHAPES="cpu-tiny", KIT_DTYPE="float32", KIT_BACKEND="hf", KIT_LENGTH="8",
               KIT_STEPS="2", KIT_REPEATS="1", KIT_STEP_TIMEOUT="120", OMP_NUM_THREADS="1")
    done = subprocess.run(["bash", str(kit / "run.sh")], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert [s["step"] for s in line["steps"]] == ["install", "version", "vs-trl-cpu-tiny"]
    assert line["ok"], (line["steps"], done.stderr[-3000:])
    assert line["grpo"].startswith("grpo ")
    located = subprocess.run([str(py), "-c", "import grpocli; print(grpocli.__file__)"], capture_output=True,
                             text=True, env=env, cwd=tmp_path, check=True).stdout
    assert located.startswith(purelib)  # the wheel from the kit, not this checkout
    vs = line["shapes"]["cpu-tiny"]["vs_trl"]
    assert vs["ratio_steps_per_s"] > 0 and vs["grpo_tokens_per_s"] > 0 and vs["trl_tokens_per_s"] > 0
