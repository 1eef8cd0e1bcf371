"""A task under study (results/team-wins/, design 9): three notes, each the context of one part, read alone.

    python marft.py --task examples/desks.py --agents solo
    python marft.py --task examples/desks.py --agents trio [--shared_adapter]

A problem is three notes about three depots. Each note gives a count per box (a, 3 digits), the boxes there now
(b, 2 digits) and the boxes that arrive later with as many items each (k, 2 digits), with its own numbers. Part A
is note 1's items there now, a·b; part B note 2's items the late boxes bring, a·k; part C note 3's boxes at the
end, b + k. All three are answered in \\calc{...} (the calculator evaluates them). 6 wordings of a note, 2 held
out (they name the late boxes first); a held-out problem's three notes all take held-out wordings or all
training ones, and their operands are disjoint from the training ones.

    solo    one clerk reads the three notes and writes the three expressions (\\calc{A} \\calc{B} \\calc{C})
    trio    a stock clerk (part A), a delivery clerk (part B) and a box clerk (part C), D ≡ 0, each reading only
            its own note: the Flex-POMDP's own observation o^j (the environment's reset() gives each role its
            note; the centralised critic reads all three). Their prompts are examples/depot.py's: they differ only
            in the words naming the part, the product clerks read the same products, the box clerk sums.
            --shared_adapter: the three roles on one adapter

Grading and pay as examples/stock.py's (its `Env`): part A holds when one of the clerk's first three
expressions (the trio's first role's only one) is worth note 1's a·b, likewise part B and part C; reward
(A + B + C) / 3, correct when all three hold; each part's writer is paid a third of a point for it.
"""
import importlib.util
import random
from pathlib import Path

from tasks import Task


def _load(name):
    spec = importlib.util.spec_from_file_location(f"marft_task_{name}_for_desks", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


stock, depot = _load("stock"), _load("depot")  # stock: Problem, Env, metrics and the held-out operands; depot: the prompts

NOTES = [  # {n} name, {i} items, {u} units, {a} items per unit, {b} units now, {k} units arriving later
    "{n} has {b} {u} with {a} {i} in each. Later {k} more {u} of {a} {i} arrive.",
    "A shop fills {b} {u} with {a} {i} each. Then {k} more {u} come, also with {a} {i} each.",
    "There are {a} {i} in each of {b} {u}. {n} orders {k} extra {u} of the same size.",
    "{n} stacks {b} {u}; each holds {a} {i}. Then {k} new {u} of {a} {i} come in.",
    # held out: the late boxes first
    "{k} {u} of {a} {i} each will arrive tomorrow. Today {n} has {b} such {u}.",
    "After {k} more {u} come, each with {a} {i}, {n} will have them and the {b} {u} of {a} {i} {n} has now.",
]
TRAIN_NOTES, HELD_OUT_NOTES = NOTES[:4], NOTES[4:]
SALT = "desks "  # the held-out split of a note's operands (stock.held_out_operands)


def make(split, seed, count):
    """`count` problems of `split`: three notes each (test: every note's operands held out, the held-out wordings
    in every other problem, first); the answer "A|B|C" reads part A off note 1, B off note 2, C off note 3."""
    rng, rows, seen = random.Random(f"desks-{seed}-{split}"), [], set()
    while len(rows) < count:
        held_wording = split == "test" and len(rows) % 2 == 0
        notes, triples = [], []
        for _ in range(3):
            while True:
                a, b, k = rng.randrange(100, 1000), rng.randrange(11, 100), rng.randrange(11, 100)
                if (a, b, k) not in seen and b != k and stock.held_out_operands(a, b, k, SALT) == (split == "test"):
                    break
            seen.add((a, b, k))
            items, units = rng.choice(stock.ITEMS)
            notes.append(rng.choice(HELD_OUT_NOTES if held_wording else TRAIN_NOTES).format(
                n=rng.choice(stock.NAMES), i=items, u=units, a=a, b=b, k=k))
            triples.append((a, b, k))
        (a1, b1, _), (a2, _, k2), (_, b3, k3) = triples
        kind = "held_out_template" if held_wording else "train_template"
        text = "\n".join(f"Note {j}: {note}" for j, note in enumerate(notes, 1))
        rows.append(stock.Problem(problem=text, answer=f"{a1 * b1}|{a2 * k2}|{b3 + k3}", level=kind, type=kind))
    return rows


def load(cfg):
    return make("train", cfg.seed, 400), make("test", cfg.seed, 48)


def notes(problem_text):
    """The three notes of a problem's text, without their "Note j: " labels."""
    return [line.split(": ", 1)[1] for line in problem_text.split("\n")]


class Env(stock.Env):
    """examples/stock.py's grading; o^j: the clerk reads the three notes, the trio's role j only note j."""
    def reset(self, seed=None):
        if "clerk" in self.roles:
            return self.problem.problem
        return {role: note for role, note in zip(self.roles, notes(self.problem.problem))}


def make_env(problem, cfg, context):
    return Env(problem, list(context.role_rewards))  # role_rewards: every role of the organisation


CLERK = {"role": "clerk", "graded": True, "system_prompt": "You are a stock clerk with a calculator. Write the number "
         f"of {depot.PART_A} in note 1, the number of {depot.PART_B} in note 2 and the number of {depot.PART_C} in "
         "note 3, in that order, each as one arithmetic expression in \\calc{...}. Do not compute them yourself.",
         "examples": [{"user": "Problem: Note 1: A train has 12 cars with 40 seats in each. Later 8 more cars with 40 "
                       "seats each are added.\nNote 2: A farm has 23 pens with 9 hens in each. Later 6 more pens of 9 hens "
                       "are built.\nNote 3: A dock has 14 boats with 5 crates in each. Then 7 more boats of 5 crates come.",
                       "assistant": "\\calc{12*40} \\calc{9*6} \\calc{14+7}"}]}

task = Task(name="desks", load=load, make_env=make_env, metrics=stock.metrics,
            organisations={"solo": {"agents": [CLERK], "dependencies": []},
                           "trio": {"agents": [depot.STOCK_CLERK, depot.DELIVERY_CLERK, depot.BOX_CLERK], "dependencies": []}},
            options={"temperature": 0.7, "max_new_tokens": 40, "eval_problems": 48})
