"""`grpo vllm-serve` (and, in rewards.py, `grpo reward-serve`): a FastAPI + uvicorn generation server around one vLLM engine, with weight updates.

protocol.py  grpo's own protocol (version PROTOCOL_VERSION): its paths and the pydantic request bodies
host.py      the engine on its worker's thread: jobs, health, the weights' version and completeness
update.py    one weight update in flight: checked buckets on a queue, each tensor at most once
group.py     the gloo/NCCL group grpo's client broadcasts buckets over
inflight.py  a request's engine job: waited for on the event loop, called off (vLLM's abort) when its client goes
worker.py    one thread that runs the engine's jobs in order (deadlines, stuck, health; ref-serve's too); ServerError
app.py       the routes of that protocol, the API key, errors as 4xx with a reason; run_server()
stopping.py  shutting the server down in bounded time, even with a stuck engine
trl.py       the paths TRL's VLLMClient uses (vLLM's server's), answered by the same engine
completions.py  their OpenAI-style bodies -> vLLM SamplingParams, vLLM's outputs -> choices and log-probs
chat.py      chat templates: request templates only when trusted, rendered off the engine thread in bounded time
transfer.py  TRL's weight sync (vLLM's weight-transfer-engine paths): sessions, packed broadcasts, checks
peer.py      this server's end of the trainer's group (NCCL or gloo): joining it, receiving broadcasts
flags.py     `trl vllm-serve`'s flags, read as grpo vllm-serve's
access.py    who may call a server and what it hears back: the API key, errors as JSON, the port check
rewards.py   `grpo reward-serve`: rewards scored over HTTP for [[rewards]] entries with url
"""
