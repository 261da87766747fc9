"""A fixture for test folders whose tests open accelerate with the mixed precision they need
(accelerate keeps one state per process and refuses another precision once it is set): each test
starts and ends with accelerate's state reset. A conftest.py imports it to use it."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state()
    yield
    AcceleratorState._reset_state()
