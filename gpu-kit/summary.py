"""The GPU kit's last line: every figure of a run of run.sh as ONE JSON line (from its results folder).

    python summary.py RESULTS_DIR "SHAPE ..."
"""

from __future__ import annotations

import importlib.util
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any


def last_json(path: Path) -> dict[str, Any] | None:
    """The last line of `path` that parses as a JSON object (None: no file, or none)."""
    if not path.is_file():
        return None
    for line in reversed(path.read_text(errors="replace").splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def tests(xml: Path) -> dict[str, int] | None:
    if not xml.is_file():
        return None
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in ET.parse(xml).getroot().iter("testsuite"):
        for k in counts:
            counts[k] += int(suite.get(k, 0))
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {}
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda"] = torch.version.cuda
        env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception as err:  # noqa: BLE001 - the line still comes out
        env["torch_error"] = repr(err)
    for name in ("transformers", "accelerate", "peft", "trl", "vllm"):
        if importlib.util.find_spec(name) is not None:
            from importlib import metadata

            try:
                env[name] = metadata.version(name if name != "vllm" else "vllm")
            except metadata.PackageNotFoundError:
                env[name] = "installed"
        else:
            env[name] = None
    return env


def shape_figures(out: Path, shape: str) -> dict[str, Any]:
    fig: dict[str, Any] = {}
    bench = last_json(out / f"bench-{shape}.json")
    if bench:
        fig["bench"] = {k: bench.get(k) for k in (
            "parameters", "dtype", "device", "backend", "s_per_step", "phases_s", "tokens_per_s",
            "completion_tokens_per_s", "flops_per_step", "achieved_flops_per_s", "peak_flops_per_s", "mfu",
            "peak_memory_bytes", "peak_memory_kind", "startup_s")}
    plan = last_json(out / f"plan-{shape}.json")
    if plan:
        fig["plan"] = plan
    vs = last_json(out / f"vs-trl-{shape}.json")
    if vs:
        s = vs["summary"]
        fig["vs_trl"] = {"ratio_steps_per_s": vs["ratio_steps_per_s"], "steps": vs["steps"], "repeats": vs["repeats"],
                         **{f"{fw}_{k}": s[fw].get(k) for fw in ("grpo", "trl")
                            for k in ("steps_per_s", "tokens_per_s", "phases_s", "backend", "cuda_max_allocated_gib",
                                      "peak_rss_mib")}}
    return fig


def main() -> None:
    out, shapes = Path(sys.argv[1]), sys.argv[2].split()
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines() if line.strip()]
    version = (out / "version.out").read_text().strip() if (out / "version.out").is_file() else None
    line = {
        "kit": "grpo-gpu-kit", "grpo": version, **environment(), "steps": steps,
        "gpu_tests": tests(out / "gpu-tests.xml"), "shapes": {s: shape_figures(out, s) for s in shapes},
        "ok": all(s["rc"] == 0 for s in steps),
    }
    print(json.dumps(line))


if __name__ == "__main__":
    main()
