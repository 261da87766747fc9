"""Every HTTP protocol grpo speaks with its own servers, declared once and used by both ends.

For each server: the protocol version, the paths, the API key's environment variable, the pydantic
models of the requests (the server's routes take them) and of the answers (the trainer's clients
check what they read against them); and the one HTTP client those clients call through. Only
pydantic, httpx, the standard library and grpocli.errors are imported here: the trainer's side
needs no server package (fastapi, uvicorn).

client.py      the HTTP client (httpx): base URL, API key, a deadline for the whole answer; Refused,
               Unavailable and BadAnswer, which each client words with its own hints
generation.py  `grpo vllm-serve`'s own protocol: generate, weight updates (buckets, broadcasts, groups),
               the checks every body gets (finite numbers, valid text, vLLM's seed range)
reference.py   `grpo ref-serve`'s: reference log-probs, weights mixed in bucket by bucket, downloads
rewards.py     `grpo reward-serve`'s: a batch scored by a served reward, its scores and logs
vllm_api.py    stock vLLM's server (vLLM declares it): the requests grpo sends, the parts of answers it reads

TRL's paths, which `grpo vllm-serve` also answers (vLLM's and TRL's protocol, not grpo's), keep their
bodies in grpocli/server/trl.py, server/completions.py and server/transfer.py: no grpo client speaks them.
"""
