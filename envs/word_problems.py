"""Word problems whose arithmetic is beyond the embedded 135M model: the data of the tool task.

Short stories (TEMPLATES) around three-digit × two-digit products or sums of three-digit numbers, in one step or
two, graded like any math problem on the exact integer. Held out by operands (`held_out`) and by template
(HELD_OUT_TEMPLATES, only in "test": does writing the expression carry over to a new story?). STEPPING_STONES, only
in "train", break the two-step story `stamps` into smaller stories (docs/tools.md, "Stepping stones").
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Callable

from .problems import Problem


@dataclass(frozen=True)
class Template:
    name: str
    text: str  # the story, with {a}, {b}, {c}
    operands: tuple[range, ...]  # where each of a, b, c is drawn from
    answer: Callable[..., int]
    expression: str  # the expression a caller would write, with {a}, {b}, {c}


THREE_DIGITS, TWO_DIGITS = range(100, 1000), range(11, 100)
TEMPLATES = (
    Template("boxes", "A box holds {a} pens. How many pens are in {b} boxes?", (THREE_DIGITS, TWO_DIGITS),
             lambda a, b: a * b, "{a}*{b}"),
    Template("rows", "A farmer plants {b} rows of {a} trees each. How many trees does she plant?",
             (THREE_DIGITS, TWO_DIGITS), lambda a, b: a * b, "{b}*{a}"),
    Template("floors", "A library has {a} books on its first floor, {b} on its second and {c} on its third. "
             "How many books does it have?", (THREE_DIGITS,) * 3, lambda a, b, c: a + b + c, "{a}+{b}+{c}"),
    Template("stamps", "Tom had {a} stamps and bought {b} packs of {c} stamps. How many stamps does he have now?",
             (THREE_DIGITS, TWO_DIGITS, TWO_DIGITS), lambda a, b, c: a + b * c, "{a}+{b}*{c}"),
    Template("tickets", "A theatre sold {a} tickets on Friday and {b} tickets on Saturday. How many tickets did "
             "it sell on the two days?", (THREE_DIGITS, THREE_DIGITS), lambda a, b: a + b, "{a}+{b}"),
    Template("crates", "A shop receives {b} crates of {a} apples and sells {c} apples. How many apples are left?",
             (THREE_DIGITS, TWO_DIGITS, THREE_DIGITS), lambda a, b, c: a * b - c, "{a}*{b}-{c}"),
)
STEPPING_STONES = (  # the smaller stories of the two-step story "stamps"
    Template("stamps_packs", "Tom bought {b} packs of {c} stamps. How many stamps did he buy?",
             (THREE_DIGITS, TWO_DIGITS, TWO_DIGITS), lambda a, b, c: b * c, "{b}*{c}"),
    Template("stamps_given", "Tom had {a} stamps and then got {b}*{c} more stamps. How many stamps does he have now?",
             (THREE_DIGITS, TWO_DIGITS, TWO_DIGITS), lambda a, b, c: a + b * c, "{a}+{b}*{c}"),
    Template("stamps_spelled", "Tom had {a} stamps and bought {b} packs of {c} stamps, that is {b}*{c} new stamps. "
             "How many stamps does he have now?", (THREE_DIGITS, TWO_DIGITS, TWO_DIGITS), lambda a, b, c: a + b * c,
             "{a}+{b}*{c}"),
)
STONE_NAMES = tuple(stone.name for stone in STEPPING_STONES)  # only in "train"
TEMPLATE_NAMES = tuple(t.name for t in TEMPLATES) + STONE_NAMES
HELD_OUT_TEMPLATES = ("rows", "crates")  # only in "test": one product, one two-step story
TEST_FRACTION = 0.25


def held_out(operands: tuple[int, ...]) -> bool:
    """Whether an operand tuple is in "test" (a TEST_FRACTION of them): a stable hash (blake2b) of its numbers
    in sorted order, whatever the template and seed, so no held-out tuple, nor its commuted twin, is trained on."""
    digest = hashlib.blake2b(",".join(map(str, sorted(operands))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 1000 < TEST_FRACTION * 1000


def word_problem(template: Template, operands: tuple[int, ...]) -> Problem:
    names = dict(zip("abc", operands))
    answer = template.answer(*operands)
    return Problem(problem=template.text.format(**names), answer=str(answer), level=template.name, type="Word problem",
                   solution=f"{template.expression.format(**names)} = {answer}, so the answer is $\\boxed{{{answer}}}$.")


def make_word_problems(split: str, seed: int = 0, count: int = 50) -> list[Problem]:
    """`count` problems of every template of `split` ("train": all but HELD_OUT_TEMPLATES, then the
    STEPPING_STONES; "test": every template, no stone), interleaved one template at a time."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    trained = [t for t in TEMPLATES if t.name not in HELD_OUT_TEMPLATES] + list(STEPPING_STONES)
    templates = TEMPLATES if split == "test" else trained
    return [row for turn in zip(*(draw(template, split, seed, count) for template in templates)) for row in turn]


def draw(template: Template, split: str, seed: int, count: int) -> list[Problem]:
    """`count` problems of one template whose operand tuples belong to `split`, each tuple drawn at most once."""
    rng, seen, rows = random.Random(f"word-seed{seed}-{template.name}"), set(), []
    while len(rows) < count:
        operands = tuple(rng.choice(where) for where in template.operands)
        if operands not in seen and held_out(operands) == (split == "test"):
            seen.add(operands)
            if template.answer(*operands) >= 0:  # a story never ends with a negative count
                rows.append(word_problem(template, operands))
    return rows
