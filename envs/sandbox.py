"""The sandbox: run an agent's program against unit tests in a child process, so that nothing it
does can hang, crash or escape into the trainer.

The code environment (envs/code_env.py) grades a program by the fraction of its tests that pass;
this module runs them. One call, `run_tests(program, tests, limits)`:

    folder   a fresh temporary folder holds the program, its tests and a small runner; it is
             the child's working directory and is deleted afterwards, with whatever it wrote
    child    `python -I -S -B runner.py`: isolated mode, no site-packages (the program sees the
             standard library only), stdin empty, environment reduced to PATH, HOME (the
             folder), LANG and PYTHONHASHSEED, a new session (its own process group)
    limits   set by the runner on itself before the program runs (`Limits`): address space,
             CPU seconds, largest file, open files, processes, no core dumps; when the trainer
             runs as root the runner then drops to the unprivileged user `nobody`, so the
             operating system refuses writes outside the folder and signals to the trainer
    guard    a Python audit hook refuses opening or listing files outside the folder (reading
             the standard library excepted), importing the modules that start processes or
             threads, open sockets or call C (`REFUSED_MODULES`), the matching os/socket/ctypes
             calls, and reading frames (the runner's state stays out of the program's reach)
    results  one JSON line per event on a pipe, each with a nonce only the runner knows, so a
             program that writes fake events to its descriptors is not believed; the runner
             leaves with os._exit, so exit handlers and threads cannot hold it up
    time     each test runs under a wall-clock alarm (`seconds_per_test`); the whole program,
             all tests included, under `seconds_per_program`, after which the process group
             is killed; the group is killed at the end in any case
    output   what the program prints is kept up to `output_chars` (the rest is dropped), so
             a program that prints megabytes costs nothing

Outcomes of a program: "passed" (every test), "failed" (some test failed or raised),
"syntax_error", "timeout" (a test or the program ran out of time), "crash" (the program's own
top level raised or exited, or the child died, e.g. out of memory), "no_program" (decided by the
environment: no fenced python block). Each test's result is "passed", "failed" (assertion),
"error" (another exception), "timeout" or "not_run".

What the sandbox does not prevent (README: "Code tasks"): network access from code that gets
past the audit hook (there is no network namespace), reading world-readable files the same way,
using CPU and memory up to the limits while it runs, a determined escape from Python's audit
hooks (they guard ordinary library calls, not every C-level path), and a program that games a
test instead of passing it (an object whose == is always true). Without root the runner
cannot change user, and the OS limits are the trainer user's own. Run untrusted code from a
strong model inside a container or VM as well.
"""
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

PASSED, FAILED, SYNTAX_ERROR, TIMEOUT, CRASH, NO_PROGRAM = "passed", "failed", "syntax_error", "timeout", "crash", "no_program"
OUTCOMES = (PASSED, FAILED, SYNTAX_ERROR, TIMEOUT, CRASH, NO_PROGRAM)
NOBODY = 65534  # uid and gid of `nobody` on Debian and most Linux systems


@dataclass(frozen=True)
class Limits:
    seconds_per_test: float = 2.0  # wall clock, per test (an alarm in the child)
    seconds_per_program: float = 10.0  # wall clock, the program and all its tests (the parent kills the group)
    memory_mib: int = 512  # address space of the child
    file_mib: int = 4  # largest file the child may write
    open_files: int = 64
    processes: int = 32  # RLIMIT_NPROC (binds the unprivileged user only)
    output_chars: int = 10_000  # printed output kept, per program


@dataclass
class TestReport:
    outcome: str  # one of OUTCOMES
    tests: list[str] = field(default_factory=list)  # per test: passed | failed | error | timeout | not_run
    detail: str = ""  # the first failure's message (assertion, exception, or what killed the program)
    output: str = ""  # what the program printed, cut at Limits.output_chars
    seconds: float = 0.0

    @property
    def passed_fraction(self) -> float:
        return sum(t == PASSED for t in self.tests) / len(self.tests) if self.tests else 0.0

    @property
    def first_failure(self) -> int | None:
        return next((k for k, t in enumerate(self.tests) if t != PASSED), None)


# Standard-library modules the runner imports before it drops privileges: the interpreter's own
# files may be readable by its owner only (a Python under /root), and then `nobody` could import
# nothing new. A program may import any of these, or any module `nobody` can read.
PRELOADED_MODULES = ["math", "cmath", "collections", "collections.abc", "itertools", "functools", "operator", "re",
                     "string", "heapq", "bisect", "random", "statistics", "fractions", "decimal", "datetime", "copy",
                     "typing", "dataclasses", "enum", "json", "array", "textwrap", "unicodedata", "hashlib", "time"]
# Modules a program may not import: processes, sockets, C calls (refused by name, before any lookup).
REFUSED_MODULES = ["subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing", "pty", "socket", "_socket",
                   "ctypes", "_ctypes", "threading", "_thread", "concurrent", "asyncio"]


# The child. It reads the program and the tests, limits itself, drops privileges, installs the
# guard, then runs the program's top level and each test, writing one JSON line per event (each
# carrying the parent's nonce, so that a program cannot forge one) to the pipe whose descriptor
# it is given (pass_fds keeps the parent's number). Everything lives inside main(): the program
# reaches none of it through `import __main__`, and the guard refuses frame inspection.
RUNNER = r"""
import io, json, os, resource, signal, sys

def main():
    limits, fd, nonce = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    del sys.argv[1:]
    report = os.fdopen(fd, "w", buffering=1)

    def say(**event):
        report.write(json.dumps({**event, "nonce": nonce}) + "\n")

    def leave():  # no atexit handler, no leftover thread can keep the child alive
        report.flush()
        os._exit(0)

    folder = os.getcwd()
    try:
        program = open("program.py", encoding="utf-8").read()
        tests = json.load(open("tests.json", encoding="utf-8"))
        mib = 1024 * 1024
        for name, value in (("RLIMIT_AS", limits["memory_mib"] * mib), ("RLIMIT_CPU", int(limits["seconds_per_program"]) + 1),
                            ("RLIMIT_FSIZE", limits["file_mib"] * mib), ("RLIMIT_NOFILE", limits["open_files"]),
                            ("RLIMIT_NPROC", limits["processes"]), ("RLIMIT_CORE", 0)):
            kind = getattr(resource, name)
            hard = resource.getrlimit(kind)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(kind, (value, value))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file past the limit raises OSError instead of killing
        for name in limits["preload"]:
            try:
                __import__(name)
            except ImportError:
                pass
        if os.getuid() == 0:
            os.setgroups([])
            os.setgid(limits["nobody"])
            os.setuid(limits["nobody"])
    except Exception as err:
        say(kind="sandbox_error", detail=f"{type(err).__name__}: {err}")
        leave()

    readable = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, folder})
    refused_modules = set(limits["refused_modules"])
    refused_events = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
                      "pty.spawn", "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "ctypes.dlopen",
                      "ctypes.dlsym", "ctypes.call_function", "os.kill", "os.killpg", "sys._getframe",
                      "sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents", "os.truncate",
                      "os.utime", "os.chown", "os.chflags", "os.setxattr", "os.removexattr"}
    paths_events = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.symlink", "os.link", "shutil.rmtree",
                    "os.listdir", "os.scandir"}
    frame_attributes = {"tb_frame", "f_back", "f_locals", "f_globals", "gi_frame", "cr_frame", "ag_frame", "f_builtins"}

    def outside(value):
        path = os.path.realpath(os.fsdecode(value))
        return not (path + os.sep).startswith(folder + os.sep), path

    def guard(event, args):
        if event in refused_events:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "import" and args and str(args[0]).split(".")[0] in refused_modules:
            raise PermissionError(f"sandbox: importing {args[0]} is not allowed")
        if event == "object.__getattr__" and len(args) > 1 and args[1] in frame_attributes:
            raise PermissionError(f"sandbox: reading {args[1]} is not allowed")
        if event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            mode, flags = (list(args) + [None, 0])[1:3]
            is_outside, path = outside(args[0])
            writing = (any(c in mode for c in "wax+") if isinstance(mode, str)
                       else bool((flags or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC)))
            if is_outside and (writing or not path.startswith(readable)):
                raise PermissionError(f"sandbox: no access to {path} outside the working folder")
        if event in paths_events:
            for arg in args[:2]:
                if isinstance(arg, (str, bytes, os.PathLike)) and outside(arg)[0]:
                    raise PermissionError(f"sandbox: no access to {outside(arg)[1]} outside the working folder")

    class Printed(io.TextIOBase):
        def __init__(self, cap):
            self.cap, self.parts, self.size = cap, [], 0
        def writable(self):
            return True
        def write(self, text):
            if self.size < self.cap:
                self.parts.append(text[: self.cap - self.size])
            self.size += len(text)
            return len(text)

    printed = Printed(limits["output_chars"])
    sys.stdout = sys.stderr = printed
    sys.stdin = io.StringIO("")

    class OutOfTime(BaseException):
        pass

    def alarm(signum, frame):
        raise OutOfTime()

    signal.signal(signal.SIGALRM, alarm)
    sys.setrecursionlimit(2000)

    def last_line(err):  # "Kind: message" (no traceback walk: the guard refuses frame access)
        try:
            text = str(err)
        except BaseException:
            text = ""
        return (f"{type(err).__name__}: {text}" if text else type(err).__name__)[:300]

    try:
        code = compile(program, "program.py", "exec")
    except (SyntaxError, ValueError) as err:
        say(kind="syntax_error", detail=last_line(err))
        leave()
    namespace = {"__name__": "program", "exit": sys.exit, "quit": sys.exit}  # as the site module would give
    sys.addaudithook(guard)
    signal.setitimer(signal.ITIMER_REAL, limits["seconds_per_test"])
    try:
        exec(code, namespace)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except OutOfTime:
        say(kind="program", result="timeout", detail="the program's top level ran out of time")
        leave()
    except BaseException as err:
        signal.setitimer(signal.ITIMER_REAL, 0)
        say(kind="program", result="crash", detail=last_line(err), output="".join(printed.parts))
        leave()
    say(kind="program", result="ok")
    for index, test in enumerate(tests):
        signal.setitimer(signal.ITIMER_REAL, limits["seconds_per_test"])
        try:
            exec(compile(test, f"test_{index}", "exec"), namespace)
            signal.setitimer(signal.ITIMER_REAL, 0)
            say(kind="test", index=index, result="passed")
        except OutOfTime:
            say(kind="test", index=index, result="timeout", detail=f"test {index} ran out of time")
        except AssertionError as err:
            signal.setitimer(signal.ITIMER_REAL, 0)
            say(kind="test", index=index, result="failed", detail=last_line(err))
        except BaseException as err:
            signal.setitimer(signal.ITIMER_REAL, 0)
            say(kind="test", index=index, result="error", detail=last_line(err))
    say(kind="done", output="".join(printed.parts))
    leave()

main()
"""


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up on this machine (not the program's fault)."""


def child_environment(folder: str) -> dict[str, str]:
    """The child's whole environment: nothing of the trainer's (no tokens, no keys)."""
    return {"PATH": "/usr/bin:/bin", "HOME": folder, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}


def run_tests(program: str, tests: list[str], limits: Limits = Limits()) -> TestReport:
    """Run `program`'s top level, then each test (Python statements, e.g. `assert f(2) == 4`) in its
    namespace, in a sandboxed child. Never raises for anything the program does; raises
    SandboxError when the sandbox itself cannot be set up (a fault of the machine, not the program)."""
    started, nonce = time.monotonic(), secrets.token_hex(16)
    settings = {**dataclasses.asdict(limits), "nobody": NOBODY, "preload": PRELOADED_MODULES,
                "refused_modules": REFUSED_MODULES}
    with tempfile.TemporaryDirectory(prefix="marft-sandbox-", ignore_cleanup_errors=True) as folder:
        folder = os.path.realpath(folder)
        for name, text in (("program.py", program), ("tests.json", json.dumps(tests)), ("runner.py", RUNNER)):
            with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
                f.write(text)
        if os.getuid() == 0:  # the runner drops to `nobody`, who may write in its own folder only
            os.chown(folder, NOBODY, NOBODY)
        read_end, write_end = os.pipe()
        child = None
        try:
            child = subprocess.Popen([sys.executable, "-I", "-S", "-B", "runner.py", json.dumps(settings), str(write_end), nonce],
                                     cwd=folder, env=child_environment(folder), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(write_end,),
                                     start_new_session=True, close_fds=True)
            os.close(write_end)
            write_end = None
            events = read_events(read_end, child, started + limits.seconds_per_program, nonce)
        finally:
            for fd in (read_end, write_end):
                if fd is not None:
                    os.close(fd)
            if child is not None:
                kill_group(child)
    if any(e["kind"] == "sandbox_error" for e in events):
        raise SandboxError(f"the code sandbox could not start a program here: {events[0].get('detail', '')}")
    return make_report(events, len(tests), child.returncode, time.monotonic() - started, limits)


def read_events(read_end: int, child: subprocess.Popen, deadline: float, nonce: str) -> list[dict]:
    """The child's events (JSON objects carrying `nonce`; anything else is dropped) until it ends
    or closes the pipe, or the deadline passes (then a "killed" event closes the list)."""
    buffer, cap, events = b"", 1 << 20, []
    poller = select.poll()
    poller.register(read_end, select.POLLIN | select.POLLHUP)
    while not any(e["kind"] in END_EVENTS for e in events):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            events.append({"kind": "killed"})
            break
        if poller.poll(min(remaining, 0.2) * 1000):
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            buffer = (buffer + chunk)[-cap:]
            *lines, buffer = buffer.split(b"\n")
            events += [e for e in map(parse_event, lines) if e is not None and e.pop("nonce") == nonce]
        elif child.poll() is not None:  # the child is gone (a descendant may still hold the pipe open)
            break
    return events


# Events after which the child has nothing more to say.
END_EVENTS = ("done", "syntax_error", "sandbox_error", "program_end")


def parse_event(line: bytes) -> dict | None:
    """One event line → a dict with a string "kind" and a "nonce", or None (not ours, or garbled)."""
    try:
        event = json.loads(line.decode("utf-8", errors="replace"))
    except json.JSONDecodeError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("kind"), str) or not isinstance(event.get("nonce"), str):
        return None
    if event["kind"] == "program" and event.get("result") != "ok":
        event["kind"] = "program_end"  # the program's top level timed out or crashed: no test follows
    for key in ("detail", "output", "result"):
        if not isinstance(event.get(key, ""), str):
            event[key] = str(event[key])
    if event["kind"] == "test" and not isinstance(event.get("index"), int):
        return None
    return event


def kill_group(child: subprocess.Popen) -> None:
    """SIGKILL to the child's whole process group (whatever it started), then reap the child."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()


def make_report(events: list[dict], num_tests: int, returncode: int | None, seconds: float, limits: Limits) -> TestReport:
    """TestReport from the child's events (which may stop anywhere: it can be killed at any point)."""
    tests = ["not_run"] * num_tests
    report = TestReport(CRASH, tests, seconds=seconds)
    details = []
    for event in events:
        kind = event["kind"]
        if kind == "syntax_error":
            report.outcome, report.detail = SYNTAX_ERROR, event.get("detail", "")
            return report
        if kind == "program_end":
            report.outcome = TIMEOUT if event.get("result") == "timeout" else CRASH
            report.detail, report.output = event.get("detail", ""), event.get("output", "")
            return report
        if kind == "test" and 0 <= event["index"] < num_tests:
            tests[event["index"]] = event.get("result", "error")
            if tests[event["index"]] != PASSED:
                details.append(event.get("detail", ""))
        if kind == "done":
            report.output = event.get("output", "")
    finished = any(e["kind"] == "done" for e in events)
    if any(t == "timeout" for t in tests) or any(e["kind"] == "killed" for e in events):
        report.outcome = TIMEOUT
        details.append(f"the program and its tests ran out of time ({limits.seconds_per_program:g} s)")
    elif not finished:
        report.outcome = CRASH  # killed by the OS: out of memory, CPU limit, a signal
        details.append(f"the program died (exit status {returncode})")
    else:
        report.outcome = PASSED if all(t == PASSED for t in tests) else FAILED
    report.detail = details[0] if details else ""
    return report
