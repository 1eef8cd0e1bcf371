"""A task under study (results/team-wins/, design 8): three parts from one story, two products and a sum.

    python marft.py --task examples/depot.py --agents solo
    python marft.py --task examples/depot.py --agents trio [--shared_adapter]

Each story gives a count per box (a, 3 digits), the boxes there now (b, 2 digits) and the boxes that
arrive later with as many items each (k, 2 digits). Part A is the items there now, a·b; part B the items
the late boxes bring, a·k; part C the boxes at the end, b + k. All three are answered in \\calc{...} (the
calculator evaluates them). 6 wordings, 2 held out (they name the late boxes first); held-out operands
are disjoint from the training ones.

    solo    one clerk writes the three expressions (\\calc{A} \\calc{B} \\calc{C}): one learner turn
    trio    a stock clerk (part A), a delivery clerk (part B) and a box clerk (part C), D ≡ 0. Their prompts
            differ only in the words naming their part; each reads worked examples of its part's kind (the
            two product clerks the same products, the box clerk sums). --shared_adapter: the three roles on
            one adapter, which has to tell the two product clerks apart by their part's words alone

Grading and pay as examples/stock.py's (its `Env`): part A holds when one of the clerk's first three
expressions (the trio's first role's only one) is worth a·b, likewise part B (a·k, the second role's)
and part C (b + k, the third's); reward (A + B + C) / 3, correct when all three hold; each part's writer
is paid a third of a point for it.
"""
import importlib.util
from pathlib import Path

from tasks import Task

_spec = importlib.util.spec_from_file_location("marft_task_stock_for_depot", Path(__file__).with_name("stock.py"))
stock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stock)  # make (the draw), Env and metrics (grading read off the answer "A|B|C")

TEMPLATES = [  # {n} name, {i} items, {u} units, {a} items per unit, {b} units now, {k} units arriving later
    "{n} has {b} {u} with {a} {i} in each. Later {k} more {u} of {a} {i} arrive. How many {i} are there now, how "
    "many {i} do the new {u} bring, and how many {u} are there at the end?",
    "A shop fills {b} {u} with {a} {i} each. Then {k} more {u} come, also with {a} {i} each. How many {i} did it "
    "fill, how many {i} came, and how many {u} does it have?",
    "There are {a} {i} in each of {b} {u}. {n} orders {k} extra {u} of the same size. How many {i} are there, how "
    "many {i} are ordered, and how many {u} will there be in all?",
    "{n} stacks {b} {u}; each holds {a} {i}. Then {k} new {u} of {a} {i} come in. Count the {i} in the first {u}, "
    "the {i} in the new ones, and the {u} at the end.",
    # held out: the late boxes first
    "{k} {u} of {a} {i} each will arrive tomorrow. Today {n} has {b} such {u}. How many {i} are there today, how "
    "many {i} will arrive, and how many {u} will there be?",
    "After {k} more {u} come, each with {a} {i}, how many {u} will {n} have, if {n} now has {b} {u} of {a} {i}? "
    "How many {i} are there now, and how many {i} will have come?",
]
TRAIN_TEMPLATES, HELD_OUT_TEMPLATES = TEMPLATES[:4], TEMPLATES[4:]


def load(cfg):
    make = lambda split, count: stock.make(split, cfg.seed, count, "depot", "depot ", TRAIN_TEMPLATES, HELD_OUT_TEMPLATES,
                                           answer=lambda a, b, k: (a * b, a * k, b + k))
    return make("train", 400), make("test", 48)


# Worked examples that are not depot stories, each role reading its own part's kind: products (examples/cargo.py's)
# for the two product clerks, sums for the box clerk
PRODUCTS = [{"user": "Problem: A train has 12 cars with 40 seats in each. How many seats are there?", "assistant": "\\calc{12*40}"},
            {"user": "Problem: A farm has 23 pens with 9 hens in each. How many hens are there?", "assistant": "\\calc{23*9}"}]
SUMS = [{"user": "Problem: A farm has 23 cows and buys 9 more. How many cows does it have?", "assistant": "\\calc{23+9}"},
        {"user": "Problem: A dock has 14 ships. Then 6 more ships arrive. How many ships are there?", "assistant": "\\calc{14+6}"}]
PROMPT = stock.PAIR_PROMPT  # "... Write the number of {part} as one arithmetic expression in \calc{...} ..."
PART_A, PART_B, PART_C = "items there now", "items the later containers bring", "containers at the end"
CLERK = {"role": "clerk", "graded": True, "system_prompt": "You are a stock clerk with a calculator. Write the number "
         f"of {PART_A}, the number of {PART_B} and the number of {PART_C}, in that order, each as one arithmetic "
         "expression in \\calc{...}. Do not compute them yourself.",
         "examples": [{"user": "Problem: A train has 12 cars with 40 seats in each. Later 8 more cars with 40 seats each "
                       "are added. How many seats were there, how many seats do the new cars add, and how many cars are "
                       "there at the end?", "assistant": "\\calc{12*40} \\calc{8*40} \\calc{12+8}"}]}
STOCK_CLERK = {"role": "stock_clerk", "graded": True, "system_prompt": PROMPT.format(PART_A), "examples": PRODUCTS}
DELIVERY_CLERK = {"role": "delivery_clerk", "graded": True, "system_prompt": PROMPT.format(PART_B), "examples": PRODUCTS}
BOX_CLERK = {"role": "box_clerk", "graded": True, "system_prompt": PROMPT.format(PART_C), "examples": SUMS}

task = Task(name="depot", load=load, make_env=stock.make_env, metrics=stock.metrics,
            organisations={"solo": {"agents": [CLERK], "dependencies": []},
                           "trio": {"agents": [STOCK_CLERK, DELIVERY_CLERK, BOX_CLERK], "dependencies": []}},
            options={"temperature": 0.7, "max_new_tokens": 40, "eval_problems": 48})
