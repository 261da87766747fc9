"""A vLLM engine in this process (generation.backend = "vllm"), and the engine wrapper the server shares.

Colocated generation as in TRL's ``vllm_mode="colocate"``: the engine runs in the training
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; on CUDA on the process's own GPU, under vLLM's external
launcher: grpocli.generation.engine_options), starts from a copy of the policy saved to a temporary
directory (/dev/shm where it has room: grpocli.generation.engine_copy), and at each ``sync_weights``
(the trainer calls it after each generation cycle's optimizer steps) receives the new weights in
place through vLLM's ``reload_weights`` (no restart), followed by a prefix-cache reset so no cached
prefix keeps the old weights' activations.

Log-probs are vLLM's "processed" ones (after temperature, as TRL's importance-sampling correction
asks), one per completion token.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpocli.errors import UserError
from grpocli.generation.base import Generated, PromptEncoder, Sampling
from grpocli.generation.devices import process_device, use_device
from grpocli.generation.engine_context import check_context_length
from grpocli.generation.engine_copy import copy_dir, write_engine_copy
from grpocli.generation.engine_options import engine_dtype, engine_options
from grpocli.generation.engine_sleep import EngineSleep, check_sleep_mode
from grpocli.generation.engine_thread import EngineThread
from grpocli.generation.inflight import sampled_logprobs
from grpocli.generation.lora_adapter import adapter_versions, engine_lora_kwargs
from grpocli.generation.vllm_install import check_head_size, import_vllm
from grpocli.generation.weights import (
    TensorSpec,
    checkpoint_spec,
    policy_weights,
    spec_problems,
)
from grpocli.parallel import Parallel

if TYPE_CHECKING:
    from grpocli.recipe.vllm_section import VllmSection

#: Environment vLLM reads at import; the user's own settings win (setdefault).
VLLM_ENV = {
    "VLLM_HOST_IP": "127.0.0.1",  # else it probes an outside address for its message queue
    "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1", "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_LOGGING_LEVEL": "WARNING",  # the engine's INFO lines would drown the training progress
}


def prepare_vllm_environment(*, kv_cache_gb: int = 1, in_process: bool = True,
                             threads: int | None = None) -> None:
    """Set vLLM's environment before ``import vllm`` (later changes are not seen).

    On CPU, vLLM binds its OpenMP threads to cores and then ignores ``torch.set_num_threads`` in
    this process, training included: ``threads`` (train.torch_threads) picks that many of the
    cores this process may run on (its affinity mask, so ``taskset`` is respected); None takes
    them all (vLLM's own default leaves one core idle).
    """
    for key, value in VLLM_ENV.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{kv_cache_gb:g}")
    if in_process:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(threads)


def inflight_engine_kwargs(cuda: bool) -> dict[str, Any]:
    """vllm.LLM's arguments for an engine stepped in flight: synchronous scheduling (each step's
    tokens are labelled with the weights' version that sampled them); on a CPU, no prefill split over
    two steps: a split request's sampled token is discarded and vLLM then rewinds its seeded generator,
    which a CPU generator cannot do ("CPU Generator does not use offset", vLLM 0.32's
    _bookkeeping_sync), and every in-flight group is seeded (grpocli.generation.inflight.group_seed)."""
    return {"async_scheduling": False} if cuda else {"async_scheduling": False, "enable_chunked_prefill": False}


def cpu_binding(threads: int | None) -> str:
    """vLLM's core list ("0,1") for ``threads`` cores of this process's affinity mask (all for None)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return ",".join(map(str, cores[:threads] if threads else cores))


class VllmEngine:
    """``vllm.LLM`` in this process: generate from token ids, reload weights in place.

    ``device``: the CUDA device it runs on (default: this thread's current one where CUDA is
    available, else the CPU); ``parallel``: the training processes it is one of (a colocated
    engine: vLLM's external launcher on CUDA, see grpocli.generation.engine_options), None for an
    engine alone in its process. ``enforce_eager`` None: on for a CPU, off on
    CUDA; ``max_num_batched_tokens`` None: 4096 on CUDA, vLLM's own on a CPU. ``where`` and
    ``length_where`` name the setting a UserError blames (the model; the context length).
    """

    def __init__(self, model_dir: str | Path, *, dtype: str = "auto", max_model_len: int | None = None,
                 enforce_eager: bool | None = None, gpu_memory_utilization: float = 0.3, seed: int = 0,
                 max_logprobs: int = 1, max_num_batched_tokens: int | None = None, device: Any = None,
                 parallel: Parallel | None = None, where: str = "generation.backend",
                 length_where: str = "vllm.max_model_len", sleep_mode: bool = False,
                 engine_kwargs: dict[str, Any] | None = None) -> None:
        import torch

        check_context_length(model_dir, max_model_len, length_where)
        vllm = import_vllm(where)
        check_head_size(model_dir, where)
        if torch.cuda.is_available():  # vLLM's CUDA platform: the engine is on a GPU
            device = process_device(device) or torch.device("cuda", torch.cuda.current_device())
        else:
            device = None
        options = engine_options(
            str(model_dir), device, world=parallel.size if parallel else 1, rank=parallel.rank if parallel else 0,
            colocated=parallel is not None, dtype=dtype, max_model_len=max_model_len, enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization, seed=seed, max_logprobs=max_logprobs,
            max_num_batched_tokens=max_num_batched_tokens, sleep_mode=sleep_mode, extra=engine_kwargs)
        os.environ.update(options.env)
        use_device(device)
        # vLLM seeds torch's global RNGs: the CPU's, and this GPU's (the trainer's own stream of numbers)
        with torch.random.fork_rng(devices=[device.index] if device is not None else []):
            self.llm = vllm.LLM(**options.kwargs)
        use_device(device)  # the process keeps its own device whatever vLLM's worker chose
        config = self.llm.llm_engine.model_config
        self.model = str(model_dir)
        self.device = device                             # torch.device("cuda", i), or None: the CPU
        self.dtype = config.dtype                        # torch.dtype the engine computes in
        self.max_model_len = int(config.max_model_len)
        cache = getattr(getattr(self.llm.llm_engine, "vllm_config", None), "cache_config", None)
        self.prefix_caching = bool(getattr(cache, "enable_prefix_caching", False))  # vLLM's decision
        self.kv_cache_dtype = str(getattr(cache, "cache_dtype", "auto"))
        self.world_size = 1
        self.spec: dict[str, TensorSpec] = checkpoint_spec(model_dir, self.dtype)
        self.lora_request: Any = None  # vllm.lora_sync = "adapter": the adapter version requests use
        self.loaded_bytes = 0  # of the last load_weights

    def generate(self, prompts: list[list[int]] | list[str], n: int, sampling: Sampling,
                 *, logprobs: bool = True, seed: int | list[int] | None = None) -> Generated:
        """n completions per prompt (token ids or strings), prompt-major, with log-probs; ``seed``: one
        for every prompt or one per prompt."""
        outputs = self.raw(prompts, n, sampling, logprobs=0 if logprobs else None, seed=seed)
        done = [c for o in outputs for c in o.outputs]   # [B*G] prompt-major
        return Generated(
            prompt_ids=[list(o.prompt_token_ids) for o in outputs][:: n if sampling.temperature == 0 else 1],
            completion_ids=[list(c.token_ids) for c in done],
            truncated=[c.finish_reason == "length" for c in done],
            logprobs=[sampled_logprobs(c) for c in done] if logprobs else None,
        )

    def raw(self, prompts: list[list[int]] | list[str] | list[list[dict]], n: int, sampling: Sampling, *,
            logprobs: int | None = 0, seed: int | list[int] | None = None, chat: bool = False) -> list[Any]:
        """vLLM's RequestOutputs, n per prompt (for greedy: the prompt repeated n times, n = 1 each)."""
        from vllm import SamplingParams

        greedy = sampling.temperature == 0
        params = SamplingParams(
            n=1 if greedy else n, max_tokens=sampling.max_tokens, temperature=sampling.temperature,
            top_p=sampling.top_p, top_k=sampling.top_k or 0, min_p=sampling.min_p,
            repetition_penalty=sampling.repetition_penalty, stop=list(sampling.stop) or None,
            logprobs=logprobs, seed=seed if not isinstance(seed, list) else None,
        )
        inputs: list[Any] = list(prompts) if chat else [
            p if isinstance(p, str) else {"prompt_token_ids": list(p)} for p in prompts]
        if isinstance(seed, list):  # one SamplingParams per prompt, each with its own seed
            params = [params.clone() for _ in seed]
            for p, s in zip(params, seed, strict=True):
                p.seed = s
        if greedy:  # vLLM takes n = 1 only for greedy decoding: repeat the prompts instead
            inputs = [p for p in inputs for _ in range(n)]
            params = [p for p in params for _ in range(n)] if isinstance(params, list) else params
        if chat:
            return self.llm.chat(inputs, params, use_tqdm=False, lora_request=self.lora_request)
        return self.llm.generate(inputs, params, use_tqdm=False, lora_request=self.lora_request)

    def load_weights(self, named: Iterable[tuple[str, Any]], *, recompute_running: bool = False) -> int:
        """Reload weights in place from (checkpoint name, tensor) pairs; returns how many. Then the prefix
        cache is reset where no running request holds it (vLLM resets no cache that running requests hold:
        in flight with generation.inflight_kv_cache = "keep" it stays); with ``recompute_running`` the
        requests in flight keep their tokens and their KV cache is computed again by the new weights."""
        import logging

        # "RotaryEmbedding: Failed to load weights": it has no checkpoint tensors; expected.
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)
        counted = _Counting(named)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(counted)})
        self.llm.reset_prefix_cache(reset_running_requests=recompute_running)
        self.loaded_bytes = counted.bytes
        return counted.count

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def sleep(self, level: int) -> None:
        """vLLM's sleep (an engine started with ``sleep_mode``): 1 weights to host memory, 2 weights dropped;
        the KV cache is dropped at both."""
        self.llm.sleep(level=level)

    def wake_up(self, tags: list[str]) -> None:
        """Take the memory of ``tags`` ("weights", "kv_cache") back; generation needs both."""
        self.llm.wake_up(tags=tags)

    def close(self) -> None:
        import gc

        engine = getattr(self.llm, "llm_engine", None)
        core = getattr(engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del self.llm
        gc.collect()


class _Counting:
    """The tensors of a weight load, counted (``count``) and weighed (``bytes``) as vLLM takes them."""

    def __init__(self, named: Iterable[tuple[str, Any]]) -> None:
        self.named, self.count, self.bytes = named, 0, 0

    def __iter__(self) -> Iterator[tuple[str, Any]]:
        for item in self.named:
            self.count += 1
            self.bytes += item[1].numel() * item[1].element_size()
            yield item


class VllmColocateBackend(PromptEncoder):
    """GenerationBackend on an in-process engine; sync_weights reloads the weights in place.

    The engine runs on this process's device (``parallel.device``, else the policy's): on CUDA,
    one engine per training process on its own GPU, as TRL's colocate mode places them. ``dtype``
    is the policy's (model.dtype); the engine's is vllm.dtype, or that (bfloat16 for a float32
    policy on a GPU with bfloat16; see grpocli.generation.engine_options.engine_dtype). ``inflight``:
    the engine will generate in flight (`start_inflight`), so it steps synchronously.
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_prompt_length: int, max_completion_length: int,
                 vllm_section: VllmSection, dtype: str = "auto", seed: int = 0, parallel: Parallel | None = None,
                 inflight: bool = False) -> None:
        import torch

        v = vllm_section
        check_sleep_mode(v.sleep_mode, backend="vllm")  # before anything starts: a CPU's vLLM has no sleep mode
        # the session has applied train.torch_threads (or torch's default) to this process
        prepare_vllm_environment(kv_cache_gb=v.kv_cache_gb, in_process=True, threads=torch.get_num_threads())
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.parallel = parallel
        device = process_device(parallel.device if parallel else None, _param_device(model))
        cuda = torch.cuda.is_available()
        self.adapters = adapter_versions(model, v, inflight=inflight, parallel=parallel)
        extra = {**(inflight_engine_kwargs(cuda) if inflight else {}),
                 **(engine_lora_kwargs(model) if self.adapters else {})}
        tmp = copy_dir(model, parallel)
        try:
            write_engine_copy(model, tokenizer, tmp, parallel, adapters=self.adapters is None)
            self.engine = VllmEngine(
                tmp, dtype=engine_dtype(v.dtype, dtype, cuda=cuda, bf16=cuda and torch.cuda.is_bf16_supported()),
                max_model_len=v.max_model_len or max_prompt_length + max_completion_length,
                length_where="vllm.max_model_len" if v.max_model_len else
                "data.max_prompt_length + generation.max_completion_length",
                enforce_eager=v.enforce_eager, gpu_memory_utilization=v.gpu_memory_utilization, seed=seed,
                max_num_batched_tokens=v.max_num_batched_tokens, device=device, parallel=parallel or Parallel.alone(),
                sleep_mode=v.sleep_mode > 0,
                engine_kwargs=extra or None,
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # the engine holds the weights now
        self.checked = False
        self.last_sync: dict[str, float] = {}  # bytes and tensors of the last sync
        self.policy = model  # vllm.sleep_mode = 2: the weights sent again when the engine wakes
        self.sleep = EngineSleep(self.engine, v.sleep_mode, self.sync_weights)
        self.sleep.sleep()  # TRL: asleep until the first generation
        self.stepping: EngineThread | None = None  # generation.pipeline = "inflight": the thread that steps
        if self.adapters is not None:  # the engine holds the base weights: the adapters as they are now
            self._send(model, recompute_running=False)

    def start_inflight(self, version: int, *, kv_cache: str = "keep") -> EngineThread:
        """generation.pipeline = "inflight": a thread of this process steps the engine from now on
        (grpocli.generation.engine_thread); ``version``: the policy version the engine holds;
        ``kv_cache``: generation.inflight_kv_cache, what a sync does to the requests in flight."""
        import torch

        self.recompute_in_flight = kv_cache == "recompute"
        self.stepping = EngineThread(self.engine, load=self._load_in_flight, version=version,
                                     device=self.engine.device, threads=torch.get_num_threads())
        return self.stepping

    def generate(self, prompts: list[str], n: int, sampling: Sampling) -> Generated:
        return self.generate_ids(self.encode_prompts(prompts), n, sampling)

    def generate_ids(self, prompt_ids: list[list[int]], n: int, sampling: Sampling) -> Generated:
        """n completions of each prompt given as token ids (multi-turn rollouts continue from them);
        with vllm.sleep_mode the engine wakes for them and sleeps again after; while the in-flight
        thread steps the engine, through it (beside the groups in flight)."""
        if self.stepping is not None:
            return self.stepping.generate(prompt_ids, n, sampling)
        self.sleep.before_generation(self.policy)
        try:
            return self.engine.generate(prompt_ids, n, sampling)
        finally:
            self.sleep.sleep()

    def sync_weights(self, model: Any) -> None:
        if self.stepping is not None:  # the engine is the in-flight thread's: between two of its steps
            self.stepping.sync_weights(model, self.stepping.version)
        else:
            self._send(model, recompute_running=False)

    def _load_in_flight(self, model: Any) -> None:
        """The in-flight thread's weight load (it is parked): the requests in flight keep their KV cache, or
        have it computed again by the new weights (generation.inflight_kv_cache = "recompute")."""
        self._send(model, recompute_running=self.recompute_in_flight)

    def _send(self, model: Any, *, recompute_running: bool) -> None:
        self.policy = model
        if self.adapters is not None:  # vllm.lora_sync = "adapter": a new adapter version, no base weight
            self.last_sync = {"bytes": float(self.adapters.save(model)), "tensors": float(self.adapters.tensors)}
            self.engine.lora_request = self.adapters.request()
            return
        self.sleep.wake_weights()  # a sleeping engine's weights are mapped again before they are written
        with policy_weights(model, self.engine.dtype, self.parallel) as weights:
            if not self.checked:
                problems = spec_problems(self.engine.spec, weights.specs())
                if problems and self.engine.spec:
                    raise UserError(
                        "the policy's weights do not fit the vLLM engine's model:\n    " + "\n    ".join(problems),
                        where="generation.backend = \"vllm\"", valid="the architecture the engine was started with",
                        hint="report this as a bug in grpo (the engine starts from a copy of the policy)",
                    )
                self.checked = True
            count = self.engine.load_weights(weights, recompute_running=recompute_running)
            self.last_sync = {"bytes": float(self.engine.loaded_bytes), "tensors": float(count)}
        self.sleep.weights_sent()

    def metrics(self) -> dict[str, float]:
        """weight_sync/bytes and weight_sync/tensors of the last sync (adapters alone, or the whole model)."""
        return {f"weight_sync/{k}": v for k, v in self.last_sync.items()}

    def close(self) -> None:
        if self.adapters is not None:
            self.adapters.close()
        if self.stepping is not None:
            self.stepping.close()
            self.stepping = None
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()
            self.engine = None


def _param_device(model: Any) -> Any:
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return None


__all__ = ["VllmColocateBackend", "VllmEngine", "prepare_vllm_environment",
           "write_engine_copy"]
