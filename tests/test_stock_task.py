"""examples/stock.py, designs 4 and 5 of the team-wins study (results/team-wins/): what it holds out and how it pays."""
import importlib.util
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("stock_task", ROOT / "examples" / "stock.py")
stock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stock)
PROBLEM = stock.Problem(problem="Tom packs 345 pens into each of 12 boxes. Later 30 more boxes arrive. How many pens are "
                        "packed, and how many boxes are there?", answer="4140|42", level="train_template", type="train_template")


def test_held_out_problems_share_no_operands_and_alone_use_the_held_out_wordings():
    train, held_out = stock.load(SimpleNamespace(seed=1))
    # a, b and k, whatever the wording's order (one wording names b twice)
    operands = lambda problems: {frozenset(int(n) for n in p.problem.replace(";", " ").split() if n.isdigit()) for p in problems}
    assert all(len(o) == 3 for o in operands(train) | operands(held_out))
    assert not operands(train) & operands(held_out)
    late_first = lambda p: p.problem.split()[0].isdigit() or p.problem.startswith("After")
    assert not any(late_first(p) for p in train)
    assert sum(late_first(p) for p in held_out) == 16 == sum(p.level == "held_out_template" for p in held_out)
    a, b, k = 345, 12, 30  # the answer is a·b | b + k
    assert PROBLEM.answer == f"{a * b}|{b + k}"


def test_the_team_is_graded_on_each_specialists_expression_and_paid_for_its_own_part():
    env = stock.Env(PROBLEM, ["packer", "counter"])
    _, reward, done, info = env.step({"packer": "\\calc{345*12}", "counter": "\\calc{12*30}"})
    assert (reward, done, info["correct"], info["part_a"], info["part_b"]) == (0.5, True, False, True, False)
    assert info["role_rewards"] == {"packer": 0.5, "counter": 0.0}
    # each specialist's first expression only: a second one of the right value does not count
    _, reward, _, info = env.step({"packer": "\\calc{12 \\times 345}", "counter": "\\calc{12-30} \\calc{12+30}"})
    assert (reward, info["part_b"], info["role_rewards"]) == (0.5, False, {"packer": 0.5, "counter": 0.0})
    _, reward, _, info = env.step({"packer": "\\calc{345*12}", "counter": "\\calc{30+12}"})
    assert (reward, info["correct"], info["outcomes"]) == (1.0, True, {"packer": "correct", "counter": "correct"})


def test_the_clerk_needs_both_expressions_among_its_first_two_and_is_paid_for_both_parts():
    env = stock.Env(PROBLEM, ["clerk"])
    _, reward, _, info = env.step({"clerk": "\\calc{12+30} \\calc{345*12}"})  # either order
    assert (reward, info["correct"], info["role_rewards"]) == (1.0, True, {"clerk": 1.0})
    _, reward, _, info = env.step({"clerk": "\\calc{1+1} \\calc{12+30} \\calc{345*12}"})  # a third is not read
    assert (reward, info["part_a"], info["part_b"], info["role_rewards"]) == (0.5, False, True, {"clerk": 0.5})
    _, reward, _, info = env.step({"clerk": "4140 and 42"})  # computed by hand: no expression, unparseable
    assert (reward, info["outcomes"]) == (0.0, {"clerk": "unparseable"})


def test_the_pairs_first_role_is_paid_for_part_a_its_second_for_part_b_and_each_votes_its_values():
    env = stock.Env(PROBLEM, ["item_clerk", "box_clerk"])  # the pair's roles, in its order
    _, reward, _, info = env.step({"item_clerk": "\\calc{12+30}", "box_clerk": "\\calc{345*12}"})  # parts swapped
    assert (reward, info["part_a"], info["part_b"], info["role_rewards"]) == (0.0, False, False, {"item_clerk": 0.0, "box_clerk": 0.0})
    assert info["answers"] == {"item_clerk": "42", "box_clerk": "4140"}
    _, reward, _, info = env.step({"item_clerk": "\\calc{345*12}", "box_clerk": "\\calc{1/0} 42"})
    assert (reward, info["role_rewards"], info["answers"]) == (0.5, {"item_clerk": 0.5, "box_clerk": 0.0},
                                                               {"item_clerk": "4140", "box_clerk": None})
    assert [a["role"] for a in stock.task.organisations["pair"]["agents"]] == ["item_clerk", "box_clerk"]
    prompts = [a["system_prompt"] for a in stock.task.organisations["pair"]["agents"]]
    assert prompts[0].replace("items packed", "containers at the end") == prompts[1]  # they differ only in the part's words
