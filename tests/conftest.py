"""Shared test setup: offline and quiet; the `grpo` fixture runs the real command line."""

from __future__ import annotations

import os

import pytest
from cli_runner import run_grpo

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture
def grpo():
    return run_grpo
