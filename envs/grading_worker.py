"""The math-verify worker process that `envs.grader.Grader` starts as a script (never imported).

It imports math-verify once, prints "ready", then answers requests until stdin closes:

    request  (one line on stdin):  a JSON list [gold, prediction]
    reply    (one line on stdout): correct | wrong | unparseable | gold-unparseable

math-verify's own SIGALRM time limits are off: the parent enforces the limit by killing this process.
It imports only the standard library and math-verify, so it runs by file path without the project
on `sys.path`.
"""

import json
import logging
import sys


def grade_pair(gold: str, prediction: str) -> str:
    """The outcome of one (gold, predicted answer) pair; both are `\\boxed{}` contents, parsed as
    `$\\boxed{answer}$` and compared gold first (math-verify's `verify` is not symmetric).

    `parse` returns a list: sympy objects for what it could read as math, plus the raw
    string as a fallback. A prediction that yields no sympy object at all (e.g. `?`) and
    does not match the gold string for string is "unparseable", not "wrong".
    """
    from math_verify import parse, verify

    gold_parsed = parse("$\\boxed{" + gold + "}$", parsing_timeout=None)
    if not gold_parsed:
        return "gold-unparseable"  # a data error: the parent raises on it
    prediction_parsed = parse("$\\boxed{" + prediction + "}$", parsing_timeout=None)
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
