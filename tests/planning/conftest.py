"""Each test here opens accelerate with the mixed precision it needs (accelerate keeps one state
per process and refuses another precision once it is set)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    yield
    AcceleratorState._reset_state()
