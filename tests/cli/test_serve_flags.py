"""`grpo vllm-serve` runs stock `vllm serve`: TRL's flags translated as `trl vllm-serve` translates them
(TRL 1.16's ``build_command``), plus what grpo's trainer needs; bad values exit 2 before vLLM loads.

``--dry-run`` prints the command without running it. (The command is started for real in tests/engines and
tests/faults, in grpo's spelling and TRL's.)"""

from __future__ import annotations

import shlex

import pytest
from cli_runner import assert_clean_error

from grpocli.server.command import ServeFlags, build_command

#: What every command holds, whatever the flags (grpocli/server/command.py says why).
ALWAYS = ["--enable-scale-out", "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1", "--middleware",
          "grpocli.server.guard.Guard"]


def _printed(grpo, *flags) -> list[str]:
    out = grpo("vllm-serve", "--model", "/models/m", "--dry-run", *flags)
    assert out.returncode == 0, out.stderr
    env_and_argv = shlex.split(out.stdout.strip())
    assert env_and_argv[:2] == ["VLLM_SERVER_DEV_MODE=1", "GRPO_VLLM_MAX_BODY_MB=256"]
    assert env_and_argv[2:5] == ["vllm", "serve", "/models/m"]
    return env_and_argv[5:]


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_trl_spelling_and_vllms_own_reach_the_command(grpo):
    argv = _printed(grpo, "--max_model_len", "192", "--tensor_parallel_size", "2", "--data-parallel-size", "4",
                    "--enable_prefix_caching", "--kv_cache_dtype", "fp8", "--vllm_model_impl", "transformers",
                    "--distributed_executor_backend", "ray", "--speculative_config", '{"method": "ngram"}',
                    "--log_level", "info", "--", "--max-num-seqs", "8")
    assert _value(argv, "--max-model-len") == "192" and _value(argv, "--tensor-parallel-size") == "2"
    assert _value(argv, "--data-parallel-size") == "4" and "--enable-prefix-caching" in argv
    assert _value(argv, "--kv-cache-dtype") == "fp8" and _value(argv, "--model-impl") == "transformers"
    assert _value(argv, "--distributed-executor-backend") == "ray"
    assert _value(argv, "--speculative-config") == '{"method": "ngram"}'
    assert _value(argv, "--uvicorn-log-level") == "info"
    assert argv[-2:] == ["--max-num-seqs", "8"]  # after `--`: vLLM's own flags, as they are
    for part in ALWAYS:
        assert part in argv
    assert _value(argv, "--weight-transfer-config") == '{"backend": "grpo_gloo"}'  # no GPU here
    assert "--enforce-eager" in argv  # a CPU: no CUDA graphs to capture


def test_on_a_gpu_weights_go_over_nccl_and_cuda_graphs_stay():
    argv, env = build_command(ServeFlags(model="m", api_key="k"), has_gpu=True)
    assert argv[argv.index("--weight-transfer-config") + 1] == '{"backend": "nccl"}'
    assert "--enforce-eager" not in argv
    assert env["VLLM_API_KEY"] == "k" and "k" not in argv  # the key in vLLM's own variable, not on the command line


def test_lora_rank_serves_adapters_loaded_at_run_time():
    argv, env = build_command(ServeFlags(model="m", lora_rank=12), has_gpu=False)
    assert "--enable-lora" in argv and argv[argv.index("--max-lora-rank") + 1] == "16"  # vLLM's ranks: 8, 16, ...
    assert argv[argv.index("--max-loras") + 1] == "1" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_the_command_holds_every_flag_trls_own_would():
    """TRL 1.16's build_command for the same flags: each of its flags and values is in grpo's command."""
    trl_serve = pytest.importorskip("trl.scripts.vllm_serve", reason="TRL is not installed (pip install trl)")
    args = trl_serve.ScriptArguments(model="m", port=8001, max_model_len=512, tensor_parallel_size=2,
                                     enable_prefix_caching=True, enforce_eager=True, trust_remote_code=True)
    theirs = trl_serve.build_command(args)
    ours, _ = build_command(ServeFlags(model="m", port=8001, max_model_len=512, tensor_parallel_size=2,
                                       enable_prefix_caching=True, enforce_eager=True, trust_remote_code=True,
                                       log_level="info", host="0.0.0.0", vllm_model_impl="vllm"), has_gpu=True)
    pairs = dict(zip(ours, ours[1:]))
    rest = theirs[theirs.index("serve") + 2:]  # after `serve MODEL`
    for flag, value in zip(rest, [*rest[1:], None]):
        if flag.startswith("--"):
            assert flag in ours, flag
            if value is not None and not value.startswith("--"):
                assert pairs[flag] == value, (flag, pairs[flag], value)


@pytest.mark.parametrize(("flags", "needles"), [
    (["--kv_cache_dtype", "fp9"], ["--kv-cache-dtype", "unknown value 'fp9'", "fp8_e4m3"]),
    (["--dtype", "float64"], ["--dtype", "unknown dtype 'float64'", "valid: auto, float32, bfloat16, float16"]),
    (["--log_level", "loud"], ["--log-level", "unknown value 'loud'"]),
    (["--weight-transfer", "http"], ["--weight-transfer", "valid: auto, nccl, grpo_gloo"]),
])
def test_bad_values_are_refused_before_vllm_loads(grpo, tmp_path, flags, needles):
    out = grpo("vllm-serve", "--model", str(tmp_path), *flags)  # refused before the model is even looked at
    assert_clean_error(out, *needles)


def test_bool_flags_take_a_value_as_trl_vllm_serve_does(grpo):
    """TRL's parser gives a bool flag its value in the next word (`--enforce_eager True`); in either
    spelling, with `=` or without, and the bare flag still means true."""
    on = _printed(grpo, "--enforce_eager", "True", "--enable_prefix_caching", "false", "--trust-remote-code=1",
                  "--trust_request_chat_template", "YES", "--", "--max-num-seqs", "8")
    assert "--enforce-eager" in on and "--no-enable-prefix-caching" in on and "--trust-remote-code" in on
    assert "--trust-request-chat-template" in on and on[-2:] == ["--max-num-seqs", "8"]
    assert "True" not in on and "false" not in on and "YES" not in on  # taken as values, not passed on to vLLM
    off = _printed(grpo, "--enforce-eager=false", "--enable-prefix-caching", "t", "--trust_remote_code", "0",
                   "--port", "8001")
    assert "--enforce-eager" not in off and "--trust-remote-code" not in off  # false, though on a CPU
    assert "--enable-prefix-caching" in off and _value(off, "--port") == "8001"
    bare = _printed(grpo, "--trust_remote_code", "--enforce-eager")
    assert "--trust-remote-code" in bare and "--enforce-eager" in bare


def test_a_bool_flag_refuses_a_value_that_is_not_true_or_false(grpo, tmp_path):
    out = grpo("vllm-serve", "--model", str(tmp_path), "--enforce_eager", "maybe")
    assert_clean_error(out, "--enforce_eager takes true or false, not 'maybe'", "yes/true/t/y/1", "--no-enforce-eager")
