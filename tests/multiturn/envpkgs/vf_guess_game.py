"""A multi-turn verifiers environment (vf.MultiTurnEnv with env_response and a @vf.stop condition),
loaded by id: multi_turn.environment = "verifiers:vf_guess_game"."""

import verifiers as vf
from datasets import Dataset

HINT = "Not yet. Guess again:"


class GuessGame(vf.MultiTurnEnv):
    """The model guesses a word; each wrong guess gets a hint, a right one ends the game."""

    async def setup_state(self, state):
        state["guesses"] = 0
        return state

    async def env_response(self, messages, state, **kwargs):
        state["guesses"] += 1
        return [{"role": "user", "content": f"{HINT} ({state['guesses']})"}]

    @vf.stop
    async def guessed(self, state) -> bool:
        steps = state["trajectory"]
        return bool(steps) and state["answer"] in str(steps[-1]["completion"][-1].content)


def won(completion, answer, **kwargs) -> float:
    return float(any(answer in str(m.content) for m in completion if m.role == "assistant"))


def turns(state, **kwargs) -> float:
    """How many model turns the game took."""
    return float(len(state["trajectory"]))


def load_environment(num_samples: int = 8, max_turns: int = 3, **kwargs) -> vf.Environment:
    rows = [{"question": "Guess my secret word.", "answer": f"word{i}"} for i in range(num_samples)]
    rubric = vf.Rubric(funcs=[won, turns], weights=[1.0, 0.0])
    return GuessGame(dataset=Dataset.from_list(rows), rubric=rubric, max_turns=max_turns)
