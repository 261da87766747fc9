"""`grpo reward-serve`: rewards on a server of their own, for [[rewards]] entries with ``url`` (no torch, no vLLM).

The protocol (paths, ScoreRequest, ScoreAnswer) is grpocli/wire/rewards.py's; the trainer's side is
grpocli.rewards.remote. What every grpo server shares (the API key, errors as JSON) is grpocli.serving's.

app.py     the routes, the rewards named on the command line, the socket bound before they load; run_server()
calls.py   the reward calls the routes queue, run in the main thread in order; one batch's scoring and its answer
fixed.py   each served reward's args, fixed by the operator (--args, --allow): a request may only repeat them
"""
