"""The math environment: one episode on one problem (the `envs.Environment` protocol).

In the Flex-POMDP (paper Sec. "Flex-POMDP") the state is the problem plus the feedback so far; a joint action is
one response per agent (role -> text). Each step:

* every graded role's response is graded against the gold answer (`Grader`; e.g. only the final solver of a
  planner -> solver chain); team reward R_t = mean over graded roles of 1.0 (correct) or 0.0 (otherwise);
* per-role reward terms (`ROLE_REWARD_TERMS`, weighted in an agent's profile) score each agent's own response,
  graded or not, apart in info["role_rewards"]: the trainer adds them to that agent's placed team reward only;
* the episode ends when every graded answer is correct or after `horizon` steps; otherwise the next
  observation is the problem and feedback on the answers ("Your previous answer 12 was incorrect. Try again.").
"""
from __future__ import annotations

from .grader import CORRECT, UNGRADED, UNPARSEABLE, Grader
from .problems import Problem, extract_boxed


# Per-role reward terms: (response, outcome of its own \boxed{} answer or None) → value. Only
# `correct` needs the outcome; the environment grades a role's answer only when a term needs it.
has_boxed_answer = lambda response: bool((extract_boxed(response) or "").strip())
ROLE_REWARD_TERMS = {
    "boxed": lambda response, outcome: float(has_boxed_answer(response)),  # gave a \boxed{} answer
    "no_boxed": lambda response, outcome: 1.0 - has_boxed_answer(response),  # gave none (e.g. a planner)
    "correct": lambda response, outcome: float(outcome == CORRECT),  # its own answer is right
}


def answer_feedback(subject: str, outcome: str, response: str) -> str:
    """One feedback sentence about one answer; `subject` is "Your" or e.g. "solver's"."""
    answer = extract_boxed(response)
    if outcome == CORRECT:
        return f"{subject} previous answer {answer} was correct."
    if answer is None or not answer.strip():
        return f"{subject} previous answer had no \\boxed{{}} answer."
    if outcome == UNPARSEABLE:
        return f"{subject} previous answer {answer} could not be read as a math expression."
    if outcome == UNGRADED:
        return f"{subject} previous answer {answer} could not be checked."
    return f"{subject} previous answer {answer} was incorrect."


def feedback_observation(problem_text: str, outcomes: dict[str, str], responses: dict[str, str]) -> str:
    """The problem followed by feedback on each graded answer and "Try again."."""
    if len(outcomes) == 1:
        (role, outcome), = outcomes.items()
        lines = [answer_feedback("Your", outcome, responses[role])]
    else:
        lines = [answer_feedback(f"The {role}'s", outcome, responses[role]) for role, outcome in outcomes.items()]
    return problem_text + "\n\n" + " ".join(lines) + " Try again."


def check_step_call(env, joint_action: dict[str, str]) -> None:
    """The protocol's preconditions of step(): reset() first, not past the end, every graded role acted."""
    if env.steps_taken is None:
        raise ValueError("call reset() before step()")
    if env.done:
        raise ValueError("step() called after the episode ended; call reset() to start again")
    missing = [role for role in env.graded_roles if role not in joint_action]
    if missing:
        raise ValueError(f"joint_action has no response for graded role(s) {missing}; it has {sorted(joint_action)}")


class MathEnv:
    """One episode of answering `problem`, graded on the responses of `graded_roles`; `role_rewards`: role →
    ((term, weight), ...), the per-role terms of the agents' profiles. reset() gives the problem text; step()'s
    info: "outcomes", "correct", "answers" (envs/__init__.py), "role_rewards" ({role: Σ weight · term} of the
    roles of `role_rewards` that acted), "step" (0 for the first) and "level" (a task's metrics may group by it)."""

    def __init__(self, problem: Problem, grader: Grader, graded_roles: list[str], horizon: int = 1,
                 role_rewards: dict[str, tuple[tuple[str, float], ...]] | None = None):
        if not graded_roles:
            raise ValueError("graded_roles is empty: name at least one role whose answer is graded")
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.problem, self.grader, self.graded_roles, self.horizon = problem, grader, list(graded_roles), horizon
        self.role_rewards = {role: terms for role, terms in (role_rewards or {}).items() if terms}
        unknown = sorted({name for terms in self.role_rewards.values() for name, _ in terms} - set(ROLE_REWARD_TERMS))
        if unknown:
            raise ValueError(f"unknown reward terms {unknown}; the terms are {sorted(ROLE_REWARD_TERMS)}")
        self.steps_taken: int | None = None  # None until reset()
        self.done = False

    def reset(self, seed: int | None = None) -> str:
        """Start the episode; `seed` is accepted for the protocol but nothing is random."""
        self.steps_taken, self.done = 0, False
        return self.problem.problem

    def step(self, joint_action: dict[str, str]) -> tuple[str, float, bool, dict]:
        check_step_call(self, joint_action)
        responses = [joint_action[role] for role in self.graded_roles]
        grades = self.grader.grade_many([self.problem.answer] * len(responses), responses)
        outcomes = dict(zip(self.graded_roles, grades))
        step_index, self.steps_taken = self.steps_taken, self.steps_taken + 1
        all_correct = all(outcome == CORRECT for outcome in grades)
        self.done = all_correct or self.steps_taken >= self.horizon
        reward = sum(outcome == CORRECT for outcome in grades) / len(grades)  # R_t: the graded answers' mean correctness
        observation = (self.problem.problem if self.done  # no next turn: the bare problem
                       else feedback_observation(self.problem.problem, outcomes, joint_action))
        # What each graded role answered, as the grader read it (its last \boxed{}), for a majority
        # vote over samples (rollout.maj_at_k); None where the answer was not judged right or wrong.
        answers = {role: extract_boxed(joint_action[role]) if outcome not in (UNPARSEABLE, UNGRADED) else None
                   for role, outcome in outcomes.items()}
        info = {"outcomes": outcomes, "correct": all_correct, "step": step_index, "level": self.problem.level,
                "answers": answers, "role_rewards": self.role_reward_terms(joint_action, outcomes)}
        return observation, reward, self.done, info

    def role_reward_terms(self, joint_action: dict[str, str], outcomes: dict[str, str]) -> dict[str, float]:
        """Σ weight · term of each role with terms that acted this step, on its own response."""
        acted = {role: terms for role, terms in self.role_rewards.items() if role in joint_action}
        to_grade = [r for r, terms in acted.items() if r not in outcomes and any(name == "correct" for name, _ in terms)]
        own = dict(outcomes)
        if to_grade:
            responses = [joint_action[r] for r in to_grade]
            own.update(zip(to_grade, self.grader.grade_many([self.problem.answer] * len(to_grade), responses)))
        return {role: sum(w * ROLE_REWARD_TERMS[name](joint_action[role], own.get(role)) for name, w in terms)
                for role, terms in acted.items()}
