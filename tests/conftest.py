"""Shared test setup: offline and quiet; the `grpo` fixture runs the real command line."""

from __future__ import annotations

import os

import pytest
from cli_runner import run_grpo

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each worker has a core (`-n 2` on 2 cores): the runs it starts take one thread each. At torch's
    # default (a thread per core) two workers' runs oversubscribe the cores and OpenMP's waiting
    # threads spin: two quickstart runs side by side took 28.3 s at the default, 13.2 s at one thread
    # each (one run alone: 13.1 s). A test that needs another count sets it (train.torch_threads).
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def grpo():
    return run_grpo


#: The files that take longest (seconds summed over their tests, fresh-clone CI run of 2026-11-28 on 2
#: cores, `--durations`), longest first. They are collected first, so that `--dist loadfile` hands them
#: out before the many short files and the two workers end together: xdist's default order (files with
#: the most tests first) left these for last, one worker running them alone for minutes. The files that
#: launch two processes (DeepSpeed, FSDP2, the processes' engines) are spaced by single-process ones, so
#: that the other worker runs those meanwhile (DeepSpeed's first setup took 137 s and 263 s in two runs
#: that started it beside FSDP2's launches).
LONGEST_FIRST = (
    "trainer/test_deepspeed.py",        # 501 s, two processes
    "trainer/test_smollm2_recipe.py",   # 161
    "faults/test_run_directory.py",     # 139
    "faults/test_environment_faults.py",  # 114
    "faults/test_reward_faults.py",     # 83
    "engines/test_vllm_inflight_resume.py",  # 52
    "trainer/test_fsdp.py",             # 220, two processes
    "faults/test_processes.py",         # 90
    "launch/test_processes_in_step.py",  # 65
    "trainer/test_fsdp_lockstep.py",    # 145, two processes
    "multiturn/test_environment_packages.py",  # 51
    "engines/test_fleet.py",            # ~200, two vLLM servers
    "faults/test_server_faults.py",     # ~100 (measured alone), a stock vLLM server
    "engines/test_vllm_server.py",      # ~100, a vLLM server
    "engines/test_trl_server_mode.py",  # ~90, a vLLM server
    "engines/test_judge_server.py",     # ~90, a vLLM server
    "engines/test_vllm_processes.py",   # 140, two processes
    "engines/test_vllm_stock_server.py",  # ~90 (measured alone), two stock vLLM servers
    "engines/test_vllm_lora_adapter.py",  # ~90, a vLLM server
    "launch/test_launcher.py",          # 49
    "test_gpu_kit.py",                  # 46
    "faults/test_disk_faults.py",       # 40
    "test_docs.py",                     # 40
)


def _longest_first(items):
    here = os.path.dirname(__file__)
    rank = {os.path.join(here, name): i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))  # stable: the rest keep their order


def pytest_collection_modifyitems(config, items):
    """The longest files first (LONGEST_FIRST); tests marked `gpu` (`gpu2`) run where CUDA shows one
    (two) GPUs, and skip with the reason elsewhere."""
    _longest_first(items)
    wanted = {"gpu": 1, "gpu2": 2}
    marked = [(item, n) for item in items for name, n in wanted.items() if item.get_closest_marker(name)]
    if not marked:
        return
    try:
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        have = 0
    for item, n in marked:
        if have < n:
            item.add_marker(pytest.mark.skip(reason=f"needs {n} CUDA GPU{'s' if n > 1 else ''}; this machine has {have}"))


@pytest.fixture(autouse=True)
def torch_threads_restored():
    """A run with train.torch_threads sets torch's thread count for the whole process; later tests
    (vLLM's CPU attention checks it against the count it started with) get the old one back."""
    import sys

    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None and before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)
