"""A single-turn verifiers environment (the classic API: vf.SingleTurnEnv, a Rubric), as an
Environments Hub package would define it; loaded by id: data.dataset = "verifiers:vf_say_answer"."""

import verifiers as vf
from datasets import Dataset


def said_answer(completion, answer, **kwargs) -> float:
    """1 where the last model message holds the answer."""
    return float(answer in _last(completion))


def short(completion, **kwargs) -> float:
    """Shorter answers score higher (a reward that differs between the tiny model's completions)."""
    return 1.0 / (1.0 + len(_last(completion)))


def _last(completion) -> str:
    message = completion[-1]
    return str(message["content"] if isinstance(message, dict) else message.content)


def load_environment(num_samples: int = 8, **kwargs) -> vf.Environment:
    rows = [{"question": f"Say the number {i}.", "answer": str(i)} for i in range(num_samples)]
    rubric = vf.Rubric(funcs=[said_answer, short], weights=[1.0, 0.5])
    return vf.SingleTurnEnv(dataset=Dataset.from_list(rows), system_prompt="Answer with a number.", rubric=rubric)
