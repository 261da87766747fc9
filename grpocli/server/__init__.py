"""`grpo vllm-serve`: stock `vllm serve`, started the way grpo's trainer needs it, plus one middleware.

command.py  TRL's flags -> the `vllm serve` command line (the RL API, a weight-transfer engine, processed
            log-probs, the middleware); refused flag values, before vLLM is imported
guard.py    the ASGI middleware vLLM loads (--middleware): the API key on the RL API too, a bound on
            request bodies, /health that says whether the weights are one complete version

The weight-transfer engine for machines without a GPU is grpocli.generation.gloo_transfer (a vLLM
plugin). `grpo reward-serve` is grpocli.reward_server, `grpo ref-serve` grpocli.reference.
"""
