"""Tests of the math environment package `envs`.

Covers: `\\boxed{}` extraction, MATH / GSM8K rows, loading the real benchmark files in
../shared/data (read in place, never copied), the generated arithmetic task, math-verify
grading (including a pathological input that needs the worker time limit, graded from the
main thread and from another thread), and multi-turn `MathEnv` episodes.
"""

import json
import os
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

from envs import (
    Environment,
    Grader,
    MathEnv,
    Problem,
    extract_boxed,
    load_problems,
    make_arithmetic_problems,
)
from envs.problems import row_to_problem

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="module")
def grader():
    with Grader(timeout_seconds=5) as shared_grader:
        yield shared_grader


@pytest.fixture(scope="module")
def quick_timeout_grader():
    with Grader(timeout_seconds=1) as impatient_grader:
        yield impatient_grader


# ---------------------------------------------------------------------------------------
# \boxed{} extraction
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so the answer is $\\boxed{42}$.", "42"),
        ("$\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}"),  # braces nest
        ("$\\boxed{\\frac{\\sqrt{2}}{2}}$", "\\frac{\\sqrt{2}}{2}"),
        ("first \\boxed{1}, then \\boxed{2}", "2"),  # the last one wins
        ("\\boxed{3} and finally \\fbox{12}", "12"),  # \fbox counts too
        ("the answer is $\\boxed 5$.", "5"),  # brace-less form
        ("$$\\boxed {17}.$$", "17"),  # space before the brace
        ("$\\boxed{\\{1, 2\\}}$", "\\{1, 2\\}"),  # escaped braces are literal
        ("\\boxed{a \\boxed{b}}", "a \\boxed{b}"),  # a box inside a box is part of it
        ("\\boxed{}", ""),
        ("no box here, the answer is 7", None),
        ("\\boxed{3} ... \\boxed{\\frac{1}{", None),  # the final answer was cut off
        ("\\boxedfoo{3}", None),  # a different command
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


# ---------------------------------------------------------------------------------------
# Rows -> Problem
# ---------------------------------------------------------------------------------------


def test_math_row_gold_is_last_boxed_of_solution():
    row = {
        "problem": "What is half of one?",
        "solution": "Try $\\boxed{1}$... no: it is $\\boxed{\\frac{1}{2}}$.",
        "level": "Level 1",
        "type": "Prealgebra",
    }
    problem = row_to_problem(row, "row")
    assert problem == Problem(
        problem="What is half of one?",
        answer="\\frac{1}{2}",  # kept as LaTeX: never reduced to a number
        level="Level 1",
        type="Prealgebra",
        solution=row["solution"],
    )


def test_explicit_answer_field_wins():
    row = {"problem": "p", "solution": "so $\\boxed{0.5}$", "answer": "\\frac12", "level": 3, "subject": "Algebra"}
    problem = row_to_problem(row, "row")
    assert problem.answer == "\\frac12"
    assert problem.level == "Level 3"
    assert problem.type == "Algebra"


def test_gsm8k_row_gold_follows_hashes_without_commas():
    row = {"question": "How many?", "answer": "It is 1000+234=<<1000+234=1234>>1,234.\n#### 1,234"}
    problem = row_to_problem(row, "row")
    assert problem.problem == "How many?"
    assert problem.answer == "1234"
    assert problem.solution == "It is 1000+234=<<1000+234=1234>>1,234."


@pytest.mark.parametrize(
    "row, message",
    [
        (["not", "a", "dict"], "expected a JSON object"),
        ({"solution": "$\\boxed{1}$"}, "no question text"),
        ({"problem": "   ", "answer": "1"}, "no question text"),
        ({"problem": "p", "solution": "no box at all"}, "\\boxed"),
        ({"problem": "p", "solution": "it is $\\boxed{}$"}, "\\boxed"),
        ({"problem": "p"}, "no gold answer"),
        ({"question": "q", "answer": "#### "}, "no gold answer"),
        ({"problem": {"nested": 1}, "answer": "1"}, "should be a string"),
    ],
)
def test_malformed_row_raises_naming_where(row, message):
    with pytest.raises(ValueError) as raised:
        row_to_problem(row, "data.jsonl:17")
    assert "data.jsonl:17" in str(raised.value)
    assert message in str(raised.value)


# ---------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("file_name, row_count", [("math_test.jsonl", 5000), ("gsm8k_test.jsonl", 1319)])
def test_every_row_of_the_real_test_files_loads(file_name, row_count):
    problems = load_problems(str(SHARED_DATA / file_name))
    assert len(problems) == row_count
    assert all(problem.problem.strip() and problem.answer.strip() for problem in problems)


def test_real_files_give_the_expected_golds():
    math_problems = load_problems(str(SHARED_DATA / "math_test.jsonl"), limit=3)
    assert [problem.answer for problem in math_problems] == ["920.25", "-4", "18"]
    assert math_problems[0].level == "Level 4" and math_problems[0].type == "Algebra"
    gsm8k_problems = load_problems(str(SHARED_DATA / "gsm8k_test.jsonl"), limit=3)
    assert [problem.answer for problem in gsm8k_problems] == ["18", "3", "70000"]


def test_math_train_empty_boxes_raise_or_are_skipped_with_a_warning():
    # Two solutions of MATH's train split end in an empty \\boxed{} (lines 5079, 5457).
    path = str(SHARED_DATA / "math_train.jsonl")
    with pytest.raises(ValueError, match="math_train.jsonl:5079"):
        load_problems(path)
    with pytest.warns(UserWarning) as warned:
        problems = load_problems(path, skip_malformed=True)
    assert len(problems) == 7500 - 2
    assert ["math_train.jsonl:5079" in str(w.message) for w in warned] == [True, False]
    assert "math_train.jsonl:5457" in str(warned[1].message)


def write_jsonl(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_malformed_jsonl_row_names_file_and_line(tmp_path):
    good = json.dumps({"problem": "1+1?", "solution": "$\\boxed{2}$"})
    bad = json.dumps({"problem": "2+2?", "solution": "four"})
    path = write_jsonl(tmp_path / "rows.jsonl", [good, "", bad])
    with pytest.raises(ValueError, match=r"rows\.jsonl:3: .*\\boxed"):
        load_problems(path)
    assert load_problems(path, limit=1)[0].answer == "2"  # rows after the limit are not read


def test_invalid_json_line_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [json.dumps({"question": "q", "answer": "#### 1"}), "{oops"])
    with pytest.raises(ValueError, match=r"rows\.jsonl:2: not valid JSON"):
        load_problems(path)


def test_json_list_file(tmp_path):
    rows = [{"question": "q1", "answer": "#### 1"}, {"problem": "p2", "answer": "x^2"}]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    assert [problem.answer for problem in load_problems(str(path))] == ["1", "x^2"]
    path.write_text(json.dumps([rows[0], {"problem": "p"}]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"rows\.json\[1\]"):
        load_problems(str(path))
    path.write_text(json.dumps({"rows": rows}), encoding="utf-8")
    with pytest.raises(ValueError, match="expected a JSON list"):
        load_problems(str(path))


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        load_problems(str(missing))


def test_hub_source_without_datasets_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(ImportError, match="pip install datasets"):
        load_problems("openai/gsm8k:main", split="test")


# ---------------------------------------------------------------------------------------
# The generated arithmetic task
# ---------------------------------------------------------------------------------------


def true_result(question: str) -> int:
    """Compute "What is 7 * 5?" directly."""
    left, operator, right = question.removeprefix("What is ").removesuffix("?").split()
    return int(left) + int(right) if operator == "+" else int(left) * int(right)


def test_arithmetic_split_is_deterministic_and_disjoint():
    train = make_arithmetic_problems("train", seed=0, levels=(1, 2))
    test = make_arithmetic_problems("test", seed=0, levels=(1, 2))
    assert train == make_arithmetic_problems("train", seed=0, levels=(1, 2))
    assert test == make_arithmetic_problems("test", seed=0, levels=(1, 2))
    # 25% of 100 problems per level, rounded up to whole twin pairs: 25 or 26 per level
    assert 50 <= len(test) <= 52 and len(train) + len(test) == 200
    assert not {p.problem for p in train} & {p.problem for p in test}
    assert len({p.problem for p in train + test}) == 200
    assert {p.problem for p in test} != {p.problem for p in make_arithmetic_problems("test", seed=1, levels=(1, 2))}


def operands(question: str) -> tuple[str, int, int]:
    left, operator, right = question.removeprefix("What is ").removesuffix("?").split()
    return operator, int(left), int(right)


@pytest.mark.parametrize("seed", [0, 1, 2, 7, 123])
@pytest.mark.parametrize("level", [1, 2, 3, 4])
def test_no_held_out_problem_has_its_commuted_twin_in_training(level, seed):
    train = {operands(p.problem) for p in make_arithmetic_problems("train", seed=seed, levels=(level,))}
    test = [operands(p.problem) for p in make_arithmetic_problems("test", seed=seed, levels=(level,))]
    twins_in_training = [(op, a, b) for op, a, b in test if (op, b, a) in train]
    assert twins_in_training == []
    if level in (1, 2):  # one-digit levels hold both orders of most pairs: both of a pair went to test
        assert sum((op, b, a) in set(test) for op, a, b in test if a != b) >= 20


def test_arithmetic_split_of_a_level_does_not_depend_on_other_levels():
    alone = make_arithmetic_problems("test", seed=3, levels=(1,))
    together = make_arithmetic_problems("test", seed=3, levels=(1, 2, 3, 4))
    assert {p.problem for p in alone} == {p.problem for p in together if p.level == "Level 1"}
    assert len([p for p in together if p.level == "Level 3"]) == 225  # 25% of 900 (no twins at level 3)


def test_the_first_rows_hold_the_levels_in_equal_shares():
    # Level 2 has 26 held-out problems, level 3 225: the first 50 rows are 25 of each, alternating,
    # and the rest are level 3's.
    test = make_arithmetic_problems("test", seed=1, levels=(2, 3))
    assert [p.level for p in test[:4]] == ["Level 2", "Level 3", "Level 2", "Level 3"]
    assert sum(p.level == "Level 2" for p in test[:50]) == 25
    assert {p.level for p in test[52:]} == {"Level 3"} and len(test) == 26 + 225


def test_arithmetic_rows_are_right_and_math_shaped():
    problems = make_arithmetic_problems("train", levels=(1, 2, 3, 4))
    assert {p.level for p in problems} == {"Level 1", "Level 2", "Level 3", "Level 4"}
    for problem in problems:
        assert problem.type == "Arithmetic"
        assert problem.answer == str(true_result(problem.problem))
        assert problem.solution.endswith(f"$\\boxed{{{problem.answer}}}$.")
        assert extract_boxed(problem.solution) == problem.answer
    assert "What is 7 * 5?" in {p.problem for p in problems + make_arithmetic_problems("test", levels=(2,))}


def test_load_problems_arithmetic_source():
    assert load_problems("arithmetic", split="test", seed=2) == make_arithmetic_problems("test", seed=2)
    assert load_problems("arithmetic:3,4", limit=5) == make_arithmetic_problems("train", levels=(3, 4))[:5]
    with pytest.raises(ValueError, match="split"):
        make_arithmetic_problems("validation")
    with pytest.raises(ValueError, match="levels"):
        make_arithmetic_problems("train", levels=(5,))


# ---------------------------------------------------------------------------------------
# Grading
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "gold, response, expected",
    [
        ("\\frac{1}{2}", "Half of it, so \\boxed{0.5}", "correct"),
        ("\\dfrac{1}{2}", "$\\boxed{\\frac12}$", "correct"),
        ("\\frac{\\sqrt{2}}{2}", "$\\boxed{\\frac{\\sqrt{2}}{2}}$", "correct"),
        ("\\frac{\\sqrt{2}}{2}", "$\\boxed{\\frac{1}{\\sqrt{2}}}$", "correct"),
        ("5", "The side is $\\boxed{5 \\text{ cm}}$.", "correct"),  # units are dropped
        ("5", "She has $\\boxed{5\\text{ apples}}$.", "correct"),
        ("1000", "\\boxed{1,000}", "correct"),
        ("3", "\\boxed{x = 3}", "correct"),
        ("18", "first \\boxed{17}, corrected: \\boxed{18}", "correct"),  # last box counts
        ("2", "\\boxed{\\frac{1}{2}}", "wrong"),  # no last-number fallback on the gold
        ("\\frac{1}{2}", "\\boxed{2}", "wrong"),
        ("5", "\\boxed{6}", "wrong"),
        ("18", "first \\boxed{18}, corrected: \\boxed{17}", "wrong"),
        ("5", "The answer is 5.", "unparseable"),  # no box: a number in text is not read
        ("5", "The answer is $\\boxed{}$.", "unparseable"),
        ("5", "\\boxed{?}", "unparseable"),  # nothing math-verify can read as math
    ],
)
def test_grade(grader, gold, response, expected):
    assert grader.grade(gold, response) == expected


def test_grade_many_and_cache(grader):
    golds = ["4", "4", "\\frac{1}{3}"]
    responses = ["\\boxed{4}", "\\boxed{5}", "\\boxed{0.3333333333}"]
    assert grader.grade_many(golds, responses) == ["correct", "wrong", "correct"]
    started = time.perf_counter()
    assert grader.grade_many(golds * 100, responses * 100) == ["correct", "wrong", "correct"] * 100
    assert time.perf_counter() - started < 0.5  # answered from the cache
    with pytest.raises(ValueError, match="2 gold answers but 1 responses"):
        grader.grade_many(["1", "2"], ["\\boxed{1}"])


def test_unparseable_gold_is_a_data_error(grader):
    with pytest.raises(ValueError, match="gold answer"):
        grader.grade("", "\\boxed{1}")


def test_grade_from_other_threads(grader):
    cases = [("7", "\\boxed{7}", "correct"), ("7", "\\boxed{8}", "wrong"), ("\\pi", "\\boxed{\\pi}", "correct")] * 3
    outcomes: dict[int, str] = {}

    def grade_case(index: int) -> None:
        gold, response, _ = cases[index]
        outcomes[index] = grader.grade(gold, response)

    threads = [threading.Thread(target=grade_case, args=(index,)) for index in range(len(cases))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [outcomes[index] for index in range(len(cases))] == [expected for _, _, expected in cases]


def test_close_then_grade_again():
    with Grader(timeout_seconds=5) as own_grader:
        assert own_grader.grade("1", "\\boxed{1}") == "correct"
        own_grader.close()
        assert own_grader.grade("2", "\\boxed{2}") == "correct"  # a new worker starts


# `9^{9^{9^{9}}}` makes sympy work for minutes (over 2 minutes measured without any time
# limit); math-verify's own SIGALRM limit cannot run off the main thread.
POWER_TOWER = "\\boxed{9^{9^{9^{9}}}}"
OTHER_POWER_TOWER = "\\boxed{9^{9^{9^{8}}}}"


def timed_grade(grader: Grader, gold: str, response: str) -> tuple[str, float]:
    started = time.perf_counter()
    outcome = grader.grade(gold, response)
    return outcome, time.perf_counter() - started


def test_pathological_input_times_out_on_the_main_thread(quick_timeout_grader):
    grader = quick_timeout_grader
    assert grader.grade("3", "\\boxed{3}") == "correct"  # start the worker beforehand
    timeouts_before = grader.timeouts
    outcome, seconds = timed_grade(grader, "1", POWER_TOWER)
    assert outcome == "ungraded"  # not judged: neither wrong nor unparseable
    assert grader.timeouts == timeouts_before + 1  # it really ran past the 1 s limit
    assert seconds < 2.5
    # A timeout is never cached: asking again checks again (and times out again).
    outcome, seconds = timed_grade(grader, "1", POWER_TOWER)
    assert (outcome, grader.timeouts) == ("ungraded", timeouts_before + 2)
    assert grader.grade("4", "\\boxed{4}") == "correct"  # a fresh worker took over
    # In the environment an ungraded answer earns nothing.
    env = MathEnv(Problem(problem="What is 9^9^9^9 - 9^9^9^9 + 1?", answer="1", level="", type=""), grader, ["solver"])
    env.reset()
    _, reward, _, info = env.step({"solver": POWER_TOWER})
    assert (reward, info["outcomes"]) == (0.0, {"solver": "ungraded"})


def test_pathological_input_times_out_off_the_main_thread(quick_timeout_grader):
    grader = quick_timeout_grader
    assert grader.grade("5", "\\boxed{5}") == "correct"  # start the worker beforehand
    timeouts_before = grader.timeouts
    result = {}
    thread = threading.Thread(target=lambda: result.update(graded=timed_grade(grader, "2", OTHER_POWER_TOWER)))
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    outcome, seconds = result["graded"]
    assert outcome == "ungraded"
    assert grader.timeouts == timeouts_before + 1
    assert seconds < 2.5


# ---------------------------------------------------------------------------------------
# MathEnv
# ---------------------------------------------------------------------------------------

SEVEN_PLUS_FIVE = Problem(problem="What is 7 + 5?", answer="12", level="Level 1", type="Arithmetic")


def test_math_env_follows_the_protocol(grader):
    assert isinstance(MathEnv(SEVEN_PLUS_FIVE, grader, ["solver"]), Environment)


def test_single_step_episode(grader):
    env = MathEnv(SEVEN_PLUS_FIVE, grader, graded_roles=["solver"])
    assert env.reset(seed=0) == "What is 7 + 5?"
    observation, reward, done, info = env.step({"planner": "add them", "solver": "so \\boxed{12}"})
    assert (reward, done) == (1.0, True)
    assert info == {"outcomes": {"solver": "correct"}, "correct": True, "step": 0, "role_rewards": {},
                    "level": SEVEN_PLUS_FIVE.level, "answers": {"solver": "12"}}

    env.reset()
    observation, reward, done, info = env.step({"solver": "\\boxed{13}"})
    assert (reward, done, info["correct"]) == (0.0, True, False)  # horizon 1 reached


def test_per_role_reward_terms_score_each_agents_own_response(grader):
    terms = {"planner": (("no_boxed", 0.1), ("correct", 0.5)), "solver": (("boxed", 0.2),)}
    env = MathEnv(SEVEN_PLUS_FIVE, grader, graded_roles=["solver"], role_rewards=terms)
    env.reset()
    # The planner gives no answer (no_boxed 1 · 0.1; correct 0), the solver a boxed right one (boxed 1 · 0.2).
    _, reward, _, info = env.step({"planner": "Add 7 and 5.", "solver": "so \\boxed{12}"})
    assert reward == 1.0 and info["role_rewards"] == pytest.approx({"planner": 0.1, "solver": 0.2})
    env.reset()
    # An ungraded planner whose own answer is right earns `correct` (0.5), no `no_boxed`; the wrong solver still boxed.
    _, reward, _, info = env.step({"planner": "7 + 5 = \\boxed{12}", "solver": "\\boxed{13}"})
    assert reward == 0.0 and info["role_rewards"] == pytest.approx({"planner": 0.5, "solver": 0.2})
    with pytest.raises(ValueError, match="unknown reward terms"):
        MathEnv(SEVEN_PLUS_FIVE, grader, ["solver"], role_rewards={"solver": (("brevity", 1.0),)})


def test_multi_turn_wrong_then_right(grader):
    env = MathEnv(SEVEN_PLUS_FIVE, grader, graded_roles=["solver"], horizon=2)
    env.reset()
    observation, reward, done, info = env.step({"solver": "I think \\boxed{13}"})
    assert (reward, done, info["step"]) == (0.0, False, 0)
    assert info["outcomes"] == {"solver": "wrong"}
    assert observation.startswith("What is 7 + 5?")
    assert "Your previous answer 13 was incorrect. Try again." in observation

    observation, reward, done, info = env.step({"solver": "Sorry: \\boxed{12}"})
    assert (reward, done, info["step"], info["correct"]) == (1.0, True, 1, True)

    with pytest.raises(ValueError, match="after the episode ended"):
        env.step({"solver": "\\boxed{12}"})
    env.reset()  # a new episode may start
    assert env.step({"solver": "\\boxed{12}"})[2] is True


def test_episode_ends_at_horizon(grader):
    env = MathEnv(SEVEN_PLUS_FIVE, grader, graded_roles=["solver"], horizon=3)
    env.reset()
    dones = [env.step({"solver": "\\boxed{11}"})[2] for _ in range(3)]
    assert dones == [False, False, True]


def test_unparseable_answer_feedback(grader):
    env = MathEnv(SEVEN_PLUS_FIVE, grader, graded_roles=["solver"], horizon=2)
    env.reset()
    observation, reward, done, info = env.step({"solver": "It is 12."})
    assert info["outcomes"] == {"solver": "unparseable"}
    assert reward == 0.0
    assert not done
    assert "had no \\boxed{} answer" in observation


def test_several_graded_roles(grader):
    env = MathEnv(SEVEN_PLUS_FIVE, grader, graded_roles=["solver", "verifier"], horizon=2)
    env.reset()
    observation, reward, done, info = env.step({"solver": "\\boxed{12}", "verifier": "no box"})
    assert info["outcomes"] == {"solver": "correct", "verifier": "unparseable"}
    assert reward == pytest.approx(0.5)
    assert not done and not info["correct"]
    assert "The verifier's previous answer had no \\boxed{} answer." in observation


def test_bad_calls_raise(grader):
    env = MathEnv(SEVEN_PLUS_FIVE, grader, graded_roles=["solver"])
    with pytest.raises(ValueError, match="reset"):
        env.step({"solver": "\\boxed{12}"})
    env.reset()
    with pytest.raises(ValueError, match="solver"):
        env.step({"planner": "\\boxed{12}"})
    with pytest.raises(ValueError, match="graded_roles"):
        MathEnv(SEVEN_PLUS_FIVE, grader, graded_roles=[])
