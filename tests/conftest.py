"""Shared test setup: offline and quiet; the `grpo` fixture runs the real command line."""

from __future__ import annotations

import atexit
import os
import random
import shutil
import tempfile

import pytest
from cli_runner import run_grpo

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if not os.environ.get("PYTEST_XDIST_WORKER"):
    # grpo's cache (GGUF models' dense copies) in a folder of this session, not the user's: xdist's workers
    # and every process a test starts inherit it; it goes when the session ends.
    os.environ["GRPO_CACHE_DIR"] = tempfile.mkdtemp(prefix="grpo-test-cache-")
    atexit.register(shutil.rmtree, os.environ["GRPO_CACHE_DIR"], True)
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
    "planning/test_measured_long.py",   # ~130, 8K-token steps, two processes
    "parallel/test_sequence_parallel.py",  # ~140, 2 and 4 gloo processes
    "multiturn/test_environment_packages.py",  # 51
    "engines/test_fleet.py",            # ~200, two vLLM servers
    "faults/test_server_faults.py",     # ~100 (measured alone), a stock vLLM server
    "engines/test_vllm_server.py",      # ~100, a vLLM server
    "engines/test_trl_server_mode.py",  # ~90, a vLLM server
    "engines/test_judge_server.py",     # ~90, a vLLM server
    "engines/test_vllm_processes.py",   # 140, two processes
    "recipe/test_trl_import.py",        # ~110 (measured alone, loaded): TRL's trainer and grpo, 8 configs
    "recipe/test_trl_scripts.py",       # ~110 (measured alone, loaded): 4 scripts/configs imported, trained
    "engines/test_vllm_stock_server.py",  # ~90 (measured alone), two stock vLLM servers
    "engines/test_vllm_lora_adapter.py",  # ~90, a vLLM server
    "launch/test_launcher.py",          # 49
    "benchmark/test_bench_processes.py",  # 40, two processes
    "test_gpu_kit.py",                  # 46
    "faults/test_disk_faults.py",       # 40
    "test_docs.py",                     # 40
)


def _longest_first(items, longest=LONGEST_FIRST):
    here = os.path.dirname(__file__)
    rank = {os.path.join(here, name): i for i, name in enumerate(longest)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))  # stable: the rest keep their order


#: Opt-in test order, to show that no test depends on the ones before it (leaked modules, threads,
#: torch settings, environment): GRPO_TEST_ORDER=reverse (every order reversed: the files, the tests in
#: each file, LONGEST_FIRST among themselves) or random[:SEED] (the files, the tests in each file and
#: LONGEST_FIRST shuffled; without a SEED one is drawn, and the summary names it). The longest files still
#: come first, so that `-n 2 --dist loadfile --no-loadscope-reorder` stays balanced. Unset (CI): the
#: order of collection, the longest first.
ORDER_VARIABLE = "GRPO_TEST_ORDER"


def _test_order():
    mode, _, seed = os.environ.get(ORDER_VARIABLE, "").strip().partition(":")
    if mode not in ("", "reverse", "random") or (seed and mode != "random"):
        raise pytest.UsageError(f"{ORDER_VARIABLE} is reverse, random or random:SEED, not {os.environ[ORDER_VARIABLE]!r}")
    return mode, seed


def _reorder(items):
    """Reorders items as GRPO_TEST_ORDER says; returns LONGEST_FIRST in the same order."""
    mode, seed = _test_order()
    if mode == "reverse":
        items.reverse()
        return LONGEST_FIRST[::-1]
    if mode == "random":
        rng = random.Random(seed)  # the same SEED gives every xdist worker the same order
        by_file = {}
        for item in items:
            by_file.setdefault(item.path, []).append(item)
        files = list(by_file)
        rng.shuffle(files)
        items[:] = [item for path in files for item in rng.sample(by_file[path], len(by_file[path]))]
        return tuple(rng.sample(LONGEST_FIRST, len(LONGEST_FIRST)))
    return LONGEST_FIRST


def pytest_configure(config):
    mode, seed = _test_order()
    if mode == "random" and not seed and not os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ[ORDER_VARIABLE] = f"random:{random.randrange(10**6)}"  # xdist's workers inherit it


def pytest_report_header(config):
    if _test_order()[0]:
        return f"test order: {ORDER_VARIABLE}={os.environ[ORDER_VARIABLE]} (LONGEST_FIRST first, in that order)"


def pytest_terminal_summary(terminalreporter):
    if _test_order()[0]:  # also under -q, which has no header: the seed to run this order again
        terminalreporter.write_line(f"test order: {ORDER_VARIABLE}={os.environ[ORDER_VARIABLE]}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test that used a served engine (tests/vllm_serve_process.py's Server, e.g. tests/engines'
    session-wide one) reports how that server is and its log: a server that died mid-test fails every later
    test that shares it, and only its log says why."""
    from vllm_serve_process import Server

    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for name, value in getattr(item, "funcargs", {}).items():
            if isinstance(value, Server):
                report.sections.append((f"server {name}", value.report()))


def pytest_collection_modifyitems(config, items):
    """The longest files first (LONGEST_FIRST), in the order GRPO_TEST_ORDER asks for (default: as
    collected); tests marked `gpu` (`gpu2`) run where CUDA shows one (two) GPUs, and skip with the reason
    elsewhere."""
    _longest_first(items, _reorder(items))
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


def _torch_settings(torch) -> dict:
    """torch's process-wide settings (grad mode: the test's thread's) that a test must leave as it found them."""
    return {
        "default dtype": torch.get_default_dtype(),
        "deterministic algorithms": (torch.are_deterministic_algorithms_enabled(),
                                     torch.is_deterministic_algorithms_warn_only_enabled()),
        "grad mode": torch.is_grad_enabled(),
        "anomaly detection": torch.is_anomaly_enabled(),
        "float32 matmul precision": torch.get_float32_matmul_precision(),
        "default device": str(torch.get_default_device()),
    }


def _restore_torch_settings(torch, settings: dict) -> None:
    torch.set_default_dtype(settings["default dtype"])
    torch.use_deterministic_algorithms(settings["deterministic algorithms"][0],
                                       warn_only=settings["deterministic algorithms"][1])
    torch.set_grad_enabled(settings["grad mode"])
    torch.set_anomaly_enabled(settings["anomaly detection"])
    torch.set_float32_matmul_precision(settings["float32 matmul precision"])
    torch.set_default_device(None if settings["default device"] == "cpu" else settings["default device"])


@pytest.fixture(autouse=True)
def torch_settings_kept():
    """A test leaves torch as it found it, so that no test depends on the ones before it (run them in
    another order with GRPO_TEST_ORDER). A run with train.torch_threads sets torch's thread count for
    the whole process: later tests (vLLM's CPU attention checks it against the count it started with)
    get the old one back. Any other setting changed (the default dtype, deterministic algorithms, grad
    mode...) is restored too, and the test errs at teardown naming it."""
    import sys

    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    before = _torch_settings(torch) if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is None:
        return
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    if before is None:  # imported by this test: it starts from torch's defaults
        before = {"default dtype": torch.float32, "deterministic algorithms": (False, False), "grad mode": True,
                  "anomaly detection": False, "float32 matmul precision": "highest", "default device": "cpu"}
    after = _torch_settings(torch)
    changed = {name: (before[name], after[name]) for name in before if after[name] != before[name]}
    if changed:
        _restore_torch_settings(torch, before)
        pytest.fail("the test left torch's settings changed (restored now; restore them in the test, e.g. in a "
                    "fixture or try/finally): " + "; ".join(f"{name} {a} -> {b}" for name, (a, b) in changed.items()),
                    pytrace=False)


#: The signals whose handlers a library loaded in a test may set for the whole process (verifiers'
#: Environment sets SIGINT's and SIGTERM's).
SIGNALS_KEPT = ("SIGINT", "SIGTERM")


def _process_globals():
    import signal
    import sys

    return dict(os.environ), list(sys.path), {name: signal.getsignal(getattr(signal, name)) for name in SIGNALS_KEPT}


def _restore_process_globals(env: dict, path: list, handlers: dict) -> None:
    import signal
    import sys

    if os.environ != env:
        current = os.environ.get("PYTEST_CURRENT_TEST")  # pytest's own, set for each phase
        for key in set(os.environ) - set(env):
            del os.environ[key]
        os.environ.update(env)
        if current is not None:
            os.environ["PYTEST_CURRENT_TEST"] = current
    if sys.path != path:
        sys.path[:] = path
    for name, handler in handlers.items():
        if handler is not None and signal.getsignal(getattr(signal, name)) is not handler:
            signal.signal(getattr(signal, name), handler)


@pytest.fixture(autouse=True)
def process_globals_restored():
    """The environment variables, sys.path and the SIGINT/SIGTERM handlers as they were before the test,
    so that no test runs with what an earlier one left (run them in another order with GRPO_TEST_ORDER).
    What code run in this process sets for itself, not the test: a colocated vLLM engine sets LD_PRELOAD,
    LOCAL_WORLD_SIZE and VLLM_* (later `grpo` subprocesses inherited them), wandb WANDB_SERVICE,
    DeepSpeed DS_ACCELERATOR; a reward read from a file appends its folder to sys.path; a verifiers
    environment sets the signal handlers. What module fixtures set stays for their module's tests
    (process_globals_restored_after_the_module puts it back)."""
    before = _process_globals()
    yield
    _restore_process_globals(*before)


@pytest.fixture(scope="module", autouse=True)
def process_globals_restored_after_the_module():
    """process_globals_restored for a module's fixtures (an engine a module fixture starts in this process):
    the next file starts without what they set."""
    before = _process_globals()
    yield
    _restore_process_globals(*before)
