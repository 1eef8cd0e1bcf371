"""A task under study (results/team-wins/, design 6): two products from one story, with different operands.

    python marft.py --task examples/cargo.py --agents solo
    python marft.py --task examples/cargo.py --agents pair [--shared_adapter]

Each story gives a count per box (a, 3 digits), the boxes there now (b, 2 digits) and the boxes that
arrive later with as many items each (k, 2 digits). Part A is the items there now, a·b; part B the items
the late boxes bring, a·k. Both are products answered in \\calc{...} (the calculator evaluates them), so
what each part takes is its operands: the first two numbers of a story give part A, and part B has to
swap one of them for k. 6 wordings, 2 held out (they name the late boxes first); held-out operands are
disjoint from the training ones.

    solo    one clerk writes both expressions (\\calc{A} \\calc{B}): one learner turn
    pair    a stock clerk (part A) and a delivery clerk (part B) whose prompts differ only in the words
            naming their part, with the same worked examples; neither reads the other (D ≡ 0).
            --shared_adapter: the same two roles on one adapter, which has to tell them apart by those words

Grading and pay as examples/stock.py's (its `Env`): part A holds when one of the clerk's first two
expressions (the pair's first role's only one) is worth a·b, part B likewise for a·k (the second
role's); reward (A + B) / 2, correct when both; 0.5 · A to whoever writes part A, 0.5 · B to part B's.
"""
import importlib.util
from pathlib import Path

from tasks import Task

_spec = importlib.util.spec_from_file_location("marft_task_stock_for_cargo", Path(__file__).with_name("stock.py"))
stock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stock)  # make (the draw), Env and metrics (design 4's grading, read off the answer "A|B")

TEMPLATES = [  # {n} name, {i} items, {u} units, {a} items per unit, {b} units now, {k} units arriving later
    "{n} has {b} {u} with {a} {i} in each. Later {k} more {u} of {a} {i} arrive. How many {i} are there now, and how many {i} do the new {u} bring?",
    "A shop fills {b} {u} with {a} {i} each. Then {k} more {u} come, also with {a} {i} each. How many {i} did it fill, and how many {i} came?",
    "There are {a} {i} in each of {b} {u}. {n} orders {k} extra {u} of the same size. How many {i} are there, and how many {i} are ordered?",
    "{n} stacks {b} {u}; each holds {a} {i}. Then {k} new {u} of {a} {i} come in. Count the {i} in the first {u}, and the {i} in the new ones.",
    # held out: the late boxes first
    "{k} {u} of {a} {i} each will arrive tomorrow. Today {n} has {b} such {u}. How many {i} are there today, and how many {i} will arrive?",
    "After {k} more {u} come, each with {a} {i}, how many {i} will have come, if {n} now has {b} {u} of {a} {i}? And how many {i} are there now?",
]
TRAIN_TEMPLATES, HELD_OUT_TEMPLATES = TEMPLATES[:4], TEMPLATES[4:]


def load(cfg):
    make = lambda split, count: stock.make(split, cfg.seed, count, "cargo", "cargo ", TRAIN_TEMPLATES, HELD_OUT_TEMPLATES,
                                           answer=lambda a, b, k: (a * b, a * k))
    return make("train", 400), make("test", 48)


# Worked examples that are not cargo stories: products only, so the operation is given and the operands are
# learned (design 5's train, and a product in place of its sum); design 5's prompt
EXAMPLES = [stock.PAIR_EXAMPLES[0], {"user": "Problem: A farm has 23 pens with 9 hens in each. How many hens are there?",
                                     "assistant": "\\calc{23*9}"}]
PROMPT = stock.PAIR_PROMPT
PART_A, PART_B = "items there now", "items the later containers bring"
CLERK = {"role": "clerk", "graded": True, "system_prompt": "You are a stock clerk with a calculator. Write the number "
         f"of {PART_A} and the number of {PART_B}, in that order, each as one arithmetic expression in \\calc{{...}}. "
         "Do not compute them yourself.",
         "examples": [{"user": "Problem: A train has 12 cars with 40 seats in each, and a second train 8 cars with 25 "
                       "seats in each. How many seats are in the first train, and how many in the second?",
                       "assistant": "\\calc{12*40} \\calc{8*25}"}]}
STOCK_CLERK = {"role": "stock_clerk", "graded": True, "system_prompt": PROMPT.format(PART_A), "examples": EXAMPLES}
DELIVERY_CLERK = {"role": "delivery_clerk", "graded": True, "system_prompt": PROMPT.format(PART_B), "examples": EXAMPLES}

task = Task(name="cargo", load=load, make_env=stock.make_env, metrics=stock.metrics,
            organisations={"solo": {"agents": [CLERK], "dependencies": []},
                           "pair": {"agents": [STOCK_CLERK, DELIVERY_CLERK], "dependencies": []}},
            options={"temperature": 0.7, "max_new_tokens": 24, "eval_problems": 48})
