"""What every grpo server shares (`grpo vllm-serve`, `grpo ref-serve`, `grpo reward-serve`), below them all.

access.py   who may call (the API key check), what a caller hears back (ServerError, errors as JSON),
            the loopback addresses, the port check before anything loads
"""
