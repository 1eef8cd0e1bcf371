"""Environments: where the agents' joint actions are scored.

The protocol is gymnasium-like, with text observations and text actions:

    observation = env.reset(seed)
    observation, reward, done, info = env.step(joint_action)

* `reset(seed) -> str | dict`: start an episode; returns the first observation, one text every agent reads or
  role → that agent's own o^j (the critic then reads them all, each tagged by its role). `step` may do the same.
* `step(joint_action) -> (str, float, bool, dict)`: `joint_action` maps each agent's role name to its response
  text for this step. The environment returns the next observation (e.g. the problem plus feedback), the team
  reward R(s_t, a_t), whether the episode ended, and an info dict. The trainer reads `correct` (the episode is
  solved) and `outcomes` (each graded role's answer: "correct", "wrong", "unparseable" or "ungraded"), and where
  present `role_rewards` (role → its per-role reward terms), `program_outcomes` (code) and `answers` (each graded
  role's answer as graded, None where not judged: the held-out maj@k compares them; MathEnv gives it, CodeEnv
  does not); the rest is the environment's own (a task's metrics function reads it, tasks.py).

The task picks the environment (tasks.py: `Task.make_env`): math's `MathEnv`, code's `CodeEnv`, or its own.

Contents: `problems` (`Problem`, `extract_boxed`, math rows, the generated arithmetic task), `data` (`load_problems`),
`grader` (`Grader`: math-verify in a worker process), `math_env`, `code_problems` (generated, HumanEval, MBPP),
`word_problems` (the tool task's data), `code_env`, `sandbox` (`run_tests`: a program and its tests in an
isolated, limited child process). This package imports nothing else from the project.
"""
from typing import Protocol, runtime_checkable

from .code_env import CodeEnv, extract_program
from .code_problems import load_humaneval, make_code_problems
from .grader import Grader
from .math_env import ROLE_REWARD_TERMS, MathEnv
from .data import load_problems
from .problems import DEFAULT_ARITHMETIC_LEVELS, Problem, extract_boxed, make_arithmetic_problems


@runtime_checkable
class Environment(Protocol):
    """What a trainer needs from an environment (see the module docstring)."""
    def reset(self, seed: int | None = None) -> str: ...

    def step(self, joint_action: dict[str, str]) -> tuple[str, float, bool, dict]: ...


__all__ = ["Environment", "Grader", "MathEnv", "CodeEnv", "extract_program", "make_code_problems", "load_humaneval",
           "ROLE_REWARD_TERMS", "Problem", "extract_boxed", "load_problems", "make_arithmetic_problems",
           "DEFAULT_ARITHMETIC_LEVELS"]
