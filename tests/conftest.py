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


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` (`gpu2`) run where CUDA shows one (two) GPUs, and skip with the reason elsewhere."""
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
