"""An OpenEnv environment (openenv-core's server-side Environment: reset/step/state, pydantic
Action and Observation), written as OpenEnv's own `openenv init` template writes one; named as
multi_turn.environment = "openenv:openenv_counter:CounterEnvironment"."""

from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

PROMPT = " Board ready, say something."


class CounterAction(Action):
    message: str = Field(..., description="What the model said")


class CounterObservation(Observation):
    text: str = Field(default="", description="What the environment shows the model")
    length: int = Field(default=0)


class CounterEnvironment(Environment):
    """Counts the model's characters; each step rewards a short message; ends after `steps` steps."""

    def __init__(self, steps: int = 2):
        super().__init__()
        self.steps = steps
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> CounterObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return CounterObservation(text=PROMPT, done=False, reward=0.0)

    def step(self, action: CounterAction, timeout_s=None, **kwargs) -> CounterObservation:
        self._state.step_count += 1
        n = len(action.message)
        done = self._state.step_count >= self.steps
        return CounterObservation(text=f"You said {n} characters (step {self._state.step_count}).", length=n,
                                  done=done, reward=1.0 / (1.0 + n))

    @property
    def state(self) -> State:
        return self._state
