"""`grpo import trl`: the [[rewards]] entries from a config's reward_funcs (TRL's `trl grpo` registry names,
open-r1's names, module.function paths, a reward model) and reward_weights."""

from __future__ import annotations

from typing import Any

from grpocli.recipe.openr1_names import OPENR1_REWARDS, openr1_reward

REWARD_FIELDS = ("reward_funcs", "reward_weights", "reward_model_name_or_path")
#: trl grpo's reward_funcs registry names -> their functions in trl.rewards.
TRL_REWARDS = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward")
#: trl grpo's registry entry that is a factory's product: get_soft_overlong_punishment(1280, 256).
TRL_FACTORY_REWARDS = {"get_soft_overlong_punishment": "max_completion_len=1280, soft_punish_cache=256"}


def rewards(b: Any, f: dict[str, Any]) -> None:
    """[[rewards]] from reward_model_name_or_path and reward_funcs (trl grpo's order), with reward_weights."""
    given = ([f["reward_model_name_or_path"]] if f.get("reward_model_name_or_path") else []) + list(
        f.get("reward_funcs") or [])
    weights = f.get("reward_weights")
    if weights and len(weights) != len(given):
        b.say("reward_weights", "unsupported", f"{len(weights)} weights for {len(given)} rewards: set weight on "
              "each [[rewards]] entry")
        weights = None
    entries = []
    for i, n in enumerate(given):
        if n in TRL_FACTORY_REWARDS:
            b.say("reward_funcs", "unsupported", f"{n!r} is trl grpo's {n}({TRL_FACTORY_REWARDS[n]}), a function "
                  "that builds the reward: write a module with `reward = " + f"{n}({TRL_FACTORY_REWARDS[n]})` and "
                  "name it in [[rewards]] name = \"module:reward\"")
            continue
        if n in OPENR1_REWARDS:
            entry, what = openr1_reward(n, f)
            entries.append({**entry, **({"weight": weights[i]} if weights else {})})
            b.say("reward_funcs", "converted", f"open-r1's {n!r}: {entry['name']} ({what})")
            continue
        name = n if ":" in n else ("trl.rewards:" + n) if n in TRL_REWARDS else ":".join(n.rsplit(".", 1)) if (
            "." in n and (i or not f.get("reward_model_name_or_path"))) else n
        entries.append({"name": name, **({"weight": weights[i]} if weights else {})})
    if entries:
        b.keys["rewards"] = entries
        b.say("reward_funcs", "mapped", "[[rewards]] " + "; ".join(
            f"name = {e['name']!r}" + (f", weight = {e['weight']}" if "weight" in e else "") for e in entries))
    else:
        b.say("reward_funcs", "unsupported", "the config names no reward function: add [[rewards]] name = "
              "\"module:function\" (or \"file.py:function\") to the recipe")
