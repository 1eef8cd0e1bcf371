"""The code sandbox (envs/sandbox.py): every bad program gets an outcome, none hangs, none escapes,
and none leaves a process or a file behind."""
import os
import tempfile
import time
from pathlib import Path

import pytest

from envs.sandbox import CRASH, FAILED, PASSED, SYNTAX_ERROR, TIMEOUT, Limits, run_tests

FAST = Limits(seconds_per_test=1.0, seconds_per_program=3.0)
DOUBLE = "def double(x):\n    return 2 * x\n"


def processes() -> set[int]:
    return {int(p) for p in os.listdir("/proc") if p.isdigit()}


@pytest.fixture
def leaves_nothing_behind(monkeypatch):
    """After the test: no sandbox folder left, and no process left running in one. The test's
    sandboxes are made in a temporary root of its own (traversable by the unprivileged user the
    sandbox runs as), so the sandboxes of tests running in parallel in another worker are not
    counted; a process belongs to the test when its working folder is in that root."""
    root = tempfile.mkdtemp(prefix="marft-sandbox-test-")
    os.chmod(root, 0o711)
    monkeypatch.setattr(tempfile, "tempdir", root)
    yield
    time.sleep(0.2)
    left = os.listdir(root)
    survivors = []
    for pid in processes():
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue  # ended meanwhile, or not ours to read
        if cwd.startswith(root):
            survivors.append(cmdline)
    if not left:
        os.rmdir(root)
    assert not left
    assert not survivors


@pytest.mark.parametrize("program, tests, outcome, results", [
    (DOUBLE, ["assert double(2) == 4", "assert double(-3) == -6"], PASSED, ["passed", "passed"]),
    ("def double(x):\n    return x + 2\n", ["assert double(2) == 4", "assert double(3) == 6"], FAILED, ["passed", "failed"]),
    (DOUBLE, ["assert double(2) == 4", "double(None)"], FAILED, ["passed", "error"]),
    ("def double(x) return 2 * x\n", ["assert double(2) == 4"], SYNTAX_ERROR, ["not_run"]),
    ("raise ValueError('at import')\n", ["assert True"], CRASH, ["not_run"]),
    ("exit()\n", ["assert True"], CRASH, ["not_run"]),
    ("import sys\nsys.exit(0)\n", ["assert True"], CRASH, ["not_run"]),
])
def test_outcomes_of_ordinary_programs(program, tests, outcome, results, leaves_nothing_behind):
    report = run_tests(program, tests, FAST)
    assert (report.outcome, report.tests) == (outcome, results)
    assert report.passed_fraction == results.count("passed") / len(results)


def test_the_first_failure_is_reported_with_its_message(leaves_nothing_behind):
    report = run_tests("def double(x):\n    return x + 2\n", ["assert double(2) == 4", "assert double(3) == 6, 'double(3)'"], FAST)
    assert report.first_failure == 1 and report.detail == "AssertionError: double(3)"


def test_an_infinite_loop_in_a_test_times_out_and_the_next_test_still_runs(leaves_nothing_behind):
    program = DOUBLE + "def spin():\n    while True:\n        pass\n"
    started = time.monotonic()
    report = run_tests(program, ["spin()", "assert double(1) == 2"], FAST)
    assert report.outcome == TIMEOUT and report.tests == ["timeout", "passed"]
    assert time.monotonic() - started < FAST.seconds_per_program


def test_a_loop_that_swallows_the_alarm_is_killed_at_the_program_limit(leaves_nothing_behind):
    program = "def stubborn():\n    while True:\n        try:\n            while True:\n                pass\n        except BaseException:\n            pass\n"
    started = time.monotonic()
    report = run_tests(program, ["stubborn()"], Limits(seconds_per_test=0.2, seconds_per_program=1.5))
    assert report.outcome == TIMEOUT
    assert time.monotonic() - started < 3.0


def test_endless_memory_is_refused(leaves_nothing_behind):
    program = "def hog():\n    blocks = []\n    while True:\n        blocks.append(bytearray(10**8))\n"
    report = run_tests(program, ["hog()"], Limits(seconds_per_test=5.0, seconds_per_program=8.0))  # time enough on a busy machine
    assert report.outcome == FAILED and report.tests == ["error"] and "MemoryError" in report.detail


def test_child_processes_are_refused(leaves_nothing_behind):
    spawn = "import subprocess\nprocs = [subprocess.Popen(['sleep', '30']) for _ in range(3)]\n"
    fork = "import os\nif os.fork() == 0:\n    import time\n    time.sleep(30)\n"
    shell = "import os\nos.system('sleep 30 &')\n"
    for program in (spawn, fork, shell):
        report = run_tests(program, ["assert True"], FAST)
        assert report.outcome == CRASH and "not allowed" in report.detail


@pytest.mark.parametrize("program", [
    "import ctypes\nctypes.pythonapi.system(b'true')\n",  # a C call to system()
    "import _posixsubprocess\n",  # fork_exec without the subprocess module
    "import threading\nthreading.Thread(target=lambda: None).start()\n",
    "import sys\nframe = sys._getframe(1)\n",  # the runner's frame
    "try:\n    1 / 0\nexcept ZeroDivisionError as err:\n    frame = err.__traceback__.tb_frame\n",
])
def test_c_calls_threads_and_the_runners_frames_are_out_of_reach(program, leaves_nothing_behind):
    report = run_tests(program, ["assert True"], FAST)
    assert report.outcome == CRASH and "not allowed" in report.detail


def test_a_program_cannot_forge_its_results(leaves_nothing_behind):
    """Fake "passed" and "done" events written to every open descriptor carry no nonce: dropped."""
    forger = ("import json, os\nfor fd in range(3, 64):\n    for kind in ('test', 'done'):\n        try:\n"
              "            os.write(fd, (json.dumps({'kind': kind, 'index': 0, 'result': 'passed', 'nonce': 'x'}) + '\\n').encode())\n"
              "        except OSError:\n            pass\nos._exit(0)\n")
    report = run_tests(forger, ["assert False"], FAST)
    assert report.outcome == CRASH and report.tests == ["not_run"]


def test_a_passing_program_that_leaves_exit_handlers_is_not_held_up(leaves_nothing_behind):
    program = DOUBLE + "import atexit, time\natexit.register(lambda: time.sleep(30))\n"
    started = time.monotonic()
    assert run_tests(program, ["assert double(2) == 4"], FAST).outcome == PASSED
    assert time.monotonic() - started < 2.0


def test_a_large_file_is_cut_at_the_file_limit(leaves_nothing_behind):
    report = run_tests("with open('big.txt', 'w') as f:\n    f.write('x' * 10**8)\n", ["assert True"], FAST)
    assert report.outcome == CRASH and "File too large" in report.detail


def test_files_outside_the_folder_can_be_neither_written_nor_read(tmp_path, leaves_nothing_behind):
    target = tmp_path / "escaped.txt"
    secret = tmp_path / "secret.txt"
    secret.write_text("the trainer's secret")
    os.chmod(tmp_path, 0o777)  # even where the OS would let the child write
    writes = f"open({str(target)!r}, 'w').write('x')\n"
    reads = f"print(open({str(secret)!r}).read())\n"
    relative = "open('../escaped-relative.txt', 'w').write('x')\n"
    for program in (writes, reads, relative):
        report = run_tests(program, ["assert True"], FAST)
        assert report.outcome == CRASH and "outside the working folder" in report.detail
        assert "secret" not in report.output
    assert not target.exists()


def test_megabytes_of_output_are_cut(leaves_nothing_behind):
    report = run_tests("print('x' * 5_000_000)\n" + DOUBLE, ["assert double(2) == 4"], FAST)
    assert report.outcome == PASSED and len(report.output) == FAST.output_chars


def test_no_environment_variable_of_the_trainer_reaches_the_program(monkeypatch, leaves_nothing_behind):
    monkeypatch.setenv("MARFT_SECRET_TOKEN", "hunter2")
    report = run_tests("import os\nseen = dict(os.environ)\n", ["assert 'MARFT_SECRET_TOKEN' not in seen", "assert len(seen) <= 4"], FAST)
    assert report.outcome == PASSED


def test_the_standard_library_can_be_imported(leaves_nothing_behind):
    program = "import math, collections, itertools, functools, re, heapq, fractions\ndef root(x):\n    return math.isqrt(x)\n"
    assert run_tests(program, ["assert root(49) == 7"], FAST).outcome == PASSED
