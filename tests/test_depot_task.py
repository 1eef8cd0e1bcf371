"""examples/depot.py, design 8 of the team-wins study (results/team-wins/): what it holds out and how it pays."""
import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("depot_task", ROOT / "examples" / "depot.py")
depot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(depot)
# a = 345 pens per box, b = 12 boxes now, k = 30 boxes later: A = 345·12 = 4140, B = 345·30 = 10350, C = 12 + 30 = 42
PROBLEM = depot.stock.Problem(problem="Tom has 12 boxes with 345 pens in each. Later 30 more boxes of 345 pens arrive. How many "
                              "pens are there now, how many pens do the new boxes bring, and how many boxes are there at the end?",
                              answer="4140|10350|42", level="train_template", type="train_template")


def numbers(problem):
    return [int(n) for n in re.findall(r"\d+", problem.problem)]


def test_the_answer_is_two_products_and_a_sum_and_held_out_problems_share_no_operands_and_alone_name_the_late_boxes_first():
    train, held_out = depot.load(SimpleNamespace(seed=1))
    assert (len(train), len(held_out)) == (400, 48)
    for p in train + held_out:
        a = next(n for n in numbers(p) if n >= 100)  # the only 3-digit number
        two_digit = [n for n in numbers(p) if n < 100]
        b, k = two_digit if p.level == "train_template" else two_digit[::-1]  # the held-out wordings name k first
        assert p.answer == f"{a * b}|{a * k}|{b + k}"
    operands = lambda problems: {frozenset(numbers(p)) for p in problems}
    assert not operands(train) & operands(held_out)
    assert sum(p.level == "held_out_template" for p in held_out) == 16 and all(p.level == "train_template" for p in train)


@pytest.mark.parametrize("texts, parts, pay", [
    # every part right: a third of a point each
    (("\\calc{345*12}", "\\calc{30*345}", "\\calc{12+30}"), (True, True, True), (1 / 3, 1 / 3, 1 / 3)),
    # the delivery clerk wrote part A, the box clerk a product: only the stock clerk is paid
    (("\\calc{12 \\times 345}", "\\calc{345*12}", "\\calc{12*30}"), (True, False, False), (1 / 3, 0.0, 0.0)),
    # only each clerk's first expression counts
    (("\\calc{1+1} \\calc{345*12}", "\\calc{345*30}", "\\calc{30+12} \\calc{1}"), (False, True, True), (0.0, 1 / 3, 1 / 3)),
])
def test_the_trios_role_i_is_graded_on_its_first_expression_for_part_i_and_paid_a_third_for_it(texts, parts, pay):
    roles = [a["role"] for a in depot.task.organisations["trio"]["agents"]]
    assert roles == ["stock_clerk", "delivery_clerk", "box_clerk"]
    _, reward, _, info = depot.stock.Env(PROBLEM, roles).step(dict(zip(roles, texts)))
    assert (info["part_a"], info["part_b"], info["part_c"]) == parts
    assert reward == pytest.approx(sum(parts) / 3) and info["correct"] == all(parts)
    assert info["role_rewards"] == pytest.approx(dict(zip(roles, pay)))


def test_the_clerk_needs_the_three_values_among_its_first_three_expressions():
    env = depot.stock.Env(PROBLEM, ["clerk"])
    _, reward, _, info = env.step({"clerk": "\\calc{12+30} \\calc{345*30} \\calc{345*12}"})  # any order
    assert (reward, info["correct"], info["role_rewards"]) == (1.0, True, {"clerk": 1.0})
    _, reward, _, info = env.step({"clerk": "\\calc{345*12} \\calc{345*30} \\calc{1} \\calc{12+30}"})  # a fourth is not read
    assert (info["part_c"], info["correct"]) == (False, False) and info["role_rewards"] == {"clerk": pytest.approx(2 / 3)}


def test_the_product_clerks_differ_only_in_their_parts_words_and_the_box_clerk_reads_sums():
    stock_clerk, delivery_clerk, box_clerk = depot.task.organisations["trio"]["agents"]
    assert stock_clerk["system_prompt"].replace(depot.PART_A, depot.PART_B) == delivery_clerk["system_prompt"]
    assert stock_clerk["system_prompt"].replace(depot.PART_A, depot.PART_C) == box_clerk["system_prompt"]
    assert stock_clerk["examples"] == delivery_clerk["examples"]
    assert all("*" in e["assistant"] for e in stock_clerk["examples"]) and all("+" in e["assistant"] for e in box_clerk["examples"])
