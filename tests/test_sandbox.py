"""The code sandbox (envs/sandbox.py): every bad program gets an outcome, none hangs, none escapes,
none leaves a process or a file behind; tests of the shape `assert CALL == LITERAL` are decided in
the parent; the operating system's isolation holds even with the Python guard removed, as root
and as an unprivileged user; without namespaces the guard runs alone and says so.
(tests/test_sandbox_attacks.py tries the attacks of a program that wants an unearned reward.)"""
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from envs import judge, sandbox
from envs.sandbox import CRASH, FAILED, PASSED, SYNTAX_ERROR, TIMEOUT, Limits, run_tests

FAST = Limits(seconds_per_test=1.0, seconds_per_program=3.0)
DOUBLE = "def double(x):\n    return 2 * x\n"


@pytest.fixture
def leaves_nothing_behind(monkeypatch):
    """After the test: no sandbox folder left, and no process of the test's programs left running.
    The test's guard-mode folders are made in a temporary root of its own (traversable by the
    unprivileged user the sandbox runs as), so the sandboxes of tests running in parallel in
    another worker are not counted; a process is the test's when its environment carries the
    test's own mark (every child gets it, and a fork or a daemon inherits it)."""
    root = tempfile.mkdtemp(prefix="marft-sandbox-test-")
    os.chmod(root, 0o711)
    monkeypatch.setattr(tempfile, "tempdir", root)
    mark = f"marft-test-{uuid.uuid4().hex}"
    environment = sandbox.child_environment
    monkeypatch.setattr(sandbox, "child_environment", lambda folder: {**environment(folder), "MARFT_TEST_MARK": mark})
    yield
    time.sleep(0.2)
    left = os.listdir(root)
    survivors = marked_processes(mark)
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    if not left:
        os.rmdir(root)
    assert not left
    assert not survivors


def marked_processes(mark: str) -> list[int]:
    """The processes whose environment holds `mark`."""
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            if mark.encode() in Path(f"/proc/{pid}/environ").read_bytes():
                found.append(pid)
        except OSError:
            continue  # ended meanwhile
    return found


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
])
def test_c_calls_and_threads_are_refused_with_a_clear_line(program, leaves_nothing_behind):
    report = run_tests(program, ["assert True"], FAST)
    assert report.outcome == CRASH and "not allowed" in report.detail


def test_an_honest_program_may_use_frames_namedtuples_and_the_pure_python_library(leaves_nothing_behind):
    """Frames lead nowhere (the tests run in the judge), so the guard leaves them, and with them
    collections.namedtuple, functional enums and modules imported lazily from their cached bytecode."""
    program = ("import sys, collections, enum, pprint, fnmatch, calendar\nP = collections.namedtuple('P', 'x y')\n"
               "C = enum.Enum('C', 'A B')\ndef f():\n    return [sys._getframe(0).f_code.co_name, P(1, 2).y, C.B.value,\n"
               "            fnmatch.fnmatch('ab', 'a*'), calendar.isleap(2024)]\n")
    report = run_tests(program, ["assert f() == ['f', 2, 2, True, True]"], FAST)
    assert report.outcome == PASSED, report


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
    report = run_tests("import os\ndef seen():\n    return set(os.environ)\n", ["assert 'MARFT_SECRET_TOKEN' not in seen()",
                       "assert seen() <= {'PATH', 'HOME', 'LANG', 'PYTHONHASHSEED', 'MARFT_TEST_MARK'}"], FAST)
    assert report.outcome == PASSED


def test_the_standard_library_can_be_imported(leaves_nothing_behind):
    program = "import math, collections, itertools, functools, re, heapq, fractions\ndef root(x):\n    return math.isqrt(x)\n"
    assert run_tests(program, ["assert root(49) == 7"], FAST).outcome == PASSED


@pytest.mark.parametrize("mode", [sandbox.GUARD, sandbox.NAMESPACES])
def test_both_isolations_give_the_same_outcomes(mode, leaves_nothing_behind):
    program = DOUBLE + "print('hello')\n"
    tests = ["assert double(2) == 4", "assert double(3) == 7, 'three'", "assert 8 == double(4)", "double(None)",
             "assert double(2) == [4", "assert double(1) == 2 and True"]
    report = run_tests(program, tests, FAST, mode=mode)
    assert (report.outcome, report.tests) == (FAILED, ["passed", "failed", "passed", "error", "error", "passed"])
    assert report.detail == "AssertionError: three" and report.output == "hello\n"


# ---------------------------------------------------------------------------------------------
# The judge: the tests run in it; only plain data crosses from the program's process
# ---------------------------------------------------------------------------------------------

def test_the_tests_never_reach_the_programs_process(monkeypatch, leaves_nothing_behind):
    """The program's process is forked from the judge with the job's first part only (limits,
    prelude, program): no test, no expected value."""
    written = []
    dumps = sandbox.json.dumps
    monkeypatch.setattr(sandbox.json, "dumps", lambda obj, **kw: written.append(dumps(obj, **kw)) or written[-1])
    report = run_tests(DOUBLE, ["assert double(15_000) == 30000", "assert double(2) == 4.0"], FAST)
    assert report.tests == ["passed", "passed"]
    first, second = written[-2:]
    assert set(json.loads(first)) == {"limits", "prelude", "program"} and "assert double" not in first and "4.0" not in first
    assert "30000" in second


@pytest.mark.parametrize("returned, result", [
    ("A()", "error"),  # == always true: not plain data, never reaches the judge
    ("Int(4)", "passed"),  # a subclass is converted to its base: the value 4 was computed
    ("Int(5)", "failed"),
    ("[4]", "failed"),
    ("float('nan')", "failed"),  # crosses as nan, which equals nothing
    ("10 ** 5000", "error"),  # too many digits to report
    ("loop()", "error"),  # a list that contains itself
    ("(lambda: 4)()", "passed"),
])
def test_a_computed_value_crosses_as_plain_data(returned, result, leaves_nothing_behind):
    program = ("class A:\n    def __eq__(self, other):\n        return True\n"
               "class Int(int):\n    def __eq__(self, other):\n        return True\n"
               "def loop():\n    x = []\n    x.append(x)\n    return x\n"
               f"def double(x):\n    return {returned}\n")
    assert run_tests(program, ["assert double(2) == 4"], FAST).tests == [result]


@pytest.mark.parametrize("text, value", [
    ("(1, [2.5, -3], {'a': None}, {4}, b'x', True)", (1, [2.5, -3], {"a": None}, {4}, b"x", True)),
    ("[inf, -inf, (1+2j), -0.0, set(), frozenset({1})]", [float("inf"), -float("inf"), 1 + 2j, -0.0, set(), frozenset({1})]),
])
def test_the_judge_reads_plain_data_back_from_its_repr(text, value):
    assert judge.from_repr(text, 1000) == value


@pytest.mark.parametrize("text", ["__import__('os')", "f(1)", "x", "[1, 2][0]", "(1).real", "lambda: 1", "{**{}}", "[" * 1000,
                                  "[0] * 10", "'a' + 'b'", "-'a'", "1 + 2"])
def test_the_judge_evaluates_nothing_it_reads(text):
    with pytest.raises((ValueError, SyntaxError, RecursionError, MemoryError)):
        judge.from_repr(text, 1000)


def test_the_report_takes_the_first_event_of_each_test():
    """Hand-made event lists: the first event of a test decides it; a run that never ends its
    tests is a crash; a detail is cut before it reaches an observation."""
    def event(kind, index=-1, result="", detail=""):
        return {"kind": kind, "index": index, "result": result, "detail": detail, "output": ""}
    events = [event("started"), event("program", result="ok"), event("test", 0, "failed", "AssertionError: no"),
              event("test", 0, "passed"), event("test", 1, "passed"), event("done")]
    report = sandbox.make_report(events, 2, 0, 0.1, FAST)
    assert (report.outcome, report.tests, report.detail) == (FAILED, ["failed", "passed"], "AssertionError: no")
    cut = sandbox.make_report(events[:3], 2, -9, 0.1, FAST)
    assert (cut.outcome, cut.tests) == (CRASH, ["failed", "not_run"])
    long = sandbox.parse_event(repr(("test", 0, "failed", "x" * 100_000, "")).encode())
    assert len(long["detail"]) == sandbox.DETAIL_CHARS


@pytest.mark.parametrize("line", [
    b"[" * 100_000, b"1" * 5_000, b"\xff\xfe" * 100, b"", b"(" * 10_000, b"9" * 5_000, b"('test', 0, 'passed', '')",
    b"('test', '0', 'passed', '', '')", b"('test', 0, 'passed', '', '')" + b" " * (1 << 19), b"('test', 0, 'passed', '', b'')",
    b"('value', 0, 'passed', '', '')",
])
def test_no_line_makes_the_parser_raise(line):
    assert sandbox.parse_event(line) is None
    assert sandbox.parse_event(b"('test', 0, 'passed', '', '')")["result"] == "passed"


def test_a_folder_tree_of_any_depth_is_removed():
    root = tempfile.mkdtemp(prefix="marft-deep-")
    fd = os.open(root, os.O_RDONLY)
    for _ in range(3000):
        os.mkdir("a", dir_fd=fd)
        inner = os.open("a", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    sandbox.remove_folder(root)
    assert not os.path.exists(root)


# ---------------------------------------------------------------------------------------------
# The operating system's isolation, with the Python guard removed (as a program that got past it)
# ---------------------------------------------------------------------------------------------

needs_namespaces = pytest.mark.skipif(not (sys.platform.startswith("linux") and shutil.which("unshare") and os.getuid() == 0),
                                      reason="namespaces need Linux, util-linux and root here")
ESCAPE = r'''
import os, sys
def attempt(name, action):
    try:
        action()
        print(name, "done")
    except BaseException as err:
        print(name, "refused", type(err).__name__)
MARK = sys.argv[0] if False else {mark!r}
for path in ("/tmp/" + MARK, "/var/tmp/" + MARK, "/dev/shm/" + MARK, {target!r}):
    attempt("write " + path, lambda: open(path, "w").write("x"))
attempt("read", lambda: print(open({secret!r}).read()))
attempt("connect", lambda: __import__("socket").create_connection(("127.0.0.1", {port}), timeout=1))
attempt("fill", lambda: open("/dev/shm/big", "wb").write(b"x" * (64 << 20)))
def daemon():  # a double-forked daemon
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            import time
            time.sleep(30)
        os._exit(0)
attempt("daemon", daemon)
print("uid", os.getuid(), "root", sorted(os.listdir("/")))
'''


def escape_attempt(tmp_path: Path, mark: str) -> tuple[str, list[Path], Path, socket.socket]:
    """The program of a guard escape: writes to /tmp, /var/tmp, /dev/shm and a world-writable host
    folder, a read of a world-readable host file, a connection to a listening port, a 64 MiB
    /dev/shm file, a daemon."""
    os.chmod(tmp_path, 0o777)
    secret = tmp_path / "secret.txt"
    secret.write_text("the trainer's secret")
    os.chmod(secret, 0o644)
    target = tmp_path / f"{mark}.txt"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    program = ESCAPE.format(mark=mark, target=str(target), secret=str(secret), port=listener.getsockname()[1])
    written = [Path("/tmp") / mark, Path("/var/tmp") / mark, Path("/dev/shm") / mark, target]
    return program, written, secret, listener


def assert_nothing_escaped(report, written: list[Path], listener: socket.socket):
    try:
        assert not [path for path in written if path.exists()]
        assert "the trainer's secret" not in report.output and "read refused" in report.output
        with pytest.raises(socket.timeout):
            listener.accept()
        assert "connect refused" in report.output and "fill refused" in report.output  # tmpfs of disk_mib
        assert "daemon refused PermissionError" in report.output  # the seccomp filter: no fork
    finally:
        listener.close()
        for path in written:
            path.unlink(missing_ok=True)


@needs_namespaces
def test_without_the_guard_the_namespaces_still_hold(tmp_path, monkeypatch, leaves_nothing_behind):
    monkeypatch.setattr(sandbox, "PYTHON_GUARD", False)
    program, written, _, listener = escape_attempt(tmp_path, f"marft-escape-{uuid.uuid4().hex}")
    report = run_tests(program, ["assert 1 == 1"], FAST, mode=sandbox.NAMESPACES)
    assert report.outcome == PASSED, report
    assert_nothing_escaped(report, written, listener)
    assert "uid 65534 root ['bin', 'dev', 'etc', 'lib', 'lib64', 'root', 'sandbox', 'sbin', 'tmp', 'usr']" in report.output
    # (leaves_nothing_behind: the daemon is gone with its PID namespace)


@needs_namespaces
def test_an_unprivileged_trainer_gets_user_namespaces_that_hold_without_the_guard(tmp_path):
    """The trainer as uid 65534 (in a user namespace of its own, with no capability): isolation()
    takes user namespaces, and the same escape fails."""
    mark = f"marft-escape-{uuid.uuid4().hex}"
    program, written, _, listener = escape_attempt(tmp_path, mark)
    script = ("import json, sys\nsys.path.insert(0, '.')\nfrom envs import sandbox\n"
              "sandbox.PYTHON_GUARD = False\n"
              "mode = sandbox.isolation()\n"
              f"report = sandbox.run_tests({program!r}, ['assert 1 == 1'], sandbox.Limits(seconds_per_program=5.0))\n"
              "print(json.dumps([mode, report.outcome, report.output]))\n")
    done = subprocess.run(["unshare", "--user", "--map-user=65534", "--map-group=65534", sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=60, cwd=Path(sandbox.__file__).parents[1],
                          env={**os.environ, "MARFT_TEST_MARK": mark})
    mode, outcome, output = json.loads(done.stdout.splitlines()[-1])
    assert (mode, outcome) == (sandbox.USER_NAMESPACES, PASSED), done.stderr
    assert_nothing_escaped(sandbox.TestReport(outcome, output=output), written, listener)
    assert "uid 0 root" in output  # root of its own namespace only: every capability dropped before the program
    time.sleep(0.2)
    assert not marked_processes(mark)


def test_without_namespaces_the_guard_runs_alone_and_says_so_once(monkeypatch, capsys):
    monkeypatch.setattr(sandbox, "_ISOLATION", None)
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)  # no util-linux here
    assert sandbox.isolation() == sandbox.GUARD and sandbox.isolation() == sandbox.GUARD
    assert capsys.readouterr().err.count("without OS isolation") == 1
    assert sandbox.decided_isolation() == sandbox.GUARD
    assert run_tests(DOUBLE, ["assert double(2) == 4"], FAST).outcome == PASSED


SIGNAL_FRAMES = r'''
import sys
def handler(signum, frame):  # the interrupted frame's f_back chain leads to the runner's own
    global forged
    while frame is not None:
        say = frame.f_locals.get("say")
        if say is not None:
            for index in range(2):
                say("test", index, "passed")
            say("done")
            forged = True
        frame = frame.f_back
forged = False
try:
    import signal
except BaseException:
    signal = getattr(sys.modules.get("__main__"), "signal", None) or sys.modules.get("_signal")
signal.signal(signal.SIGALRM, handler)
signal.setitimer(signal.ITIMER_REAL, 0.01)
while not forged:
    pass
def double(x):
    return x
'''


@pytest.mark.parametrize("mode", [sandbox.GUARD, sandbox.NAMESPACES])
def test_a_signal_handler_gets_no_frame_of_the_runner(mode, leaves_nothing_behind):
    """A Python signal handler is handed the frame it interrupted; from there f_back (no audit
    event) would lead to the runner's `say`, and a forged "passed" for tests run in the child."""
    report = run_tests(SIGNAL_FRAMES, ["assert double(2) == 2 * 2", "assert double(3) == 3 * 2"], FAST, mode=mode)
    assert report.passed_fraction == 0.0 and report.outcome == CRASH


# ---------------------------------------------------------------------------------------------
# The red team's routes against this sandbox (each worked on its first version)
# ---------------------------------------------------------------------------------------------

RUN_IN_CHILD = ["assert double(2) == 2 * 2", "assert double(3) == 3 * 2"]  # no literal side: run in the child
FRAMES_TO_SAY = r'''
def forge(frame):  # walk to the runner's frame and report every test passed
    while frame is not None:
        say = frame.f_locals.get("say")
        if say is not None:
            for index in range(2):
                say("test", index, "passed")
            say("sandbox_error", detail="forged")
            say("done")
            return
        frame = frame.f_back
'''
RED_TEAM = {
    "always-equal int subclass": "class E(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
                                 "def double(x):\n    return E(x)\n",
    "replaced builtins": "import builtins\nbuiltins.abs = lambda x: 4\nbuiltins.len = lambda x: 2\n"
                         "def double(x):\n    return x\n",
    "frames from gc.garbage": FRAMES_TO_SAY + "import gc\ngc.set_debug(gc.DEBUG_SAVEALL)\n"
                              "def leak():\n    try:\n        raise ValueError\n    except ValueError as e:\n        keep = e\n"
                              "leak()\ngc.collect()\nfor obj in list(gc.garbage):\n"
                              "    if type(obj).__name__ == 'frame':\n        forge(obj)\ndef double(x):\n    return x\n",
    "a str subclass past the import check": FRAMES_TO_SAY + "class N(str):\n    def __str__(self):\n        return 'math'\n"
                                            "signal = __import__(N('_signal'))\n"
                                            "signal.signal(signal.SIGVTALRM, lambda s, f: forge(f))\n"
                                            "signal.setitimer(signal.ITIMER_VIRTUAL, 0.001)\nwhile True:\n    pass\n",
}


@pytest.mark.parametrize("mode", [sandbox.GUARD, sandbox.NAMESPACES])
@pytest.mark.parametrize("attack", RED_TEAM, ids=list(RED_TEAM))
def test_tests_run_in_the_child_are_not_forged_by_the_red_teams_routes(attack, mode, leaves_nothing_behind):
    tests = RUN_IN_CHILD + ["assert abs(double(-2)) == 4 and len(str(double(7))) == 2"]
    report = run_tests(RED_TEAM[attack], tests, FAST, mode=mode)  # and no SandboxError raised
    assert report.passed_fraction == 0.0, report


def test_a_str_subclass_does_not_get_a_path_past_the_guard(leaves_nothing_behind):
    tmp_path = Path(tempfile.mkdtemp(dir="/tmp"))  # a world-traversable host folder
    request_cleanup = lambda: shutil.rmtree(tmp_path, ignore_errors=True)
    secret = tmp_path / "secret.txt"
    secret.write_text("the trainer's secret")
    os.chmod(tmp_path, 0o777)
    program = ("import os\nclass S(str):\n    def startswith(self, *a):\n        return True\n"
               "    def __getitem__(self, k):\n        return os.getcwd()[k]\n"
               f"print(open(S({str(secret)!r})).read())\nopen(S({str(tmp_path / 'escaped')!r}), 'w').write('x')\n")
    try:
        report = run_tests(program, ["assert True"], FAST, mode=sandbox.GUARD)
        assert report.outcome == CRASH and "outside the working folder" in report.detail
        assert "secret" not in report.output and not (tmp_path / "escaped").exists()
    finally:
        request_cleanup()


def test_a_program_cannot_leave_its_process_group(leaves_nothing_behind):
    """os.setsid would take the program's process out of the group the trainer kills: the seccomp
    filter refuses it (and a fresh session, and a new group)."""
    program = "import os\nos.setsid()\n"
    report = run_tests(program, ["assert True"], Limits(seconds_per_test=0.5, seconds_per_program=1.5))
    assert report.outcome == CRASH and report.detail == "PermissionError: [Errno 1] Operation not permitted"


# ---------------------------------------------------------------------------------------------
# The seccomp filter, read by a classic-BPF interpreter written here (the kernel's behaviour is
# tested in test_sandbox_attacks.py: every door answers EPERM)
# ---------------------------------------------------------------------------------------------

def run_filter(program: bytes, nr: int, args=(0,) * 6, arch: int = 0xC000003E) -> str:
    """What a seccomp filter returns for one syscall: "allow", "deny" (EPERM) or the raw value.
    struct seccomp_data: nr (u32), arch (u32), instruction pointer (u64), args[6] (u64)."""
    data = struct.pack("<IIQ6Q", nr, arch, 0, *[a & (2**64 - 1) for a in args])
    code = [struct.unpack("<HBBI", program[k:k + 8]) for k in range(0, len(program), 8)]
    at, accumulator = 0, 0
    while True:
        op, jt, jf, k = code[at]
        if op == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            accumulator = struct.unpack_from("<I", data, k)[0]
        elif op in (0x15, 0x35, 0x45):  # JEQ, JGE, JSET
            taken = {0x15: accumulator == k, 0x35: accumulator >= k, 0x45: bool(accumulator & k)}[op]
            at += jt if taken else jf
        elif op == 0x06:  # BPF_RET
            return {0x7FFF0000: "allow", 0x00050001: "deny"}.get(k, hex(k))
        else:
            raise AssertionError(f"unexpected instruction {op:#x}")
        at += 1


O_WRONLY, O_CREAT = 0o1, 0o100


@pytest.mark.parametrize("mode, nr, args, arch, expected", [
    ("namespaces", 0, (), 0xC000003E, "allow"),  # read
    ("namespaces", 57, (), 0xC000003E, "deny"),  # fork
    ("namespaces", 56, (0x11,), 0xC000003E, "deny"),  # clone
    ("namespaces", 250, (), 0xC000003E, "deny"),  # keyctl
    ("namespaces", 2, (0, 0), 0x40000003, "deny"),  # the i386 ABI (int 0x80)
    ("namespaces", 0x40000000 + 57, (), 0xC000003E, "deny"),  # the x32 ABI
    ("namespaces", 302, (0, 7), 0xC000003E, "allow"),  # prlimit64 of itself
    ("namespaces", 302, (1, 7), 0xC000003E, "deny"),  # … of the judge
    ("namespaces", 302, (1 << 32, 7), 0xC000003E, "deny"),  # a pid with only its high half set
    ("namespaces", 72, (3, 1), 0xC000003E, "allow"),  # fcntl F_GETFD
    ("namespaces", 72, (3, 8, 1), 0xC000003E, "deny"),  # F_SETOWN
    ("namespaces", 72, (3, 10, 9), 0xC000003E, "deny"),  # F_SETSIG
    ("namespaces", 72, (3, 15), 0xC000003E, "deny"),  # F_SETOWN_EX
    ("namespaces", 257, (-100, 0, O_WRONLY | O_CREAT), 0xC000003E, "allow"),  # openat for writing: its own tmpfs
    ("guard", 257, (-100, 0, O_WRONLY | O_CREAT), 0xC000003E, "deny"),  # … not in the guard mode
    ("guard", 257, (-100, 0, 0), 0xC000003E, "allow"),  # reading
    ("guard", 2, (0, 0o2000), 0xC000003E, "deny"),  # open with O_APPEND
    ("guard", 2, (0, 0), 0xC000003E, "allow"),
    ("guard", 83, (), 0xC000003E, "deny"),  # mkdir
    ("guard", 302, (0, 7), 0xC000003E, "allow"),
    ("namespaces", 314, (1,), 0xC000003E, "deny"),  # sched_setattr
    ("namespaces", 30, (), 0xC000003E, "deny"),  # shmat
    ("namespaces", 91, (), 0xC000003E, "allow"),  # fchmod: its own tmpfs
    ("guard", 91, (), 0xC000003E, "deny"),  # … not in the guard mode
    ("guard", 452, (), 0xC000003E, "deny"),  # fchmodat2
])
def test_the_seccomp_filter_on_a_hand_table(mode, nr, args, arch, expected):
    assert run_filter(sandbox.filter_for(mode), nr, tuple(args) + (0,) * (6 - len(args)), arch) == expected
