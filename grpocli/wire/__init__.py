"""Every HTTP protocol grpo speaks with its own servers, declared once and used by both ends.

For each server: the protocol version, the paths, the API key's environment variable, the pydantic
models of the requests (the server's routes take them) and of the answers (the trainer's clients
check what they read against them); and the one HTTP client those clients call through. Only
pydantic, httpx, the standard library and grpocli.errors are imported here: the trainer's side
needs no server package (fastapi, uvicorn).

client.py      the HTTP client (httpx): base URL, API key, a deadline for the whole answer; Refused,
               Unavailable and BadAnswer, which each client words with its own hints
reference.py   `grpo ref-serve`'s: reference log-probs, weights mixed in bucket by bucket, downloads
rewards.py     `grpo reward-serve`'s: a batch scored by a served reward, its scores and logs
vllm_api.py    vLLM's server (`grpo vllm-serve` runs stock `vllm serve`; vLLM declares the protocol): the
               requests grpo sends, the parts of answers it reads
"""
