"""Multi-turn rollouts: tools, environments and the turn loop (grpocli.multiturn.turns).

    toolbox.py                a recipe's tools and environment, resolved; function -> JSON schema
    parsers.py                TOOL_CALL_PARSERS: the model's text -> tool calls, one entry per format
    execution.py              a turn's tool calls, run concurrently with a per-call timeout
    environment_calls.py      an environment's own methods (constructor, reset, respond), each bounded in time
    template.py               prompts rendered with tools; a tool turn's tokens from the chat template
    turns.py                  the turn loop: every live rollout generates at once, tools run, tokens spliced
    builtin.py                the calculator tool, the guess-the-number environment and its dataset
    feedback.py               arithmetic_feedback: an environment that answers the model's text turns
    environment_packages.py   environments from other libraries, by prefix (verifiers:, openenv:)
    verifiers_rollouts.py     a verifiers environment driven by the turn loop
    openenv_env.py            an OpenEnv environment driven by the turn loop
"""
