"""A task under study (results/team-wins/, designs 4 and 5): two calculations of different kinds from one story.

    python marft.py --task examples/stock.py --agents solo
    python marft.py --task examples/stock.py --agents team [--shared_adapter]
    python marft.py --task examples/stock.py --agents pair [--shared_adapter]

Each story gives a count per box (a, 3 digits), a number of boxes (b, 2 digits) and a number of boxes
that arrive later (k, 2 digits). Part A is the items packed, a·b; part B the boxes at the end, b + k.
Both are answered as arithmetic in \\calc{...}, which the environment evaluates exactly (the calculator),
so what is learned is which numbers go with which operation. The same numbers take part in both
parts with different operators: the formats conflict (hypothesis 2 of the issue). 6 wordings, 2 held
out (they ask the two questions in the other order and name the late boxes first); held-out operands
are disjoint from the training ones.

    solo    one clerk writes both expressions (\\calc{A} \\calc{B}): one learner turn
    team    a packer writes part A's, a counter part B's; neither reads the other (D ≡ 0): two learner
            turns, of half the length each. --shared_adapter: the same two roles on one adapter
    pair    design 5: the same split, by an item clerk and a box clerk whose prompts differ only in the
            words naming their part and whose two worked examples are not stock stories

Grading: part A holds when one of the clerk's first two expressions (a team's first role's only one)
is worth a·b, part B likewise for b + k (the second role's). Reward (A + B) / 2, correct when both; per-part shaping
0.5 · A to whoever writes part A and 0.5 · B to whoever writes part B (the clerk gets both).
"""
import hashlib
import random

import tools
from envs import Problem
from tasks import Task

NAMES = ["Tom", "Ana", "Li", "Omar", "Eva", "Raj", "Kim", "Sam", "Noor", "Ivan"]
ITEMS = [("pens", "boxes"), ("bolts", "crates"), ("cards", "cases"), ("bricks", "pallets"), ("cans", "trays"),
         ("nails", "bags")]
TEMPLATES = [  # {n} name, {i} items, {u} units, {a} items per unit, {b} units, {k} units arriving later
    "{n} packs {a} {i} into each of {b} {u}. Later {k} more {u} arrive. How many {i} are packed, and how many {u} are there?",
    "A shop fills {b} {u} with {a} {i} each, and then gets {k} more {u}. How many {i} did it pack, and how many {u} does it have?",
    "There are {b} {u} with {a} {i} in each. {n} brings {k} extra {u}. How many {i} are in the {b} {u}, and how many {u} in all?",
    "{n} has {b} {u}; each holds {a} {i}. Then {k} new {u} come in. Count the {i} in the first {u}, and the {u} at the end.",
    # held out: the late boxes first, the questions in the other order
    "{k} {u} will arrive tomorrow. Today {n} has {b} {u}, each with {a} {i}. How many {u} will there be, and how many {i} are there today?",
    "After {k} more {u} come, how many {u} does {n} have, if {n} now has {b} {u} of {a} {i}? And how many {i} is that now?",
]
TRAIN_TEMPLATES, HELD_OUT_TEMPLATES = TEMPLATES[:4], TEMPLATES[4:]
PART_NAMES = ["part_a", "part_b", "part_c"]


def held_out_operands(a, b, k, salt=""):
    return int.from_bytes(hashlib.blake2b(f"{salt}{a},{b},{k}".encode(), digest_size=8).digest(), "big") % 4 == 0


def make(split, seed, count, name="stock", salt="", train=TRAIN_TEMPLATES, held_out=HELD_OUT_TEMPLATES,
         answer=lambda a, b, k: (a * b, b + k)):
    """`count` problems of `split` (test: the held-out operands, wordings `held_out` first, alternating with
    `train`'s); each answer "A|B" from `answer(a, b, k)`. `name` seeds the draw and `salt` the held-out
    split of the operands (examples/cargo.py draws its own with both)."""
    rng, rows, seen = random.Random(f"{name}-{seed}-{split}"), [], set()
    templates = held_out + train if split == "test" else train
    while len(rows) < count:
        a, b, k = rng.randrange(100, 1000), rng.randrange(11, 100), rng.randrange(11, 100)
        if (a, b, k) in seen or b == k or held_out_operands(a, b, k, salt) != (split == "test"):
            continue
        seen.add((a, b, k))
        template = templates[len(rows) % len(templates)]  # test: the held-out wordings first, alternating
        items, units = rng.choice(ITEMS)
        text = template.format(n=rng.choice(NAMES), i=items, u=units, a=a, b=b, k=k)
        kind = "held_out_template" if template in held_out else "train_template"
        rows.append(Problem(problem=text, answer="|".join(str(x) for x in answer(a, b, k)), level=kind, type=kind))
    return rows


def load(cfg):
    return make("train", cfg.seed, 400), make("test", cfg.seed, 48)


def values(response, limit):
    """The values of the first `limit` \\calc{} expressions of a response (None for one that does not evaluate)."""
    out = []
    for expression in tools.CALL.findall(response)[:limit]:
        try:
            out.append(tools.calculate(expression))
        except tools.CalculatorError:
            out.append(None)
    return out


class Env:
    def __init__(self, problem, roles):
        self.problem, self.roles = problem, roles

    def reset(self, seed=None):
        return self.problem.problem

    def step(self, joint):
        wanted = [int(x) for x in self.problem.answer.split("|")]  # one value per part: A, B (and C)
        if "clerk" in self.roles:  # one clerk writes every part, among its first len(wanted) expressions
            written = {"clerk": values(joint.get("clerk", ""), len(wanted))}
            writers = ["clerk"] * len(wanted)
        else:  # a team: role i writes part i, in its first expression
            writers = self.roles
            written = {role: values(joint.get(role, ""), 1) for role in self.roles}
        parts = [want in written[writer] for want, writer in zip(wanted, writers)]
        role_rewards = {}
        for holds, writer in zip(parts, writers):  # 1/n of a point to whoever writes each of the n parts
            role_rewards[writer] = role_rewards.get(writer, 0.0) + holds / len(parts)
        outcome = "unparseable" if not any(written.values()) else "correct" if all(parts) else "wrong"
        answers = {role: ",".join(str(v) for v in found if v is not None) or None for role, found in written.items()}  # maj@k's votes
        info = {"correct": all(parts), "outcomes": {r: outcome for r in self.roles}, "role_rewards": role_rewards,
                "answers": answers, "level": self.problem.level}
        info.update({name: holds for name, holds in zip(PART_NAMES, parts)})
        return "", sum(parts) / len(parts), True, info


def make_env(problem, cfg, context):
    return Env(problem, list(context.role_rewards))  # role_rewards: every role of the organisation


def metrics(infos):
    out = {name: sum(i[name] for i in infos) / len(infos) for name in PART_NAMES if name in infos[0]}
    held = [i for i in infos if i["level"] == "held_out_template"]
    if held:
        out["held_out_template"] = sum(i["correct"] for i in held) / len(held)
    return out


EX = "Mia packs 214 cups into each of 36 crates. Later 17 more crates arrive. How many cups are packed, and how many crates are there?"
CLERK = {"role": "clerk", "graded": True, "system_prompt": "You are a stock clerk with a calculator. Answer the two "
         "questions, in order, each as one arithmetic expression in \\calc{...}. Do not compute them yourself.",
         "examples": [{"user": "Problem: " + EX, "assistant": "\\calc{214*36} \\calc{36+17}"}]}
PACKER = {"role": "packer", "graded": True, "system_prompt": "You are the packer of a team with a calculator. Write the "
          "number of items packed as one multiplication in \\calc{...}. Do not compute it yourself.",
          "examples": [{"user": "Problem: " + EX, "assistant": "\\calc{214*36}"}]}
COUNTER = {"role": "counter", "graded": True, "system_prompt": "You are the counter of a team with a calculator. Write "
           "the number of boxes, crates or other containers at the end as one addition in \\calc{...}. Do not compute it yourself.",
           "examples": [{"user": "Problem: " + EX, "assistant": "\\calc{36+17}"}]}
# Design 5 (`pair`): the two specialists' prompts differ only in the words naming their part, and both
# read the same two worked examples, which are not stock stories (one of each operation): which numbers
# and which operation each part takes is left to learning, and one shared adapter has to tell the roles
# apart by those words alone.
PAIR_EXAMPLES = [{"user": "Problem: A train has 12 cars with 40 seats in each. How many seats are there?",
                  "assistant": "\\calc{12*40}"},
                 {"user": "Problem: A farm has 23 cows and buys 9 more. How many cows does it have?",
                  "assistant": "\\calc{23+9}"}]
PAIR_PROMPT = ("You are a stock clerk with a calculator. Write the number of {} as one arithmetic expression in "
               "\\calc{{...}}. Do not compute it yourself.")
ITEM_CLERK = {"role": "item_clerk", "graded": True, "system_prompt": PAIR_PROMPT.format("items packed"),
              "examples": PAIR_EXAMPLES}
BOX_CLERK = {"role": "box_clerk", "graded": True, "system_prompt": PAIR_PROMPT.format("containers at the end"),
             "examples": PAIR_EXAMPLES}
SOLO = {"agents": [CLERK], "dependencies": []}
TEAM = {"agents": [PACKER, COUNTER], "dependencies": []}
PAIR = {"agents": [ITEM_CLERK, BOX_CLERK], "dependencies": []}

task = Task(name="stock", load=load, make_env=make_env, organisations={"solo": SOLO, "team": TEAM, "pair": PAIR},
            metrics=metrics, options={"temperature": 0.7, "max_new_tokens": 24, "eval_problems": 48})
