"""`trl vllm-serve`'s flags that cannot work in grpo's one-engine server: exit 2 with the reason, before vLLM loads.

(The flags that do work are started for real in tests/engines/test_trl_server_mode.py, in TRL's spelling.)"""

from __future__ import annotations

import pytest
from cli_runner import assert_clean_error


@pytest.mark.parametrize(("flags", "needles"), [
    (["--tensor_parallel_size", "2"], ["--tensor_parallel_size", "one vLLM engine", "vllm.server_url"]),
    (["--data-parallel-size", "4"], ["--data_parallel_size", "start 4 servers"]),
    (["--distributed_executor_backend", "ray"], ["executor 'ray'", "valid: uni"]),
    (["--speculative_config", '{"method": "ngram"}'], ["speculative decoding", "draft model"]),
    (["--kv_cache_dtype", "fp9"], ["unknown value 'fp9'", "fp8_e4m3"]),
])
def test_trl_flags_that_cannot_work_are_refused(grpo, tmp_path, flags, needles):
    out = grpo("vllm-serve", "--model", str(tmp_path), *flags)  # refused before the model is even looked at
    assert_clean_error(out, *needles)
