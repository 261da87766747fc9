"""FSDP2 processes stay in step, and a run killed by SIGKILL resumes exactly.

Under train.sharding = "fsdp2" every forward pass is a collective (grpocli.trainer.sharding), so
a process that makes fewer generate calls than another leaves that one waiting forever. The
cases where the processes' work differs, on 2 CPU processes over gloo:

* the 'hf' backend with more prompts on one process than on the other, or none (dummy calls);
* evaluation with a process that has no eval prompt (it still takes part);
* multi-turn rollouts where one process's rollouts have all ended while the other's go on;
* periodic evaluation in `grpo train` with 3 eval prompts over 2 processes (2 and 1).

The first three run in one `torchrun` of this file (`_worker`, one JSON line per process) and
compare the sharded results with the same model unsharded, token for token. Every subprocess has
a timeout: a hang fails the test instead of blocking CI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
sys.path[:0] = [str(TESTS), str(TESTS / "multiturn")]  # also when torchrun runs this file as a script

from tiny_runs import FAST

from grpocli.rundir import RunDir

ENV = {"OMP_NUM_THREADS": "1"}
PARTS = ("uneven", "no_rows", "turns")
#: tests/trainer/test_fsdp.py's tiny FSDP2 run, 4 steps, a checkpoint every 2, evaluation every 2
#: steps on 3 prompts (2 on the main process, 1 on the other); eval.n = 40 > 64 / 2: one prompt
#: per generate call, so the two processes make 2 and 1 calls.
SETTINGS = [*FAST, "train.num_processes=2", "train.torch_threads=1", "algorithm.beta=0.04",
            "train.sharding=fsdp2", "train.steps=4", "train.save_steps=2", "log.rollouts_every=0",
            "eval.every=2", "eval.num_prompts=3", "eval.n=40"]
#: The quickstart's reward (length, target 8), 2 s slower: a kill window that is not a race.
SLOW_REWARD = """import time

from grpocli.rewards.builtin import length


def slow_length(prompts, completions, **kwargs):
    time.sleep(2.0)
    return length(prompts, completions, target=8)
"""


# -- the worker: torchrun --nproc_per_node 2 THIS PART... ------------------------------------
def _uneven(sharded, alone, tok, rank, parallel) -> dict:
    """Rank 0: 3 prompts, rank 1: a 1-token one (no shared prefill: an idle pass instead);
    2 prompts a call: 2 calls against 1."""
    import torch

    from grpocli.generation.base import Sampling

    texts = ["12+7=", "3*4=", "5-2="] if rank == 0 else ["8"]
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    sampling = Sampling(max_tokens=12, temperature=1.0)
    out = {}
    for name, backend in (("sharded", sharded), ("alone", alone)):
        torch.manual_seed(1 + rank)
        out[name] = backend.generate_ids(ids, 2, sampling).completion_ids
    return {"completions": len(out["sharded"]), "same": out["sharded"] == out["alone"],
            "prompt_lengths": [len(x) for x in ids]}


def _no_rows(sharded, alone, tok, rank, parallel) -> dict:
    """Evaluation with rows on rank 0 only: rank 1 still takes part in its generate call."""
    import torch

    from grpocli.evaluation.evaluator import EvalSettings, sample_and_score
    from grpocli.generation.base import Sampling
    from grpocli.recipe import load_recipe
    from grpocli.registry import load_plugins
    from grpocli.rewards import resolve

    reward_fns = resolve(load_recipe("quickstart").recipe.rewards, load_plugins().rewards)
    rows = [{"prompt": "12+7=", "prompt_text": "12+7=", "answer": 19}] if rank == 0 else []
    out = {}
    for name, backend in (("sharded", sharded), ("alone", alone)):
        torch.manual_seed(2)
        records = sample_and_score(backend, tok, rows, reward_fns, EvalSettings(n=3), Sampling(max_tokens=12))
        out[name] = [r["completion"] for r in records]
    return {"records": len(out["sharded"]), "same": out["sharded"] == out["alone"]}


def _turns(sharded, alone, tok, rank, parallel) -> dict:
    """Multi-turn rollouts: on rank 0 every turn is a tool call (up to 4 turns), on rank 1 none
    is (its rollouts end after turn 1), so rank 1 makes empty calls while rank 0 goes on."""
    import torch
    from turn_fixtures import ROWS, SAMPLING, echo_loop, recipe

    r = recipe()
    loop = echo_loop(r, tok, parallel=parallel)
    if rank == 1:
        loop.parse = lambda text: []
    out = {}
    for name, backend in (("sharded", sharded), ("alone", alone)):
        torch.manual_seed(3)
        out[name] = loop.sample(backend, ROWS, r.generation.num_generations, SAMPLING)
    conv = out["sharded"]
    return {"rollouts": conv.stats.rollouts, "turns": conv.stats.turns, "calls": conv.stats.calls,
            "same": conv.generated.completion_ids == out["alone"].generated.completion_ids
            and conv.completion_mask == out["alone"].completion_mask}


def _worker(parts: list[str]) -> None:
    import copy

    import torch
    import torch.distributed as dist
    from accelerate import Accelerator
    from torch.distributed.fsdp import FSDPModule
    from turn_fixtures import chatty_model, recipe

    from grpocli.generation.hf import HFBackend
    from grpocli.parallel.fsdp2 import Fsdp2, shard

    torch.set_num_threads(1)
    acc = Accelerator(cpu=True)
    parallel = Fsdp2(acc)
    torch.manual_seed(0)
    model, tok = chatty_model(recipe())  # the same weights on both processes (seeded)
    plain = copy.deepcopy(model)         # the same model, unsharded: what sharded generation must equal
    shard(model, acc)
    assert isinstance(model, FSDPModule)
    sharded = HFBackend(model, tok, max_prompt_length=512, batch_size=4, parallel=parallel)
    alone = HFBackend(plain, tok, max_prompt_length=512, batch_size=4)
    functions = {"uneven": _uneven, "no_rows": _no_rows, "turns": _turns}
    line = {"rank": acc.process_index}
    for part in parts:
        line[part] = functions[part](sharded, alone, tok, acc.process_index, parallel)
    dist.barrier()
    os.write(1, (json.dumps(line) + "\n").encode())  # one write: the two lines never interleave
    dist.destroy_process_group()


def _run_group(cmd: list[str], timeout: float, log: Path) -> tuple[int | None, str]:
    """Run `cmd`; on timeout kill it and every process under it (torchrun starts its workers in
    sessions of their own). The exit status (None: it hung) and its output."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", **ENV},
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)
            proc.wait()
            code = None
    return code, log.read_text()


def _kill_tree(pid: int) -> None:
    """SIGKILL `pid` and its descendants (found in /proc before any of them dies)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = [pid], [pid]
    while todo:
        found = children.get(todo.pop(), [])
        tree += found
        todo += found
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def worker_lines(tmp_path_factory) -> dict[int, dict]:
    log = tmp_path_factory.mktemp("lockstep") / "worker.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", __file__, *PARTS]
    code, text = _run_group(cmd, 240, log)
    assert code is not None, f"the processes hung (killed after 240 s): {text[-3000:]}"
    assert code == 0, text[-3000:]
    lines = [json.loads(x) for x in text.splitlines() if x.startswith('{"rank"')]
    return {line["rank"]: line for line in lines}


@pytest.mark.slow
def test_hf_backend_evens_generate_calls_over_processes(worker_lines):
    main, other = worker_lines[0]["uneven"], worker_lines[1]["uneven"]
    assert main["completions"] == 6 and other["completions"] == 2
    assert other["prompt_lengths"] == [1] and min(main["prompt_lengths"]) > 1
    assert main["same"] and other["same"]  # the dummy calls changed no token


@pytest.mark.slow
def test_a_process_without_eval_rows_takes_part(worker_lines):
    assert worker_lines[0]["no_rows"] == {"records": 3, "same": True}
    assert worker_lines[1]["no_rows"] == {"records": 0, "same": True}


@pytest.mark.slow
def test_multi_turn_goes_on_while_any_process_has_a_live_rollout(worker_lines):
    main, other = worker_lines[0]["turns"], worker_lines[1]["turns"]
    assert other["turns"] == other["rollouts"] == 6 and other["calls"] == 0  # done after turn 1
    assert main["turns"] > main["rollouts"] == 6 and main["calls"] > 0       # went on alone
    assert main["same"] and other["same"]  # as the unsharded loop, token for token


# -- grpo train: periodic evaluation, and SIGKILL then resume --------------------------------
def _train_cmd(out: Path, reward: Path) -> list[str]:
    return [sys.executable, "-m", "grpocli.cli.app", "train", "quickstart", *SETTINGS,
            f'rewards=[{{name="{reward}:slow_length"}}]', f"train.output_dir={out}"]


def _untimed(metrics: list[dict]) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith("time/") and not k.endswith("/seconds")
             and k not in ("tokens_per_second", "step_time")}
            for m in metrics]


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("reward") / "slow_reward.py"
    path.write_text(SLOW_REWARD)
    return path


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, reward_file) -> list[dict]:
    out = tmp_path_factory.mktemp("whole") / "run"
    code, text = _run_group(_train_cmd(out, reward_file), 240, out.parent / "train.log")
    assert code is not None, f"the run hung (killed after 240 s): {text[-3000:]}"
    assert code == 0, text[-3000:]
    return RunDir(out).read_metrics()


@pytest.mark.slow
def test_periodic_eval_with_an_odd_number_of_prompts_finishes(uninterrupted):
    steps = [m["step"] for m in uninterrupted if "loss" in m]
    evals = [m for m in uninterrupted if "eval/reward" in m]
    assert steps == [1, 2, 3, 4]
    assert [m["step"] for m in evals] == [2, 4]
    for m in evals:
        assert m["eval/num_prompts"] == 3.0  # 2 from the main process, 1 from the other
        assert -10.0 < m["eval/reward"] <= 0.0 and "eval/pass@1" in m


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SIGKILL and process groups")
def test_sigkill_then_resume_is_exact_under_fsdp2(uninterrupted, reward_file, tmp_path):
    run = RunDir(tmp_path / "run")
    cmd = _train_cmd(run.root, reward_file)
    log = tmp_path / "killed.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", **ENV},
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        # step 3 logged after the step-2 checkpoint: step 4 is under way (2 s in its reward at least)
        while not (run.metrics.exists() and any(m.get("step") == 3 and "loss" in m for m in run.read_metrics())):
            assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before step 3: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no step 3 after 240 s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            _kill_tree(proc.pid)
            proc.wait()
    assert run.latest_checkpoint()[0] == 2  # killed before step 4 (and its checkpoint) finished
    assert max(m["step"] for m in run.read_metrics()) == 3
    code, text = _run_group(cmd, 240, tmp_path / "resumed.log")  # resume = "auto": from step-2
    assert code == 0, text[-3000:]
    resumed = run.read_metrics()
    assert [m["step"] for m in resumed if "loss" in m] == [1, 2, 3, 4]  # each step once
    assert _untimed(resumed) == _untimed(uninterrupted)  # every value equal, not merely close


if __name__ == "__main__":
    _worker(sys.argv[1:] or list(PARTS))
