"""examples/orders.py, the two-part task under study (results/team-wins/): what it holds out and how it pays."""
import importlib.util
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("orders_task", ROOT / "examples" / "orders.py")
orders = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(orders)


def test_held_out_problems_share_no_operands_and_alone_use_the_held_out_wordings():
    train, held_out = orders.load(SimpleNamespace(seed=1))
    operands = lambda problems: {tuple(int(n) for n in p.problem.split() if n.isdigit()) for p in problems}
    assert not operands(train) & operands(held_out)
    wording = lambda p: p.problem.startswith("Destination:") or " orders " in p.problem
    assert not any(wording(p) for p in train)
    assert sum(wording(p) for p in held_out) == 16 == sum(p.level == "held_out_template" for p in held_out)


def test_each_part_pays_half_and_the_roles_are_paid_for_their_own_part():
    problem = orders.Problem(problem="There are 12 trucks, each carrying 345 bricks, driving to Oslo for Li. How many bricks, "
                             "and which city?", answer="4140|Oslo", level="train_template", type="train_template")
    env = orders.Env(problem, ["answerer"], ["caller", "calculator", "reader", "answerer"])
    joint = {"caller": "\\calc{345*12}", "reader": "They go to Oslo.", "answerer": "\\boxed{4140} \\boxed{Lima}"}
    _, reward, done, info = env.step(joint)
    assert (reward, done, info["correct"], info["part_a"], info["part_b"]) == (0.5, True, False, True, False)
    assert info["role_rewards"] == {"caller": 0.5, "reader": 0.5}
    _, reward, _, info = env.step({**joint, "caller": "\\calc{345+12}", "answerer": "\\boxed{4,140} \\boxed{oslo}"})
    assert (reward, info["correct"], info["role_rewards"]) == (1.0, True, {"caller": 0.0, "reader": 0.5})
    solo = orders.Env(problem, ["answerer"], ["caller", "calculator", "answerer"])  # no reader: the answerer names the city
    assert solo.step({"caller": "\\calc{12*345}", "answerer": "Oslo \\boxed{4140}"})[3]["role_rewards"] == {
        "caller": 0.5, "answerer": 0.5}


def test_the_split_team_is_graded_on_the_calculators_result_and_the_readers_box():
    problem = orders.Problem(problem="There are 12 trucks, each carrying 345 bricks, driving to Oslo for Li. How many bricks, "
                             "and which city?", answer="4140|Oslo", level="train_template", type="train_template")
    env = orders.Env(problem, ["reader"], ["caller", "calculator", "reader"])
    _, reward, _, info = env.step({"caller": "\\calc{12*345}", "reader": "\\boxed{Oslo}"})
    assert (reward, info["correct"], info["role_rewards"]) == (1.0, True, {"caller": 0.5, "reader": 0.5})
    _, reward, _, info = env.step({"caller": "\\calc{12+345}", "reader": "\\boxed{4140} \\boxed{Oslo}"})
    assert (reward, info["part_a"], info["part_b"]) == (0.5, False, True)  # a number in the reader's box is not part A
