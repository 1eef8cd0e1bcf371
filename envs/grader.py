"""Grading a response against a gold answer with Hugging Face math-verify: one of four outcomes,

* "correct"     -- the last `\\boxed{}` of the response verifies against the gold answer (as the data gives it);
* "wrong"       -- it parses as math but does not verify;
* "unparseable" -- no `\\boxed{}`, an empty one, or content math-verify cannot parse;
* "ungraded"    -- not judged (the check timed out or the worker crashed): never cached, and counted.

Why a worker process (grading_worker.py, a plain script: no torch, no re-run of the main module): some inputs
make sympy run for minutes (`9^{9^{9^{9}}}` against `1`), and math-verify's own time limits use SIGALRM, which
works only on the main thread. A late reply kills the worker (a new one starts at the next call). Results are
cached by (gold, predicted answer): RL grades the same pairs again and again.
"""
from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

from .problems import extract_boxed

CORRECT, WRONG, UNPARSEABLE, UNGRADED = "correct", "wrong", "unparseable", "ungraded"  # ungraded: timeout or crash
_GOLD_UNPARSEABLE = "gold-unparseable"  # the worker's reply when the *gold* does not parse: a data error, not a grade

_WORKER_SCRIPT = Path(__file__).with_name("grading_worker.py")
_WORKER_STARTUP_SECONDS = 120.0  # importing sympy on a slow, busy machine
_MAX_CACHE_ENTRIES = 200_000  # the cache is emptied when it grows past this


class Grader:
    """Grades from any thread (a lock serialises calls) in one math-verify worker, started at the first `grade`,
    stopped by `close()`; `timeouts` and `crashes` count the "ungraded" checks (past `timeout_seconds`; worker died)."""

    def __init__(self, timeout_seconds: float = 5.0):
        if not timeout_seconds > 0:  # 0 would leave every answer ungraded, None would wait forever on a hung check
            raise ValueError(f"timeout_seconds must be > 0, got {timeout_seconds}")
        self.timeout_seconds = timeout_seconds
        self.timeouts, self.crashes = 0, 0
        self._cache: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self._worker: subprocess.Popen | None = None
        self._replies: queue.Queue | None = None  # lines from the current worker
        self._kill_at_exit: weakref.finalize | None = None

    def grade(self, gold: str, response: str) -> str:
        """"correct", "wrong", "unparseable" or "ungraded" for one response against one gold answer."""
        prediction = extract_boxed(response)
        if prediction is None or not prediction.strip():
            return UNPARSEABLE
        key = (gold, prediction)
        with self._lock:
            outcome = self._cache.get(key)
            if outcome is None:
                outcome = self._check_in_worker(gold, prediction)
                if outcome != UNGRADED:  # a timeout or a crash says nothing about the answer
                    if len(self._cache) >= _MAX_CACHE_ENTRIES:
                        self._cache.clear()
                    self._cache[key] = outcome
        if outcome == _GOLD_UNPARSEABLE:
            raise ValueError(f"math-verify cannot parse the gold answer {gold!r} "
                             f"(given to it as '$\\boxed{{{gold}}}$'); fix that data row.")
        return outcome

    def grade_many(self, golds: Sequence[str], responses: Sequence[str]) -> list[str]:
        """`grade` for each (gold, response) pair, in order."""
        if len(golds) != len(responses):
            raise ValueError(f"{len(golds)} gold answers but {len(responses)} responses")
        return [self.grade(gold, response) for gold, response in zip(golds, responses)]

    def close(self) -> None:
        """Stop the worker process (a later `grade` starts a new one)."""
        with self._lock:
            self._stop_worker()

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _check_in_worker(self, gold: str, prediction: str) -> str:
        """Send one pair to the worker and wait at most `timeout_seconds` for the outcome."""
        if self._worker is None:
            self._start_worker()
        try:
            self._worker.stdin.write(json.dumps([gold, prediction]) + "\n")
            self._worker.stdin.flush()
            outcome = self._replies.get(timeout=self.timeout_seconds)
        except queue.Empty:
            self.timeouts += 1
        except OSError:  # BrokenPipeError: the worker had died
            self.crashes += 1
        else:
            if outcome is not None:
                return outcome
            self.crashes += 1  # the worker died mid-check (e.g. out of memory)
        self._stop_worker()
        return UNGRADED

    def _start_worker(self) -> None:
        worker = subprocess.Popen([sys.executable, str(_WORKER_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, encoding="utf-8")
        replies: queue.Queue = queue.Queue()

        def forward_lines(stream) -> None:  # each line the worker writes into `replies`; None: it died
            with stream:
                for line in stream:
                    replies.put(line.strip())
            replies.put(None)
        threading.Thread(target=forward_lines, args=(worker.stdout,), daemon=True).start()
        self._worker, self._replies = worker, replies
        # Killed even when the Grader is dropped without close(): it may be deep in a computation, not reading input.
        self._kill_at_exit = weakref.finalize(self, worker.kill)
        # Wait until math-verify is imported so that start-up never counts against a check.
        ready = None
        with contextlib.suppress(queue.Empty):
            ready = replies.get(timeout=_WORKER_STARTUP_SECONDS)
        if ready != "ready":
            self._stop_worker()
            raise RuntimeError("the math-verify grading worker did not start (see its error above); check "
                               "that math-verify is installed: pip install math-verify")

    def _stop_worker(self) -> None:
        """Kill the worker (it holds no state worth a polite shutdown) and forget it; the reader thread closes its stdout."""
        if self._worker is None:
            return
        self._kill_at_exit.detach()
        self._worker.kill()
        self._worker.wait()
        with contextlib.suppress(OSError):  # unsent bytes to a dead process
            self._worker.stdin.close()
        self._worker, self._replies = None, None
