"""Generation: the GenerationBackend protocol and its backends. Only this package (and server/) imports vllm.

    base.py            the GenerationBackend protocol, Sampling and Generated; prompts encoded once
    backends.py        `generation.backend` -> the backend: one table, for training and `grpo eval`
    hf.py              transformers' `generate` on the training model itself
    paged.py           transformers' continuous batching (generation.backend = "paged")
    vllm_colocate.py   a vLLM engine in this process (generation.backend = "vllm")
    vllm_install.py    vLLM's import (or how to install it) and the head sizes its CPU attention runs
    engine_context.py  a model's context length as vLLM reads it (YaRN included): config.json only, no torch
    positions.py       the longest sequence a model's positions hold, from its config; prompt + completion checked
                       before a model loads (grpo train's preflight, grpo eval)
    engine_options.py  the arguments of ``vllm.LLM`` per device: pure functions
    engine_copy.py     the policy saved for a colocated engine to start from
    engine_sleep.py    the colocated engine's sleep mode (vllm.sleep_mode)
    inflight.py        the InflightBackend protocol: groups generated while the trainer trains, weights synced
                       between engine steps, every token's policy version (generation.pipeline = "inflight")
    engine_thread.py   the colocated engine generating in flight: one thread owns its steps
    vllm_client.py     generation.backend = "vllm-server": vLLM servers (`grpo vllm-serve`), sent new weights
    server_client.py   the calls to one vLLM server (its OpenAI API and RL API), failures worded
    server_inflight.py the in-flight pipeline on stock vLLM servers: pause with requests kept, weights, resume
    gloo_transfer.py   the "grpo_gloo" weight-transfer engine: a vLLM plugin, so stock vLLM on a CPU takes weights
    fleet.py           several vLLM servers as one
    weights.py         weights on their way to an engine: names, spec, buckets, wire formats
    lora.py            LoRA adapters added to their base weights out of place, for a weight sync
    lora_adapter.py    vllm.lora_sync = "adapter": the adapters alone each sync, applied by vLLM (LoRARequest)
    devices.py         which CUDA device a process or thread works on
"""
