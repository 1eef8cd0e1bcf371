"""examples/cargo.py, design 6 of the team-wins study (results/team-wins/): what it holds out and how it pays."""
import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("cargo_task", ROOT / "examples" / "cargo.py")
cargo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cargo)
# a = 345 pens per box, b = 12 boxes now, k = 30 boxes later: part A 345·12 = 4140, part B 345·30 = 10350
PROBLEM = cargo.stock.Problem(problem="Tom has 12 boxes with 345 pens in each. Later 30 more boxes of 345 pens arrive. How many "
                              "pens are there now, and how many pens do the new boxes bring?", answer="4140|10350",
                              level="train_template", type="train_template")


def numbers(problem):
    return [int(n) for n in re.findall(r"\d+", problem.problem)]


def test_the_answer_is_both_products_and_held_out_problems_share_no_operands_and_alone_name_the_late_boxes_first():
    train, held_out = cargo.load(SimpleNamespace(seed=1))
    assert (len(train), len(held_out)) == (400, 48)
    for p in train + held_out:
        a = next(n for n in numbers(p) if n >= 100)  # the only 3-digit number
        b_and_k = {n for n in numbers(p) if n < 100}
        assert len(b_and_k) == 2
        want_a, want_b = (int(x) for x in p.answer.split("|"))
        assert {want_a // a, want_b // a} == b_and_k and want_a % a == want_b % a == 0
        # the training wordings give b before k; the held-out ones k first (so part B is then a·(the first 2-digit number))
        first_two_digit = next(n for n in numbers(p) if n < 100)
        assert (want_a == a * first_two_digit) == (p.level == "train_template")
    operands = lambda problems: {frozenset(numbers(p)) for p in problems}
    assert not operands(train) & operands(held_out)
    assert sum(p.level == "held_out_template" for p in held_out) == 16 and all(p.level == "train_template" for p in train)


def test_the_pairs_first_role_is_paid_for_a_times_b_its_second_for_a_times_k():
    roles = [a["role"] for a in cargo.task.organisations["pair"]["agents"]]
    assert roles == ["stock_clerk", "delivery_clerk"]
    env = cargo.stock.Env(PROBLEM, roles)
    _, reward, _, info = env.step({"stock_clerk": "\\calc{345*12}", "delivery_clerk": "\\calc{12*345}"})  # both wrote part A
    assert (reward, info["part_a"], info["part_b"], info["role_rewards"]) == (0.5, True, False,
                                                                              {"stock_clerk": 0.5, "delivery_clerk": 0.0})
    _, reward, _, info = env.step({"stock_clerk": "\\calc{12 \\times 345}", "delivery_clerk": "\\calc{30*345}"})
    assert (reward, info["correct"], info["answers"]) == (1.0, True, {"stock_clerk": "4140", "delivery_clerk": "10350"})
    prompts = [a["system_prompt"] for a in cargo.task.organisations["pair"]["agents"]]
    assert prompts[0].replace(cargo.PART_A, cargo.PART_B) == prompts[1]  # they differ only in the part's words
    solo = cargo.stock.Env(PROBLEM, ["clerk"])
    _, reward, _, info = solo.step({"clerk": "\\calc{345*30} \\calc{345*12}"})  # either order, as stock's clerk
    assert (reward, info["role_rewards"]) == (1.0, {"clerk": 1.0})
