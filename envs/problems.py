"""Math problems: `Problem` (a question and its gold answer), `extract_boxed` (the last `\\boxed{...}` of a
text: gold answers of MATH solutions, final answers of responses), `row_to_problem` (one MATH or GSM8K row) and
`make_arithmetic_problems` (the generated offline default task). Reading a data set is envs/data.py's.

The gold answer is kept as the data gives it (a LaTeX string), never cut to the "last number in the text"
(README, "Pitfalls avoided": `\\frac{1}{2}` would become `2`). Malformed rows raise a ValueError naming them.
"""
from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One question; level ("Level 3") and type ("Algebra") are "" when the data has none."""
    problem: str  # the question text shown to the agents
    answer: str  # the gold answer as a LaTeX string (e.g. `\\frac{1}{2}`), as the data gives it
    level: str
    type: str
    solution: str = ""  # a worked solution
    tests: tuple[str, ...] = ()  # code tasks only: Python statements the program must pass (envs/code_problems.py)
    prelude: str = ""  # code tasks only: code run before the program (HumanEval: the prompt, its imports and helpers)


# --- \boxed{...} extraction ---------------------------------------------------------------
_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])(\s*)")  # not a longer command such as `\boxedfoo`; its spaces
_BRACE_OR_ESCAPE = re.compile(r"\\.|[{}]", re.DOTALL)  # a brace, or an escaped character (`\{`: a literal brace)
_BRACELESS_ARGUMENT = re.compile(r"[^\s$]*")  # the argument of `\boxed 5`: up to whitespace or `$`


def _matching_brace_end(text: str, open_index: int) -> int | None:
    """Index just past the `}` that closes the `{` at `open_index`, or None if unclosed. Escaped braces
    `\\{` and `\\}` (literal braces in LaTeX) do not count."""
    depth = 0
    for token in _BRACE_OR_ESCAPE.finditer(text, open_index):
        depth += {"{": 1, "}": -1}.get(token.group(), 0)
        if depth == 0:
            return token.end()
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`, or brace-less `\\boxed 5`).

    Braces nest: `\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`; a box inside a box is part of the outer one.
    None when the text has no box, or when its last box is never closed (a response cut off mid-answer):
    the final answer is then missing, and an earlier box is no substitute for it.
    """
    last_content: str | None = None
    search_from = 0
    while (match := _BOX_COMMAND.search(text, search_from)) is not None:
        argument_start = match.end()  # past the command and the whitespace after it
        if text.startswith("{", argument_start):
            closing_end = _matching_brace_end(text, argument_start)
            if closing_end is None:
                return None  # the last box is unclosed
            last_content = text[argument_start + 1 : closing_end - 1]
            search_from = closing_end
        elif match.group(1):  # `\boxed 5`: needs whitespace after the command
            argument_end = _BRACELESS_ARGUMENT.match(text, argument_start).end()
            if argument_end > argument_start:
                last_content = text[argument_start:argument_end]
            search_from = argument_end
        else:
            search_from = argument_start  # e.g. `\boxed` at the very end: no argument
    return last_content


# --- Raw rows -> Problem -------------------------------------------------------------------
_GSM8K_ANSWER_MARK = "####"
_THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d)")  # a comma between digits: 1,000 -> 1000


def _text_field(row: dict, key: str, where: str) -> str | None:
    """The string value of `row[key]`, None if absent; numbers become strings."""
    value = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{where}: field {key!r} should be a string, got {type(value).__name__}. "
                         f"Fix the row so {key!r} holds text.")
    return str(value)


def row_to_problem(row: dict, where: str) -> Problem:
    """Turn one raw data row into a `Problem`; `where` (e.g. "file.jsonl:17") names it in errors.

    Formats understood:
    * MATH: `problem` + `solution`; gold = content of the last `\\boxed{}` of the solution.
      An explicit `answer` field (as in MATH-500) wins when present.
    * GSM8K: `question` + `answer`, where the gold follows `#### ` at the end of `answer`
      (thousands commas removed: `1,000` -> `1000`); the text before it is the solution.
    """
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object with 'problem' (or 'question') and a gold answer, "
                         f"got {type(row).__name__}.")
    question = _text_field(row, "problem" if row.get("problem") is not None else "question", where)
    if question is None or not question.strip():
        raise ValueError(f"{where}: no question text. Give the row a non-empty 'problem' field "
                         f"(MATH format) or 'question' field (GSM8K format).")
    answer_field = _text_field(row, "answer", where)
    solution = _text_field(row, "solution", where) or ""
    if answer_field is not None and _GSM8K_ANSWER_MARK in answer_field:
        solution, _, gold = answer_field.rpartition(_GSM8K_ANSWER_MARK)
        solution, gold = solution.strip(), _THOUSANDS_COMMA.sub("", gold.strip())
    elif answer_field is not None:
        gold = answer_field.strip()
    else:
        gold = (extract_boxed(solution) or "").strip()
        if solution and not gold:
            raise ValueError(f"{where}: the 'solution' has no non-empty \\boxed{{...}} to take the gold "
                             f"answer from. Box the final answer in the solution, or add an 'answer' field.")
    if not gold:
        raise ValueError(f"{where}: no gold answer found. Add an 'answer' field, or a 'solution' whose "
                         f"final answer is written as \\boxed{{...}} (MATH format), or end the 'answer' "
                         f"with '#### <number>' (GSM8K format).")
    level = row.get("level")
    if isinstance(level, int) and not isinstance(level, bool):  # MATH writes "Level 3"; MATH-500 the bare number 3
        level = f"Level {level}"
    return Problem(problem=question, answer=gold, level="" if level is None else str(level),
                   type=str(row.get("type") or row.get("subject") or ""), solution=solution)


# --- The generated arithmetic task. Each level: (operator, left operands, right operands) ----
_ARITHMETIC_LEVELS = {
    1: ("+", range(10), range(10)),  # one-digit addition: 100 pairs
    2: ("*", range(10), range(10)),  # one-digit multiplication: 100 pairs
    3: ("+", range(10, 100), range(10)),  # two-digit plus one-digit: 900 pairs
    4: ("*", range(10, 100), range(10)),  # two-digit times one-digit: 900 pairs
}
ARITHMETIC_TEST_FRACTION = 0.25
# The main job's task (README, "Results of the default run"): one-digit multiplication, which the
# base model mostly solves greedily, and two-digit plus one-digit addition, which it mostly fails.
DEFAULT_ARITHMETIC_LEVELS = (2, 3)


def _arithmetic_problem(level: int, operator: str, left: int, right: int) -> Problem:
    result = left + right if operator == "+" else left * right
    return Problem(problem=f"What is {left} {operator} {right}?", answer=str(result), level=f"Level {level}",
                   type="Arithmetic",
                   solution=f"{left} {operator} {right} = {result}, so the answer is $\\boxed{{{result}}}$.")


def _arithmetic_level_split(level: int, split: str, seed: int) -> list[Problem]:
    """One level's rows of one split, shuffled and cut on its own (a problem's split never depends on the other
    levels requested), by *unordered* operand pair: a ∘ b and b ∘ a land in the same split."""
    operator, lefts, rights = _ARITHMETIC_LEVELS[level]
    twins: dict[tuple[int, int], list[Problem]] = {}
    for a in lefts:
        for b in rights:
            twins.setdefault((min(a, b), max(a, b)), []).append(_arithmetic_problem(level, operator, a, b))
    groups = list(twins.values())
    # A string seed is hashed deterministically (not by Python's randomised str hash).
    random.Random(f"arithmetic-seed{seed}-level{level}").shuffle(groups)
    total = sum(len(g) for g in groups)
    test_count, test = max(1, round(ARITHMETIC_TEST_FRACTION * total)), []
    while len(test) < test_count:
        test += groups.pop(0)
    return test if split == "test" else [p for g in groups for p in g]


def make_arithmetic_problems(split: str, seed: int = 0,
                             levels: tuple[int, ...] | list[int] = DEFAULT_ARITHMETIC_LEVELS) -> list[Problem]:
    """The project's offline task, in MATH's schema, e.g. "What is 7 + 5?" -> "12".

    Every operand pair of a level is enumerated; 25% of each level (at least 1, rounded up to whole twin
    pairs) is "test", the rest "train"; train and test never share a problem, nor a commuted twin. The levels'
    shuffled rows are interleaved (one of each in turn), so the first N rows weigh every requested level alike.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    unknown = [level for level in levels if level not in _ARITHMETIC_LEVELS]
    if unknown or not levels:
        raise ValueError(f"arithmetic levels must be a non-empty subset of {sorted(_ARITHMETIC_LEVELS)}, "
                         f"got {list(levels)}")
    by_level = []
    for level in dict.fromkeys(levels):  # each requested level once, in order
        rows = _arithmetic_level_split(level, split, seed)
        random.Random(f"arithmetic-seed{seed}-{split}-level{level}-order").shuffle(rows)
        by_level.append(rows)
    return [row for turn in itertools.zip_longest(*by_level) for row in turn if row is not None]
