"""A task of your own, in one file: unit conversion ("How many centimetres are in 3.5 metres?").

    python marft.py --task examples/units.py          (README: Adding a task)

A task (tasks.py): its problems (`load`; here six units × 40 whole amounts, a quarter of the amounts
held out in every unit), the environment of one episode (`make_env`; reward 1 when the graded
agent's \\boxed{} number is the right amount), and optionally its organisations and metrics.
"""
import random

from envs import Problem, extract_boxed
from tasks import Task

UNITS = [("metre", "metres", "centimetres", 100), ("kilometre", "kilometres", "metres", 1000), ("foot", "feet", "inches", 12),
         ("kilogram", "kilograms", "grams", 1000), ("hour", "hours", "minutes", 60), ("day", "days", "hours", 24)]
AMOUNTS = range(2, 42)


def conversion(one: str, many: str, small: str, factor: int, amount: int) -> Problem:
    return Problem(problem=f"How many {small} are in {amount} {many}? One {one} is {factor} {small}.",
                   answer=str(amount * factor), level=f"{many} to {small}", type="units")


def load(cfg) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out): the amounts are shuffled with --seed and the first quarter held out."""
    amounts = random.Random(f"units-{cfg.seed}").sample(AMOUNTS, len(AMOUNTS))
    held_out = amounts[: len(amounts) // 4]
    problems = lambda chosen: [conversion(*unit, amount) for amount in chosen for unit in UNITS]
    return problems(amounts[len(held_out):]), problems(held_out)


def read_number(answer: str | None) -> float | None:
    try:  # "1,500" reads as 1500; no \boxed{} answer (None), or not a number: None
        return float(answer.replace(",", ""))
    except (AttributeError, ValueError):
        return None


class UnitsEnv:
    """One episode on one problem (the envs.Environment protocol): each step the graded agents'
    \\boxed{} numbers are checked; a wrong answer is told so and tried again, up to --horizon steps."""

    def __init__(self, problem: Problem, graded_roles: tuple[str, ...], horizon: int):
        self.problem, self.graded_roles, self.horizon = problem, graded_roles, horizon

    def reset(self, seed: int | None = None) -> str:
        self.steps = 0
        return self.problem.problem

    def step(self, joint_action: dict[str, str]) -> tuple[str, float, bool, dict]:
        gold, answers = float(self.problem.answer), {r: read_number(extract_boxed(joint_action[r])) for r in self.graded_roles}
        outcomes = {role: "unparseable" if a is None else "correct" if abs(a - gold) < 1e-6 else "wrong"
                    for role, a in answers.items()}
        correct, self.steps = all(o == "correct" for o in outcomes.values()), self.steps + 1
        done = correct or self.steps >= self.horizon
        reward = sum(o == "correct" for o in outcomes.values()) / len(outcomes)
        errors = [min(abs(a - gold) / gold, 1.0) for a in answers.values() if a is not None]
        observation = self.problem.problem + ("" if done else "\n\nYour previous answer was wrong. Try again.")
        return observation, reward, done, {"correct": correct, "outcomes": outcomes, "relative_errors": errors}


def make_env(problem: Problem, cfg, context) -> UnitsEnv:  # context: tasks.EpisodeContext
    return UnitsEnv(problem, context.graded_roles, cfg.horizon)


def metrics(infos: list[dict]) -> dict[str, float]:
    """relative_error: mean |answer − gold| / gold (at most 1) of the numeric answers, every step."""
    errors = [error for info in infos for error in info["relative_errors"]]
    return {"relative_error": sum(errors) / len(errors)} if errors else {}


CONVERTER = {  # the profile file's format (README: Adding an organisation); the example is no problem of the task
    "agents": [{"role": "converter", "graded": True,
                "system_prompt": "You convert units. Multiply the amount by the number of small units in one big "
                                 "unit, and end with the result as \\boxed{N}.",
                "examples": [{"user": "Problem: How many millimetres are in 3 centimetres? One centimetre is 10 millimetres.",
                              "assistant": "3 × 10 = 30. \\boxed{30}"}]}],
    "dependencies": []}

task = Task(name="units", load=load, make_env=make_env, organisations={"converter": CONVERTER}, metrics=metrics)
