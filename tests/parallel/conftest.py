"""Each test here opens accelerate with the mixed precision it needs: accelerate's state is reset
around every test (tests/accelerate_state.py)."""

from accelerate_state import fresh_accelerate_state  # noqa: F401  (an autouse fixture)
