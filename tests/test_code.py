"""The code task: program extraction, the code environment's rewards and feedback, the generated
task's split, HumanEval from its package, MBPP rows, the code organisations, and a whole training
run of a tiny model on it (envs/code_env.py, envs/code_problems.py)."""
import json
import re

import pytest

import config as config_lib
import generation
import marft
import run as run_lib
from envs import CodeEnv, Problem, extract_program, load_humaneval, load_problems, make_code_problems
from envs.code_problems import CODE_TEST_FRACTION
from envs import sandbox
from envs.sandbox import run_tests
from flex_pomdp import CODE_ORGANISATIONS, load_organisation
from scripted import ScriptedBackend, scripted_actions

ADD_3 = Problem("Write `add_3(x)`.", "", "add", "code",
                tests=("assert add_3(0) == 3", "assert add_3(1) == 4", "assert add_3(-3) == 0", "assert add_3(10) == 13"))


@pytest.mark.parametrize("response, program", [
    ("Here it is:\n```python\ndef f(x):\n    return x\n```\nDone.", "def f(x):\n    return x\n"),
    ("```py\nA = 1\n```\nthen\n```python\nB = 2\n```", "B = 2\n"),  # the last block wins
    ("```\nC = 3\n```", "C = 3\n"),  # a bare fence
    ("```python\ndef f(x):\n    return x", "def f(x):\n    return x"),  # cut by the token limit: up to the end
    ("```python\ndef f(x):\n    return x\n```\n```bash\npython f.py\n```\nThat's all.", "def f(x):\n    return x\n"),  # not bash
    ("def f(x): return x", None),  # no block
    ("```python\n\n```", None),  # a blank block
])
def test_the_program_is_the_last_fenced_python_block(response, program):
    assert extract_program(response) == program


def test_the_reward_is_the_fraction_of_tests_passed():
    half = "```python\ndef add_3(x):\n    return x + 3 if x > 0 else 0\n```"  # passes 1, -3 and 10, fails 0
    env = CodeEnv(ADD_3, ["coder"])
    env.reset()
    _, reward, done, info = env.step({"coder": half})
    assert (reward, done) == (0.75, True)
    assert info["outcomes"] == {"coder": "wrong"} and info["program_outcomes"] == {"coder": "failed"} and not info["correct"]


def test_no_program_is_unparseable_and_scores_nothing():
    env = CodeEnv(ADD_3, ["coder"])
    env.reset()
    _, reward, _, info = env.step({"coder": "add_3 adds three."})
    assert reward == 0.0 and info["outcomes"] == {"coder": "unparseable"} and info["program_outcomes"] == {"coder": "no_program"}


def test_a_failed_step_shows_the_failing_test_and_its_error_then_a_repair_ends_the_episode():
    env = CodeEnv(ADD_3, ["coder"], horizon=3)
    assert env.reset() == ADD_3.problem
    observation, reward, done, _ = env.step({"coder": "```python\ndef add_3(x):\n    return x + 2\n```"})
    assert not done and reward == 0.0
    assert observation.startswith(ADD_3.problem)
    assert "failed this test" in observation and "assert add_3(0) == 3" in observation and "AssertionError" in observation
    observation, _, done, _ = env.step({"coder": "```python\ndef add_3(x) return x\n```"})
    assert not done and "syntax error" in observation
    _, reward, done, info = env.step({"coder": "```python\ndef add_3(x):\n    return x + 3\n```"})
    assert (reward, done, info["correct"], info["program_outcomes"]) == (1.0, True, True, {"coder": "passed"})


def test_two_graded_roles_get_the_mean_and_each_its_own_feedback():
    env = CodeEnv(ADD_3, ["coder", "reviewer"], horizon=2)
    env.reset()
    right, wrong = "```python\ndef add_3(x):\n    return x + 3\n```", "no code"
    observation, reward, done, info = env.step({"coder": right, "reviewer": wrong})
    assert reward == 0.5 and not done and not info["correct"]
    assert "The reviewer's previous answer had no ```python block." in observation and "coder's" not in observation


def test_a_code_task_refuses_role_reward_terms_and_problems_without_tests():
    with pytest.raises(ValueError, match="reward terms"):
        CodeEnv(ADD_3, ["coder"], role_rewards={"coder": (("boxed", 0.1),)})
    with pytest.raises(ValueError, match="no tests"):
        CodeEnv(Problem("2 + 2?", "4", "", ""), ["coder"])


def test_the_generated_task_holds_out_a_quarter_of_every_template_and_shares_no_function():
    train, test = make_code_problems("train", seed=1), make_code_problems("test", seed=1)
    name = lambda p: re.search(r"`(\w+)\(x\)`", p.problem).group(1)
    assert not {name(p) for p in train} & {name(p) for p in test}
    templates = {p.level for p in train}
    assert templates == {p.level for p in test} and len(templates) == 9
    for template in templates:
        n_train, n_test = sum(p.level == template for p in train), sum(p.level == template for p in test)
        assert n_test == round((n_train + n_test) * CODE_TEST_FRACTION)
    assert [p.level for p in test[:9]] == sorted({p.level for p in test}, key=[p.level for p in test].index)  # templates take turns
    assert make_code_problems("test", seed=1) == test and make_code_problems("test", seed=2) != test
    assert load_problems("code", "test", seed=1) == test
    for problem in test[:9]:  # one of each template: its reference solution passes its tests, a wrong one does not
        assert run_tests(problem.solution, list(problem.tests)).outcome == "passed"
        assert run_tests(problem.solution.replace("return", "return None and"), list(problem.tests)).outcome == "failed"


def test_the_worked_example_is_no_task_of_the_generated_set():
    tasks = {p.problem for split in ("train", "test") for p in make_code_problems(split, seed=1)}
    for name in CODE_ORGANISATIONS:
        for profile in load_organisation(name).agents:
            assert all(user.removeprefix("Problem: ").split("\n\n")[0] not in tasks for user, _ in profile.examples)
            assert "```python" in profile.system_prompt or not profile.graded


def test_humaneval_comes_from_its_package_and_its_reference_solutions_pass():
    problems = load_humaneval()
    assert len(problems) == 164 and load_problems("humaneval") == problems
    assert all(len(p.tests) == 1 and "check(" in p.tests[0] for p in problems)
    for problem in problems[:3]:
        assert run_tests(problem.solution, list(problem.tests)).outcome == "passed"
    assert run_tests(problems[0].solution.replace("return True", "return False"), list(problems[0].tests)).outcome == "failed"


def test_humaneval_programs_run_after_the_prompt_whose_imports_they_may_use():
    problem = load_humaneval()[0]  # has_close_elements(numbers: List[float], …), `from typing import List` in the prompt
    assert "from typing import List" in problem.prelude
    program = problem.solution[problem.solution.index("def has_close_elements"):]  # the function alone, no import
    env = CodeEnv(problem, ["coder"])
    env.reset()
    assert env.step({"coder": f"```python\n{program}```"})[3]["program_outcomes"] == {"coder": "passed"}


def test_mbpp_rows_become_code_tasks_and_bad_ones_are_named(tmp_path):
    rows = [{"task_id": 7, "text": "Write a function to add two numbers.", "code": "def add(a, b):\n    return a + b",
             "test_list": ["assert add(1, 2) == 3", "assert round(add(0, 0)) == 0"], "test_setup_code": "import math"}]
    path = tmp_path / "mbpp.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    problem, = load_problems(str(path))
    assert problem.tests == ("import math\nassert add(1, 2) == 3", "import math\nassert round(add(0, 0)) == 0")
    assert "The function is called `add`." in problem.problem and "```python" in problem.problem  # named by its def
    assert run_tests(problem.solution, list(problem.tests)).outcome == "passed"
    path.write_text(json.dumps({"text": "Write f.", "test_list": []}) + "\n")
    with pytest.raises(ValueError, match=r"mbpp.jsonl:1: 'test_list' must be a non-empty list"):
        load_problems(str(path))


@pytest.mark.parametrize("argv, message", [
    (["--agents", "coder"], "is an organisation of the code task, but the run's task is math"),
    (["--agents", "chain", "--data", "code"], "is an organisation of the math task, but the run's task is code"),
    (["--task", "code", "--agents", "coder"], "--data holds math problems, but the run's task is code"),
    (["--task", "math", "--data", "code"], "--data holds code tasks (rows with tests), but the run's task is math"),
    (["--agents", "coder", "--data", "code", "--eval_data", "arithmetic"], "mixes code tasks"),
    (["--agents", "PROFILE", "--data", "code"], "score \\boxed{} answers, and a code task takes none"),
])
def test_an_organisation_of_the_other_task_stops_the_run_at_start(argv, message, tmp_path):
    profile = tmp_path / "rewarded.json"
    profile.write_text(json.dumps({"agents": [{"role": "coder", "system_prompt": "Code.", "graded": True,
                                               "rewards": {"boxed": 0.1}}], "dependencies": []}))
    with pytest.raises(SystemExit) as err:
        run_lib.load_task(config_lib.parse_args([str(profile) if a == "PROFILE" else a for a in argv]))
    assert message in str(err.value)


def function_name(problem_or_text) -> str:
    return re.search(r"`(\w+)\(x\)`", getattr(problem_or_text, "problem", problem_or_text)).group(1)


def scripted_outcome(problem) -> str:
    """What ScriptedCoder's program for this problem does: multiples of 5 get no program, odd
    constants a wrong one, even constants the reference solution."""
    k = int(function_name(problem).rsplit("_", 1)[1])
    return "no_program" if k % 5 == 0 else "failed" if k % 2 else "passed"


class ScriptedCoder(ScriptedBackend):
    """A generation backend that answers each generated code task as `scripted_outcome` says."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.solutions = {function_name(p): p for split in ("train", "test") for p in make_code_problems(split, seed=1)}

    def generate(self, prompt_ids, adapter, sampling):
        texts = []
        for ids in prompt_ids:
            problem = self.solutions[function_name(self.tokenizer.decode(ids).rsplit("Problem: ", 1)[1])]
            outcome = scripted_outcome(problem)
            program = problem.solution if outcome == "passed" else f"def {function_name(problem)}(x):\n    return None\n"
            texts.append("I do not know." if outcome == "no_program" else f"```python\n{program}```")
        return scripted_actions(self.tokenizer, texts)


def test_a_code_run_counts_program_outcomes_in_training_and_evaluation(tiny_model_dir, tmp_path, monkeypatch):
    """A whole run on the generated code task with a scripted coder (tiny model): the rewards are the
    sandbox's, and every program outcome is counted, in training and in the held-out evaluation."""
    monkeypatch.setattr(generation, "make_backend", lambda cfg, model, tokenizer, *a, **k: ScriptedCoder(tokenizer))
    argv = ["--model", str(tiny_model_dir), "--data", "code", "--agents", "coder", "--lora_rank", "2",
            "--batch_size", "6", "--iterations", "2", "--eval_problems", "5",
            "--eval_samples", "1", "--eval_interval", "1", "--threads", "1", "--output_dir", str(tmp_path), "--run_name", "code"]
    marft.train(config_lib.parse_args(argv))
    rows = [json.loads(line) for line in (tmp_path / "code" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    config = json.loads((tmp_path / "code" / "config.json").read_text())
    assert config["sandbox/isolation"] == sandbox.isolation()  # the run says which isolation graded it
    assert config["sandbox/syscall_filter"] == "seccomp" and config["sandbox/limits"].startswith("per process")
    assert config_lib.read_config(tmp_path / "code", "--resume").data == "code"  # a recorded fact is no option
    for iteration in (1, 2):
        expected = [scripted_outcome(p) for p in run_lib.iteration_batch(make_code_problems("train", seed=1), 6, 1, iteration - 1)]
        row = rows[iteration]
        assert row["charts/reward"] == pytest.approx(expected.count("passed") / 6)
        for outcome in ("passed", "failed", "no_program"):
            assert row[f"charts/program/{outcome}"] == pytest.approx(expected.count(outcome) / 6)
        assert row["charts/unparseable_rate"] == pytest.approx(expected.count("no_program") / 6)
    held_out = [scripted_outcome(p) for p in make_code_problems("test", seed=1)[:5]]
    assert rows[0]["eval/accuracy"] == pytest.approx(held_out.count("passed") / 5)
    assert rows[0]["eval/program/no_program"] == pytest.approx(held_out.count("no_program") / 5)
