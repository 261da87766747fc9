"""`grpo vllm-serve`: a FastAPI + uvicorn generation server around one vLLM engine, with weight updates.

It speaks grpo's own protocol (grpocli/wire/generation.py: paths, version, request and answer models)
and TRL's (the paths of vLLM's server, whose bodies live here: no grpo client speaks them). What
every grpo server shares (the API key, errors as JSON, the port check) is grpocli.serving's;
`grpo reward-serve` is grpocli.reward_server, `grpo ref-serve` grpocli.reference.

host.py      the engine on its worker's thread: jobs, health, the weights' version and completeness
update.py    one weight update in flight: checked buckets on a queue, each tensor at most once
group.py     the gloo/NCCL group grpo's client broadcasts buckets over
inflight.py  a request's engine job: waited for on the event loop, called off (vLLM's abort) when its client goes
worker.py    one thread that runs the engine's jobs in order (deadlines, stuck, health; ref-serve's too)
app.py       the routes of grpo's protocol; run_server()
stopping.py  shutting the server down in bounded time, even with a stuck engine
trl.py       the paths TRL's VLLMClient uses (vLLM's server's), answered by the same engine
completions.py  their OpenAI-style bodies -> vLLM SamplingParams, vLLM's outputs -> choices and log-probs
chat.py      chat templates: request templates only when trusted, rendered off the engine thread in bounded time
transfer.py  TRL's weight sync (vLLM's weight-transfer-engine paths): sessions, packed broadcasts, checks
peer.py      this server's end of the trainer's group (NCCL or gloo): joining it, receiving broadcasts
flags.py     `trl vllm-serve`'s flags as grpo vllm-serve takes them: to the engine, or refused before vLLM loads
"""
