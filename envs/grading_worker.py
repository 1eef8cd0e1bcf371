"""The math-verify worker process that `envs.grader.Grader` starts.

Run as a script (`python grading_worker.py`), never imported by the rest of the project.
It imports math-verify once, prints "ready", then answers requests until stdin closes:

    request  (one line on stdin):  a JSON list [gold, prediction]
    reply    (one line on stdout): correct | wrong | unparseable | gold-unparseable

Both answers are parsed as `$\\boxed{answer}$` and compared with `verify(gold, prediction)`,
gold first (math-verify is not symmetric). math-verify's own SIGALRM time limits are turned
off: the parent process enforces the time limit by killing this process.

It imports only the standard library and math-verify, so it runs by file path without
the project on `sys.path`.
"""

import json
import logging
import sys


def boxed_as_latex(answer: str) -> str:
    """The string handed to math-verify's `parse` for an answer (gold or predicted)."""
    return "$\\boxed{" + answer + "}$"


def grade_pair(gold: str, prediction: str) -> str:
    """The outcome of one (gold, predicted answer) pair; both are `\\boxed{}` contents.

    `parse` returns a list: sympy objects for what it could read as math, plus the raw
    string as a fallback. A prediction that yields no sympy object at all (e.g. `?`) and
    does not match the gold string for string is "unparseable", not "wrong".
    """
    from math_verify import parse, verify

    gold_parsed = parse(boxed_as_latex(gold), parsing_timeout=None)
    if not gold_parsed:
        return "gold-unparseable"  # a data error: the parent raises on it
    prediction_parsed = parse(boxed_as_latex(prediction), parsing_timeout=None)
    if verify(gold_parsed, prediction_parsed, timeout_seconds=None):
        return "correct"
    read_as_math = any(not isinstance(item, str) for item in prediction_parsed)
    return "wrong" if read_as_math else "unparseable"


def serve(requests, replies) -> None:
    """Answer each request line with one reply line until `requests` ends."""
    for line in requests:
        gold, prediction = json.loads(line)
        try:
            outcome = grade_pair(gold, prediction)
        except Exception:  # math-verify catches most errors itself; keep serving
            outcome = "unparseable"
        replies.write(outcome + "\n")
        replies.flush()


def main() -> None:
    # Python put this script's folder (envs/) first on sys.path; drop it so that files
    # such as envs/grader.py can never shadow a module math-verify imports.
    del sys.path[0]
    # Replies go to the real stdout; anything a library prints goes to stderr instead,
    # so it cannot corrupt the reply stream.
    sys.stdin.reconfigure(encoding="utf-8")
    replies = sys.stdout
    replies.reconfigure(encoding="utf-8")
    sys.stdout = sys.stderr
    # math-verify warns that its own timeouts are off; the parent enforces the limit.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    grade_pair("1", "1")  # import math-verify and warm its parser before saying ready

    replies.write("ready\n")
    replies.flush()
    serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
