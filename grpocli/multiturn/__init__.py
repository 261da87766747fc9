"""Multi-turn rollouts: tools, environments and the turn loop (grpocli.multiturn.turns).

    toolbox.py     a recipe's tools and environment, resolved; function -> JSON schema
    parsers.py     TOOL_CALL_PARSERS: the model's text -> tool calls, one entry per format
    execution.py   a turn's tool calls, run concurrently with a per-call timeout
    template.py    prompts rendered with tools; a tool turn's tokens from the chat template
    turns.py       the turn loop: every live rollout generates at once, tools run, tokens spliced
    builtin.py     the calculator tool, the guess-the-number environment and its dataset
"""
