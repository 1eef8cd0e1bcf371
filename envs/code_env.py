"""The code environment: one episode of writing a program that must pass a problem's unit tests.

The Flex-POMDP of the math task (envs/math_env.py) graded by the sandbox (envs/sandbox.py). Each step:

* every graded role's program is the last fenced python block of its response (`extract_program`),
  run after the problem's `prelude` if it has one; none: outcome "no_program", reward 0;
* a program's reward is the fraction of tests passed; the team reward R_t is the mean over graded roles;
* the episode ends when every graded program passed, or after `horizon` steps; otherwise the next
  observation is the task and feedback on each failed program (its first failing test and error, the
  syntax error, timeout, crash or missing block): with --horizon 2 a team sees why and tries again.

`info["outcomes"]` speaks the protocol (envs/__init__.py): "correct" (every test passed), "wrong" or
"unparseable" (no program); `info["program_outcomes"]` the sandbox's finer outcome of each graded role.
Per-role reward terms of profiles are math terms (`\\boxed{}`): a code task refuses them.
"""
from __future__ import annotations

from .math_env import check_step_call
from .problems import Problem
from .sandbox import NO_PROGRAM, PASSED, SYNTAX_ERROR, TIMEOUT, Limits, TestReport, run_tests

PYTHON_FENCES = ("", "python", "python3", "py")  # the languages a block may name to count as the program


def extract_program(response: str) -> str | None:
    """The last fenced python block of a response (```python, ```py or a bare ```), or None when it
    has none with code in it. Fences are read line by line, so a block in another language
    (```bash) is skipped whole; a block left open by the token limit runs to the end."""
    blocks, lines, language = [], None, ""
    for line in response.splitlines(keepends=True):
        fence = line.strip()
        if fence.startswith("```"):
            if lines is None:  # an opening fence: its language follows the backticks
                lines, language = [], fence[3:].strip().lower()
            else:
                blocks.append((language, "".join(lines)))
                lines = None
        elif lines is not None:
            lines.append(line)
    if lines is not None:
        blocks.append((language, "".join(lines)))
    programs = [text for language, text in blocks if language in PYTHON_FENCES and text.strip()]
    return programs[-1] if programs else None


def program_feedback(subject: str, report: TestReport | None, tests: tuple[str, ...]) -> str:
    """One paragraph on a program that did not pass: what went wrong, with the first failing test."""
    if report is None:
        return f"{subject} previous answer had no ```python block."
    if report.outcome == SYNTAX_ERROR:
        return f"{subject} previous program has a syntax error: {report.detail}"
    failing = report.first_failure
    if failing is None or report.tests[failing] == "not_run":
        where = "before the tests" if failing in (None, 0) else f"during test {failing}"
        what = "ran out of time" if report.outcome == TIMEOUT else f"stopped {where}: {report.detail}"
        return f"{subject} previous program {what}."
    test = tests[failing] if len(tests[failing]) <= 300 else tests[failing][:300] + " …"
    result = {"timeout": "ran out of time", "failed": "failed", "error": "raised an error"}[report.tests[failing]]
    return f"{subject} previous program failed this test ({result}: {report.detail}):\n{test}"


class CodeEnv:
    """One episode of writing a program for `problem`, graded on the responses of `graded_roles`.
    step(joint_action) -> (observation, reward, done, info), info = {"outcomes", "correct", "step",
    "program_outcomes": {role: passed | failed | syntax_error | timeout | crash | no_program}}."""

    def __init__(self, problem: Problem, graded_roles: list[str], horizon: int = 1, limits: Limits = Limits(),
                 role_rewards: dict | None = None):
        if not problem.tests:
            raise ValueError("the problem has no tests: a code task needs at least one")
        if not graded_roles:
            raise ValueError("graded_roles is empty: name at least one role whose program is graded")
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        if any(terms for terms in (role_rewards or {}).values()):
            raise ValueError("per-role reward terms (profile 'rewards') score \\boxed{} answers: a code task takes none")
        self.problem, self.graded_roles, self.horizon, self.limits = problem, list(graded_roles), horizon, limits
        self.steps_taken: int | None = None
        self.done = False

    def reset(self, seed: int | None = None) -> str:
        self.steps_taken, self.done = 0, False
        return self.problem.problem

    def step(self, joint_action: dict[str, str]) -> tuple[str, float, bool, dict]:
        check_step_call(self, joint_action)
        reports: dict[str, TestReport | None] = {}
        for role in self.graded_roles:
            program = extract_program(joint_action[role])  # run after the problem's prelude (HumanEval's imports)
            reports[role] = None if program is None else run_tests(program, list(self.problem.tests), self.limits,
                                                                   prelude=self.problem.prelude)
        scores = [0.0 if r is None else r.passed_fraction for r in reports.values()]  # fraction of tests passed
        step_index, self.steps_taken = self.steps_taken, self.steps_taken + 1
        all_passed = all(r is not None and r.outcome == PASSED for r in reports.values())
        self.done = all_passed or self.steps_taken >= self.horizon
        observation = self.problem.problem
        if not self.done:
            subjects = {role: "Your" if len(reports) == 1 else f"The {role}'s" for role in reports}
            feedback = [program_feedback(subjects[role], report, self.problem.tests)
                        for role, report in reports.items() if report is None or report.outcome != PASSED]
            observation += "\n\n" + "\n".join(feedback) + "\nWrite the corrected program."
        info = {"outcomes": {role: "unparseable" if r is None else "correct" if r.outcome == PASSED else "wrong"
                             for role, r in reports.items()},
                "program_outcomes": {role: NO_PROGRAM if r is None else r.outcome for role, r in reports.items()},
                "correct": all_passed, "step": step_index}
        return observation, sum(scores) / len(scores), self.done, info
