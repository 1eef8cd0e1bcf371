"""A task under study: shipping orders with two parts of different kinds (results/team-wins/).

    python marft.py --task examples/orders.py --agents split           (or solo, team; --shared_adapter)

Part A, a product beyond the model (a 3-digit count × a 2-digit count): the calculator's job.
Part B, the destination city, read off a story whose wording varies (6 templates; 2 held out, seen
only in the held-out set): a reader's job. Graded per part on the graded agent's \\boxed{} answers;
reward (A + B) / 2, correct when both. Per-part shaping, the same for every organisation where a
role exists: the agent that writes \\calc{} is paid 0.5 when its expression is worth a·b, the agent
that names the city (the reader, else the answerer) 0.5 when its response holds the city.

    solo    caller → calculator → answerer (graded: both parts in its boxes)
    team    caller → calculator, a reader (reads the problem alone), an answerer reading both
    split   caller → calculator, and a graded reader: part A is the calculator's result, part B the
            reader's box (two learner turns per episode, as solo)
"""
import hashlib
import random
import re

import tools
from envs import Problem
from tasks import Task

NAMES = ["Tom", "Ana", "Li", "Omar", "Eva", "Raj", "Kim", "Sam", "Noor", "Ivan"]
CITIES = ["Lisbon", "Oslo", "Cairo", "Lima", "Dublin", "Quito", "Hanoi", "Perth", "Tunis", "Riga", "Bern", "Kyoto",
          "Accra", "Porto", "Turin", "Split"]
OTHER = ["Madrid", "Vienna", "Boston", "Denver", "Milan", "Seoul"]  # distractor cities, never the answer
TEMPLATES = [  # {n} name, {a} per box, {b} boxes, {c} destination, {d} a distractor city
    "{n} packs {a} pens into each of {b} boxes and sends the boxes to {c}. How many pens are sent, and to which city?",
    "A factory in {d} fills {b} crates with {a} bolts each. The crates travel to {c}. How many bolts arrive, and where?",
    "{n} flies from {d} to {c} with {b} cases; every case holds {a} cards. How many cards reach the city, and which city is it?",
    "There are {b} trucks, each carrying {a} bricks, driving to {c} for {n}. How many bricks, and which city?",
    # held out: new wordings, the destination before the numbers
    "Destination: {c}. {n} ships {b} pallets of {a} cans each, by way of {d}. How many cans, and which destination?",
    "{c} orders {b} boxes of {a} nails from {n}'s shop in {d}. How many nails go out, and to which city?",
]
TRAIN_TEMPLATES, HELD_OUT_TEMPLATES = TEMPLATES[:4], TEMPLATES[4:]


def held_out_operands(a, b):
    return int.from_bytes(hashlib.blake2b(f"{a},{b}".encode(), digest_size=8).digest(), "big") % 4 == 0


def make(split, seed, count):
    rng, rows, seen = random.Random(f"orders-{seed}-{split}"), [], set()
    templates = HELD_OUT_TEMPLATES + TRAIN_TEMPLATES if split == "test" else TRAIN_TEMPLATES
    while len(rows) < count:
        a, b = rng.randrange(100, 1000), rng.randrange(11, 100)
        if (a, b) in seen or held_out_operands(a, b) != (split == "test"):
            continue
        seen.add((a, b))
        k = len(rows) % len(templates)  # test: held-out templates first, alternating
        text = templates[k].format(n=rng.choice(NAMES), a=a, b=b, c=rng.choice(CITIES), d=rng.choice(OTHER))
        kind = "held_out_template" if templates[k] in HELD_OUT_TEMPLATES else "train_template"
        rows.append(Problem(problem=text, answer=f"{a * b}|{text_city(text)}", level=kind, type=kind))
    return rows


def text_city(text):
    return next(c for c in CITIES if c in text)


def load(cfg):
    return make("train", cfg.seed, 400), make("test", cfg.seed, 48)


BOX = re.compile(r"\\boxed\{([^{}]*)\}")


def calc_value(response):
    calls = tools.CALL.findall(response)
    if len(calls) != 1:
        return None
    try:
        return tools.calculate(calls[0])
    except tools.CalculatorError:
        return None


class Env:
    def __init__(self, problem, graded, roles):
        self.problem, self.graded, self.roles = problem, graded, roles

    def reset(self, seed=None):
        return self.problem.problem

    def step(self, joint):
        number, city = self.problem.answer.split("|")
        text = " ".join(joint.get(r, "") for r in self.graded)
        boxes = [b.strip().replace(",", "") for b in BOX.findall(text)]
        split = "reader" in self.graded  # the split team: part A is the calculator's result, part B the reader's box
        part_a = calc_value(joint.get("caller", "")) == int(number) if split else number in boxes
        part_b = any(b.lower() == city.lower() for b in boxes)
        outcome = "unparseable" if not boxes else "correct" if part_a and part_b else "wrong"
        role_rewards = {}
        if "caller" in joint:
            role_rewards["caller"] = 0.5 * float(calc_value(joint["caller"]) == int(number))
        namer = "reader" if "reader" in self.roles else self.graded[0]
        if namer in joint:
            role_rewards[namer] = role_rewards.get(namer, 0.0) + 0.5 * float(city.lower() in joint[namer].lower())
        return "", (part_a + part_b) / 2, True, {"correct": part_a and part_b, "outcomes": {r: outcome for r in self.graded},
                                                 "part_a": part_a, "part_b": part_b, "role_rewards": role_rewards,
                                                 "level": self.problem.level}


def make_env(problem, cfg, context):
    return Env(problem, list(context.graded_roles), list(context.role_rewards))  # role_rewards: every role


def metrics(infos):
    out = {"part_a": sum(i["part_a"] for i in infos) / len(infos), "part_b": sum(i["part_b"] for i in infos) / len(infos)}
    held = [i for i in infos if i["level"] == "held_out_template"]
    if held:
        out["held_out_template"] = sum(i["correct"] for i in held) / len(held)
    return out


EX = "Mia packs 12 cups into each of 34 crates and sends the crates to Paris. How many cups are sent, and to which city?"
CALLER = {"role": "caller", "system_prompt": "You are the caller of a team with a calculator. Write the arithmetic that "
          "answers the problem's count as one expression in \\calc{...}. Do not compute it yourself.",
          "examples": [{"user": "Problem: " + EX, "assistant": "\\calc{12*34}"}]}
CALCULATOR = {"role": "calculator", "tool": "calculator"}
SOLO_ANSWERER = {"role": "answerer", "graded": True, "system_prompt": "You are the answerer of a team. The calculator has "
                 "evaluated the caller's expression. Give its result as \\boxed{N} and the destination city of the problem "
                 "as \\boxed{City}.",
                 "examples": [{"user": "Problem: " + EX + "\n\nCaller: \\calc{12*34}\n\nCalculator: 12*34 = 408",
                               "assistant": "408 cups, sent to Paris. \\boxed{408} \\boxed{Paris}"}]}
READER = {"role": "reader", "system_prompt": "You are the reader of a team. Name the city the goods are sent to, "
          "in one short sentence. Do not count anything.",
          "examples": [{"user": "Problem: " + EX, "assistant": "The goods are sent to Paris."}]}
TEAM_ANSWERER = {"role": "answerer", "graded": True, "system_prompt": "You are the answerer of a team. Give the calculator's "
                 "result as \\boxed{N} and the reader's city as \\boxed{City}.",
                 "examples": [{"user": "Problem: " + EX + "\n\nCaller: \\calc{12*34}\n\nCalculator: 12*34 = 408\n\n"
                               "Reader: The goods are sent to Paris.",
                               "assistant": "\\boxed{408} \\boxed{Paris}"}]}
SPLIT_READER = {"role": "reader", "graded": True, "system_prompt": "You are the reader of a team. Give the city the goods "
                "are sent to as \\boxed{City}. Do not count anything.",
                "examples": [{"user": "Problem: " + EX, "assistant": "The goods are sent to Paris. \\boxed{Paris}"}]}
SOLO = {"agents": [CALLER, CALCULATOR, SOLO_ANSWERER],
        "dependencies": [["caller", "calculator"], ["caller", "answerer"], ["calculator", "answerer"]]}
TEAM = {"agents": [CALLER, CALCULATOR, READER, TEAM_ANSWERER],
        "dependencies": [["caller", "calculator"], ["caller", "answerer"], ["calculator", "answerer"], ["reader", "answerer"]]}

SPLIT = {"agents": [CALLER, CALCULATOR, SPLIT_READER], "dependencies": [["caller", "calculator"]]}

task = Task(name="orders", load=load, make_env=make_env, organisations={"solo": SOLO, "team": TEAM, "split": SPLIT},
            metrics=metrics, options={"temperature": 0.7, "max_new_tokens": 32, "eval_problems": 48})
