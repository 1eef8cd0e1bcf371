"""The sandbox: run an agent's program against unit tests so that nothing it does can forge a
reward, hang, crash the trainer, reach the network or outlive its run.

The code environment (envs/code_env.py) grades a program by the fraction of its tests that pass;
this module runs them. One call, `run_tests(program, tests, limits)`. A policy under RL pressure
finds every unearned reward, so the sandbox is built in two layers and the verdict is reached
outside the program's process wherever the test allows it:

    isolation   the operating system's, when the machine allows it (`isolation()`, decided once
                per process, recorded in the run's config as `sandbox/isolation`):
                "namespaces"       (the trainer is root) util-linux `unshare` gives the child its
                                   own PID, network, mount, IPC and UTS namespaces; inside, a new
                                   root of its own (`pivot_root`, the old root detached): the
                                   system's /usr and the interpreter's folder read-only, a
                                   size-capped tmpfs as its working folder (/sandbox), /tmp and
                                   /dev/shm, four character devices, no /proc, /sys, /etc, /home
                                   or /work; then it drops to the unprivileged user `nobody`.
                                   The network namespace has only a loopback that is down: no
                                   network at all. When the child (PID 1 of its namespace) ends,
                                   the kernel ends every process it started; its files were
                                   only ever in tmpfs and go with the namespace.
                "user-namespaces"  (the trainer is not root) the same inside a user namespace
                                   (`unshare --user --map-root-user`); the child then runs with
                                   no capability (`setpriv --bounding-set=-all`), as its mapped
                                   user (the trainer's), who can write only the tmpfs folders.
                "guard"            (no namespaces: another OS, a container that forbids them)
                                   the child runs in a fresh folder of the host as `nobody`
                                   (under root) with the Python guard below only. Said once on
                                   stderr at the start and in the run's config; never silent.
    guard       a Python audit hook (second layer, in every mode): refuses opening or listing
                files outside the folder (reading the standard library excepted), relative
                paths resolved against a directory descriptor, importing the modules that start
                processes or threads, open sockets or call C (`REFUSED_MODULES`), the matching
                os/socket/ctypes calls, tracing and profiling hooks, and reading frames.
    limits      set by the child on itself before the program runs (`Limits`): address space,
                CPU seconds, largest file, open files, processes, no core dumps; each tmpfs is
                capped at `disk_mib` (and a number of files)
    input       the program, the tests and a per-run secret (nonce) arrive on the child's stdin,
                which it reads to the end and closes before the program runs: nothing of them is
                in its argv, environment or files
    results     (a) a test of the shape `assert CALL == LITERAL` (the generated task, MBPP
                asserts of that shape) is split in the parent (`split_comparison`): the child
                is given only CALL, evaluates it and reports the value it computed as plain data
                (builtin types, bounded size); the parent parses that defensively and compares it
                with LITERAL, which never enters the child. A program cannot forge such a pass:
                it would have to produce the expected values, i.e. compute them; an object whose
                `==` is always true is not plain data and never reaches the comparison.
                (b) any other test (HumanEval's `check(candidate)`) runs inside the child, which
                reports "passed" on its result pipe with the nonce. The test sees every callable
                of the program through a wrapper that turns its results into plain data (so its
                `==`, `abs`, `len`… are the builtin ones) and the builtins as they were before
                the program ran; see the limits below.
    parsing     every byte the child writes is read with caps (line length, number of events,
                total bytes; `ResultCaps`) and parsed with `ast.literal_eval` under a catch-all:
                nothing the child writes raises in the trainer or grows its memory unbounded
    time        each test runs under a wall-clock alarm (`seconds_per_test`); the whole run
                under `seconds_per_program`, after which the child's process group is killed
                (and with it, in the namespace modes, every process of the program)
    cleanup     the guard mode's folder is removed with `rm -rf` (no recursion in Python, so
                any depth of tree goes); the namespace modes leave no folder on the host

Outcomes of a program: "passed" (every test), "failed" (some test failed or raised),
"syntax_error", "timeout" (a test or the program ran out of time), "crash" (the program's own
top level raised or exited, or the child died, e.g. out of memory), "no_program" (decided by the
environment: no fenced python block). Each test's result is "passed", "failed" (assertion or a
different value), "error" (another exception, or a value that is not plain data), "timeout" or
"not_run".

What remains possible (docs/code-tasks.md: "The code sandbox"). A program that escapes the
Python guard (it guards library calls, not every C-level path: any frame object leads, through
f_back and f_locals, which raise no audit event, to the runner's reporter) can, for tests of kind (b) only,
forge "passed" events: the test code runs in its process and the trainer cannot tell the test's
own report from a forged one. Without an escape, a program can still change a standard-library
module that a kind-(b) test uses (`math.isclose`), and a kind-(b) test cannot use the program's
own objects (a class instance is not plain data). It still cannot reach the network, write or read outside its tmpfs folders
(in the namespace modes), or leave a process behind. It can use CPU and memory up to the limits
while it runs. In the guard mode there is no network namespace, and a program that gets past the
guard can reach the network, read world-readable files and start processes. A program can
also special-case the inputs it is tested on if the task text reveals them.
"""
from __future__ import annotations

import ast
import dataclasses
import hmac
import json
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

PASSED, FAILED, SYNTAX_ERROR, TIMEOUT, CRASH, NO_PROGRAM = "passed", "failed", "syntax_error", "timeout", "crash", "no_program"
OUTCOMES = (PASSED, FAILED, SYNTAX_ERROR, TIMEOUT, CRASH, NO_PROGRAM)
NAMESPACES, USER_NAMESPACES, GUARD = "namespaces", "user-namespaces", "guard"
NOBODY = 65534  # uid and gid of `nobody` on Debian and most Linux systems


@dataclass(frozen=True)
class Limits:
    seconds_per_test: float = 2.0  # wall clock, per test (an alarm in the child)
    seconds_per_program: float = 10.0  # wall clock, the program and all its tests (the parent kills the group)
    memory_mib: int = 512  # address space of the child
    file_mib: int = 4  # largest file the child may write
    disk_mib: int = 16  # size of each tmpfs of the namespace modes (the folder, /tmp, /dev/shm)
    open_files: int = 64
    processes: int = 32  # RLIMIT_NPROC (binds the unprivileged user only)
    output_chars: int = 10_000  # printed output kept, per program


@dataclass(frozen=True)
class ResultCaps:
    """What the parent reads of the child, at most (docs/code-tasks.md: "The code sandbox")."""
    line_bytes: int = 1 << 18  # one event line; a longer one is dropped
    total_bytes: int = 8 << 20  # everything read from the result pipe; then the child is killed
    value_chars: int = 100_000  # the repr of one computed value (checked in the child too)
    extra_events: int = 8  # events allowed beyond one per test


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


# Standard-library modules the runner imports before the guard is installed, in every mode: some
# call sys._getframe while they load (namedtuple), which the guard refuses; and in the guard mode
# the interpreter's own files may be readable by their owner only (a Python under /root), so that
# `nobody` could import nothing new. A program may import any of these, or any module it can read.
PRELOADED_MODULES = ["math", "cmath", "collections", "collections.abc", "itertools", "functools", "operator", "re",
                     "string", "heapq", "bisect", "random", "statistics", "fractions", "decimal", "datetime", "copy",
                     "typing", "dataclasses", "enum", "json", "array", "textwrap", "unicodedata", "hashlib", "time"]
# Modules a program may not import: processes, sockets, C calls (refused by name, before any lookup).
# `signal` too: a Python signal handler is given the frame it interrupted, whose f_back (which
# raises no audit event) leads to the runner's own; the runner sets its alarm, then drops the
# module from sys.modules, so a program's import of it is a fresh, refused one. Modules named
# _test… or _xx… (CPython's test helpers) are refused by prefix.
# `gc` too: gc.garbage (DEBUG_SAVEALL) hands over frames. The ones the interpreter or the runner
# has already loaded (`UNLOADED_MODULES`) are dropped from sys.modules before the program runs.
REFUSED_MODULES = ["subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing", "pty", "socket", "_socket",
                   "ctypes", "_ctypes", "threading", "_thread", "concurrent", "asyncio", "signal", "_signal",
                   "faulthandler", "gc", "marshal", "_testcapi", "_testinternalcapi", "_xxsubinterpreters"]
UNLOADED_MODULES = ["signal", "_signal", "_thread", "gc", "marshal"]


# ---------------------------------------------------------------------------------------------
# The test's shape: compared in the parent, or run in the child
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Comparison:
    """`assert CALL == EXPECTED[, message]` with EXPECTED a literal: the child evaluates `call`
    only, and the parent compares what it computed with `expected`."""
    call: str
    expected: object
    message: str = ""


def split_comparison(test: str) -> Comparison | None:
    """A test of the shape `assert CALL == LITERAL` (either side the literal) → Comparison; any
    other test (several statements, another operator, no literal side) → None (it runs in the child)."""
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return None
    statement = tree.body[0]
    compare = statement.test
    if not (isinstance(compare, ast.Compare) and len(compare.ops) == 1 and isinstance(compare.ops[0], ast.Eq)):
        return None
    message = statement.msg.value if isinstance(statement.msg, ast.Constant) and isinstance(statement.msg.value, str) else ""
    for call, literal in ((compare.left, compare.comparators[0]), (compare.comparators[0], compare.left)):
        try:
            expected = ast.literal_eval(literal)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        return Comparison(ast.get_source_segment(test, call) or ast.unparse(call), expected, message)
    return None


# ---------------------------------------------------------------------------------------------
# The child
# ---------------------------------------------------------------------------------------------

# The child runs `python -I -S -B -c RUNNER fd`. It reads its job (limits, nonce, program, tests)
# from stdin and closes it, limits itself, drops privileges if it is root, installs the guard,
# then runs the program's top level and each test, writing one event per line on the pipe `fd`:
#     <nonce> ('kind', index, 'result', 'detail')
# Everything the runner uses after the program starts is bound to a local name first: a program
# can replace names in modules (builtins, os, json), not a function's locals; events are written
# with os.write and repr of builtin types only. Everything lives inside main(): the program
# reaches none of it through `import __main__`, and the guard refuses frames and trace hooks.
RUNNER = r"""# marft sandbox runner
import io, json, os, resource, sys

def main():
    import signal  # a local: the program reaches no module that holds it (REFUSED_MODULES)
    _write, _repr, _len, _type, _str, _isinstance = os.write, repr, len, type, str, isinstance
    _exec, _eval, _exit, _setitimer, _REAL = exec, eval, os._exit, signal.setitimer, signal.ITIMER_REAL
    _AssertionError, _BaseException, _as_str, _bytes_join = AssertionError, BaseException, str.__str__, bytes.join
    _int, _float, _complex, _bytes, _list, _tuple, _dict, _set, _frozenset = int, float, complex, bytes, list, tuple, dict, set, frozenset
    _dict_items, _NoneType, _callable, _Module = dict.items, type(None), callable, type(os)
    import builtins as builtins_module

    chunks = []
    while True:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(0)
    job = json.loads(b"".join(chunks))
    del chunks
    limits, nonce, fd = job["limits"], job["nonce"], int(sys.argv[1])
    del sys.argv[1:]

    def say(kind, index=-1, result="", detail="", output=""):
        line = nonce + " " + _repr((kind, index, result, detail, output)) + "\n"
        try:
            _write(fd, line.encode("utf-8", "replace"))
        except _BaseException:
            _exit(3)

    def leave():  # no atexit handler, no leftover thread can keep the child alive
        _exit(0)

    def text(value, cap=300):  # a program's string (maybe of a str subclass) as a plain str
        try:
            value = value if _isinstance(value, _str) else _str(value)
            return _as_str(value)[:cap]
        except _BaseException:
            return "?"

    folder = os.getcwd()
    try:
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
        if os.getuid() == 0 and limits["drop_to"] is not None:
            os.setgroups([])
            os.setgid(limits["drop_to"])
            os.setuid(limits["drop_to"])
        items = []
        for index, (shape, code) in enumerate(job["tests"]):
            try:
                items.append((shape, compile(code, "test_" + str(index), "eval" if shape == "call" else "exec")))
            except (SyntaxError, ValueError) as err:  # a malformed test: an error of that test, not of the sandbox
                items.append(("malformed", type(err).__name__ + ": " + text(err)))
    except Exception as err:
        say("sandbox_error", detail=type(err).__name__ + ": " + text(err))
        leave()

    readable = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, folder})
    refused_modules = frozenset(limits["refused_modules"])
    refused_events = frozenset({
        "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn",
        "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "ctypes.dlopen", "ctypes.dlsym",
        "ctypes.call_function", "os.kill", "os.killpg", "sys._getframe", "sys._current_frames", "sys.settrace",
        "sys.setprofile", "gc.get_objects", "gc.get_referrers", "gc.get_referents", "os.truncate", "os.utime",
        "os.chown", "os.chflags", "os.setxattr", "os.removexattr", "os.chroot", "os.mknod", "os.mkfifo", "code.__new__",
        "marshal.loads", "marshal.load", "function.__new__"})
    # event: (how many leading path arguments, positions of its directory descriptors; -1 = none)
    path_events = {"os.remove": (1, (1,)), "os.rmdir": (1, (1,)), "os.mkdir": (1, (2,)), "os.chmod": (1, (2,)),
                   "os.rename": (2, (2, 3)), "os.link": (2, (2, 3)), "os.symlink": (2, (2,)), "shutil.rmtree": (1, ()),
                   "os.listdir": (1, ()), "os.scandir": (1, ()), "os.chdir": (1, ())}
    frame_attributes = frozenset({"tb_frame", "f_back", "f_locals", "f_globals", "gi_frame", "cr_frame", "ag_frame",
                                  "f_builtins"})
    _realpath, _fsdecode, _sep, _PermissionError = os.path.realpath, os.fsdecode, os.sep, PermissionError
    _isabs, _PathTypes = os.path.isabs, (str, bytes, os.PathLike)

    def outside(value):
        path = _realpath(_fsdecode(value))
        return not (path + _sep).startswith(folder + _sep), path

    def exact(value):  # a str or bytes argument as its real content (a subclass can lie in its methods)
        if _isinstance(value, _str):
            return _as_str(value)
        if _isinstance(value, _bytes):
            return _bytes_join(b"", [value])
        return value

    def guard(event, args):
        args = [exact(a) for a in args]
        if event in refused_events or (event == "object.__setattr__" and _len(args) > 1 and args[1] == "__code__"):
            raise _PermissionError("sandbox: " + event + " is not allowed")
        if event == "import" and args and (_str(args[0]).split(".")[0] in refused_modules
                                           or _str(args[0]).startswith(("_test", "_xx"))):
            raise _PermissionError("sandbox: importing " + _str(args[0]) + " is not allowed")
        if event == "object.__getattr__" and _len(args) > 1 and args[1] in frame_attributes:
            raise _PermissionError("sandbox: reading " + _str(args[1]) + " is not allowed")
        if event == "open" and args:
            if not _isinstance(args[0], _PathTypes):
                raise _PermissionError("sandbox: opening a file descriptor is not allowed")
            mode, flags = (list(args) + [None, 0])[1:3]
            if mode is None and not _isabs(_fsdecode(args[0])):  # os.open: it may resolve against a dir_fd
                raise _PermissionError("sandbox: os.open needs an absolute path")
            is_outside, path = outside(args[0])
            writing = (any(c in mode for c in "wax+") if _isinstance(mode, _str)
                       else bool((flags or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC)))
            if is_outside and (writing or not path.startswith(readable)):
                raise _PermissionError("sandbox: no access to " + path + " outside the working folder")
        if event in path_events:
            count, dir_fds = path_events[event]
            if any(_isinstance(args[k], _int) and args[k] != -1 for k in dir_fds if k < _len(args)):
                raise _PermissionError("sandbox: " + event + " with a directory descriptor is not allowed")
            for arg in args[:count]:
                if arg is None and event in ("os.listdir", "os.scandir"):
                    continue  # the current folder
                if not _isinstance(arg, _PathTypes):
                    raise _PermissionError("sandbox: " + event + " on a file descriptor is not allowed")
                if outside(arg)[0]:
                    raise _PermissionError("sandbox: no access to " + outside(arg)[1] + " outside the working folder")

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

    def output():
        try:
            return "".join(_as_str(p) for p in printed.parts if _isinstance(p, _str))[: limits["output_chars"]]
        except _BaseException:
            return ""

    class OutOfTime(BaseException):
        pass

    def alarm(signum, frame):
        raise OutOfTime()

    signal.signal(signal.SIGALRM, alarm)
    for name in limits["unloaded_modules"]:  # no signal handler, thread or gc of the program's: frames
        sys.modules.pop(name, None)
    sys.setrecursionlimit(2000)

    def last_line(err):  # "Kind: message" (no traceback walk: the guard refuses frame access)
        message = text(err)
        name = text(_type(err).__name__, 80)
        return (name + ": " + message if message else name)[:300]

    scalars = (_NoneType, bool, _int, _float, _complex, _str, _bytes)

    def plain(value, depth, budget):
        # The computed value as builtin data only (what the parent can literal_eval and compare,
        # and what a test run in the child compares with builtin ==): a subclass is converted to
        # its builtin base; anything else is refused. Types are compared by identity (a metaclass
        # can make == say anything). budget: [items so far, most items, finite floats only].
        budget[0] += 1
        if depth > 40 or budget[0] > budget[1]:
            raise ValueError("the value is nested too deeply or too large to report")
        kind = _type(value)
        for scalar in scalars:
            if kind is scalar:
                if budget[2] and kind is _float and value - value != 0.0:  # inf or nan: no literal to compare with
                    raise ValueError("the value is not a finite number")
                return value
        for base in (_int, _float, _str, _bytes):
            if _isinstance(value, base):
                return plain(_as_str(value) if base is _str else base(value), depth + 1, budget)
        for base in (_list, _tuple, _set, _frozenset):
            if _isinstance(value, base):
                return base([plain(v, depth + 1, budget) for v in base(value)])
        if _isinstance(value, _dict):
            return {plain(k, depth + 1, budget): plain(v, depth + 1, budget) for k, v in _dict_items(value)}
        raise TypeError("the value is not plain data (a " + text(kind.__name__, 80) + ")")

    say("started")
    def through_plain(function):  # the program's callable, its results turned into builtin data
        def call(*args, **kwargs):
            return plain(function(*args, **kwargs), 0, [0, 10_000_000, False])
        return call

    pristine_builtins = _dict(builtins_module.__dict__)  # before the program can replace any

    def test_globals():
        # What a test run in the child sees: the program's names, every callable among them
        # called through plain() (an object whose == is always true never reaches the test's
        # ==), and the builtins as they were before the program ran. Made anew for every test.
        names = {}
        for name, value in _dict_items(namespace):
            names[name] = through_plain(value) if _callable(value) and _type(value) is not _Module else value
        names["__builtins__"] = _dict(pristine_builtins)
        return names

    try:
        code = compile(job["program"], "program.py", "exec")
    except (SyntaxError, ValueError) as err:
        say("syntax_error", detail=last_line(err))
        leave()
    namespace = {"__name__": "program", "exit": sys.exit, "quit": sys.exit}  # as the site module would give
    sys.addaudithook(guard)
    _setitimer(_REAL, limits["seconds_per_test"])
    try:
        _exec(code, namespace)
        _setitimer(_REAL, 0)
    except OutOfTime:
        say("program", result="timeout", detail="the program's top level ran out of time")
        leave()
    except _BaseException as err:
        _setitimer(_REAL, 0)
        say("program", result="crash", detail=last_line(err), output=output())
        leave()
    say("program", result="ok")
    for index, (shape, test) in enumerate(items):
        _setitimer(_REAL, limits["seconds_per_test"])
        try:
            if shape == "malformed":
                _setitimer(_REAL, 0)
                say("test", index, "error", test)
            elif shape == "call":
                value = _repr(plain(_eval(test, namespace), 0, [0, 100_000, True]))
                _setitimer(_REAL, 0)
                if _len(value) > limits["value_chars"]:
                    say("test", index, "error", "the value is too large to report")
                else:
                    say("value", index, "", value)
            else:
                _exec(test, test_globals())
                _setitimer(_REAL, 0)
                say("test", index, "passed")
        except OutOfTime:
            say("test", index, "timeout", "test " + _str(index) + " ran out of time")
        except _AssertionError as err:
            _setitimer(_REAL, 0)
            say("test", index, "failed", last_line(err))
        except _BaseException as err:
            _setitimer(_REAL, 0)
            say("test", index, "error", last_line(err))
    say("done", output=output())
    leave()

main()
"""

# The namespace modes' setup, run by `sh` as (namespace-)root inside fresh mount, PID, network,
# IPC and UTS namespaces: a new root on a small tmpfs, the system's /usr (and its /bin, /lib
# links) and the interpreter's folders read-only, tmpfs for /sandbox (the program's folder), /tmp
# and /dev/shm, four devices; `pivot_root` into it, the old root detached, the new root read-only;
# then `exec` the runner (as PID 1 of its PID namespace). Arguments: disk MiB, files per tmpfs,
# the read-only folders, "--", the command.
NAMESPACE_SETUP = r"""set -eu
disk=$1; files=$2; shift 2
new=/tmp
mount -t tmpfs -o size=1m,nr_inodes=256,mode=0755 marft-root "$new"
for entry in usr bin sbin lib lib64 lib32 libx32; do
  if [ -L "/$entry" ]; then ln -s "$(readlink "/$entry")" "$new/$entry"
  elif [ -d "/$entry" ]; then mkdir "$new/$entry"; mount --rbind -o ro "/$entry" "$new/$entry"; fi
done
while [ "$1" != "--" ]; do
  if [ ! -e "$new$1" ]; then mkdir -p "$new$1"; mount --rbind -o ro "$1" "$new$1"; fi
  shift
done
shift
mkdir -p "$new/etc" "$new/dev/shm" "$new/tmp" "$new/sandbox" "$new/.old" "$new/proc"
if [ -f /etc/ld.so.cache ]; then touch "$new/etc/ld.so.cache"; mount --bind -o ro /etc/ld.so.cache "$new/etc/ld.so.cache"; fi
for device in null zero urandom random; do touch "$new/dev/$device"; mount --bind "/dev/$device" "$new/dev/$device"; done
for folder in tmp dev/shm sandbox; do
  mount -t tmpfs -o "size=${disk}m,nr_inodes=$files,mode=1777,nosuid,nodev" "marft-$(basename $folder)" "$new/$folder"
done
cd "$new"
pivot_root . .old
cd /
mount -t proc proc /proc
umount -l /.old
umount /proc
rmdir /.old /proc
mount -o remount,ro,bind /
cd /sandbox
unset OLDPWD PWD
exec "$@"
"""
TMPFS_FILES = 2048  # files and folders per tmpfs


def read_only_folders() -> list[str]:
    """The interpreter's folders the namespace root must show (beyond /usr, /bin, /lib…)."""
    folders = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.realpath(sys.executable)))}
    system = ("/usr/", "/bin/", "/sbin/", "/lib")
    return sorted(f for f in folders if not f.startswith(system) and f != "/")


def child_command(mode: str, fd: int, limits: Limits) -> list[str]:
    """The child's argv in `mode` (the runner reads its job on stdin and writes events on `fd`)."""
    runner = [os.path.realpath(sys.executable), "-I", "-S", "-B", "-c", RUNNER, str(fd)]
    if mode == GUARD:
        return runner
    namespaces = [shutil.which("unshare") or "unshare", "--pid", "--fork", "--kill-child", "--net", "--ipc", "--uts",
                  "--mount", "--propagation", "private"]
    drop: list[str] = []
    if mode == USER_NAMESPACES:  # root of its own user namespace: give up every capability first
        namespaces += ["--user", "--map-root-user"]
        drop = [shutil.which("setpriv") or "setpriv", "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs"]
    return namespaces + ["/bin/sh", "-c", NAMESPACE_SETUP, "marft-sandbox", str(limits.disk_mib), str(TMPFS_FILES),
                         *read_only_folders(), "--", *drop, *runner]


def child_environment(folder: str) -> dict[str, str]:
    """The child's whole environment: nothing of the trainer's (no tokens, no keys)."""
    return {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": folder, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}


# ---------------------------------------------------------------------------------------------
# Which isolation this machine allows (decided once per process)
# ---------------------------------------------------------------------------------------------

_ISOLATION: str | None = None


def isolation() -> str:
    """The strongest isolation that works here: "namespaces" (root), "user-namespaces" (not root),
    else "guard", said once on stderr. Decided by running a one-line program in each candidate."""
    global _ISOLATION
    if _ISOLATION is None:
        candidate = NAMESPACES if os.getuid() == 0 else USER_NAMESPACES
        reason = "not Linux" if not sys.platform.startswith("linux") else ""
        if not reason and not all(shutil.which(tool) for tool in ("unshare", "mount", "pivot_root", "umount")
                                  + (("setpriv",) if candidate == USER_NAMESPACES else ())):
            reason = "util-linux's unshare, mount, pivot_root or setpriv is missing"
        if not reason:
            try:
                works = run_tests("x = 1\n", ["assert x == 1"], Limits(), mode=candidate).outcome == PASSED
                reason = "" if works else "a one-line program did not pass"
            except SandboxError as err:
                reason = str(err)
        _ISOLATION = candidate if not reason else GUARD
        if _ISOLATION == GUARD:
            print(f"[sandbox] programs run with the Python guard only, without OS isolation ({candidate}: {reason}). "
                  "docs/code-tasks.md ('The code sandbox') says what that leaves open.", file=sys.stderr)
    return _ISOLATION


def decided_isolation() -> str | None:
    """The isolation this process uses, if it has run a program yet (for the run's config), else None."""
    return _ISOLATION


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up on this machine (not the program's fault)."""


# ---------------------------------------------------------------------------------------------
# The parent: start the child, read its events with caps, decide
# ---------------------------------------------------------------------------------------------

def why_it_cannot_run() -> str:
    """"" when the sandbox runs a one-line program and its test here, else why not (the start-of-run
    check of the code task and of the python runner)."""
    try:
        works = run_tests("x = 1\n", ["assert x == 1"]).outcome == PASSED
    except SandboxError as err:
        return str(err)
    return "" if works else "the code sandbox could not run a one-line program here"


def run_tests(program: str, tests: list[str], limits: Limits = Limits(), mode: str | None = None) -> TestReport:
    """Run `program`'s top level, then each test (Python statements, e.g. `assert f(2) == 4`), in
    a sandboxed child (`mode`: the machine's `isolation()` unless given). Never raises for anything
    the program does; raises SandboxError when the sandbox itself cannot be set up."""
    mode = mode or isolation()
    started, nonce, caps = time.monotonic(), secrets.token_hex(16), ResultCaps()
    comparisons = [split_comparison(test) for test in tests]
    root = os.getuid() == 0
    settings = {**dataclasses.asdict(limits), "refused_modules": REFUSED_MODULES, "value_chars": caps.value_chars,
                "unloaded_modules": UNLOADED_MODULES,
                "preload": PRELOADED_MODULES,
                "drop_to": NOBODY if root else None}
    job = {"limits": settings, "nonce": nonce, "program": program,
           "tests": [("call", c.call) if c else ("code", t) for c, t in zip(comparisons, tests)]}
    folder = None
    if mode == GUARD:  # a folder of the host, writable by `nobody` only
        folder = os.path.realpath(tempfile.mkdtemp(prefix="marft-sandbox-"))
        if root:
            os.chown(folder, NOBODY, NOBODY)
    read_end, write_end = os.pipe()
    child = None
    try:
        with tempfile.TemporaryFile() as stdin:  # unnamed: nothing of the job is left in a file
            stdin.write(json.dumps(job).encode())
            stdin.seek(0)
            child = subprocess.Popen(child_command(mode, write_end, limits), cwd=folder or "/", env=child_environment(folder or "/sandbox"),
                                     stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     pass_fds=(write_end,), start_new_session=True, close_fds=True)
        os.close(write_end)
        write_end = None
        events = read_events(read_end, child, started + limits.seconds_per_program, nonce, len(tests), caps)
    finally:
        for fd in (read_end, write_end):
            if fd is not None:
                os.close(fd)
        if child is not None:
            kill_group(child)
        if folder is not None:
            remove_folder(folder)
    before_start = events[: next((k for k, e in enumerate(events) if e["kind"] == "started"), len(events))]
    errors = [e for e in before_start if e["kind"] == "sandbox_error"]  # later ones would be the program's
    if errors:
        raise SandboxError(f"the code sandbox ({mode}) could not start a program here: {errors[0]['detail']}")
    if not any(e["kind"] in ("started", "killed") for e in events):  # the program never ran: the machine's fault
        raise SandboxError(f"the code sandbox ({mode}) could not start a program here "
                           f"(its child exited with status {child.returncode})")
    return make_report(events, comparisons, child.returncode, time.monotonic() - started, limits, caps)


def read_events(read_end: int, child: subprocess.Popen, deadline: float, nonce: str, num_tests: int,
                caps: ResultCaps = ResultCaps()) -> list[dict]:
    """The child's events (lines carrying `nonce`; anything else is dropped) until it ends or closes
    the pipe, the deadline passes (then a "killed" event closes the list), or it has written more
    than the caps allow (the rest is never read)."""
    buffer, total, events = b"", 0, []
    most = 2 * num_tests + caps.extra_events
    poller = select.poll()
    poller.register(read_end, select.POLLIN | select.POLLHUP)
    while not any(e["kind"] in END_EVENTS for e in events):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            events.append({"kind": "killed", "index": -1, "result": "", "detail": "", "output": ""})
            break
        if poller.poll(min(remaining, 0.2) * 1000):
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            total += len(chunk)
            *lines, buffer = (buffer + chunk).split(b"\n")
            if len(buffer) > caps.line_bytes:  # a line too long to be one of ours: drop up to its end
                buffer = b"\0"  # the rest of the line parses as nothing
            events += [e for e in (parse_event(line, nonce, caps) for line in lines) if e is not None]
            if len(events) > most or total > caps.total_bytes:
                events = events[:most]
                break
        elif child.poll() is not None:  # the child is gone (a descendant may still hold the pipe open)
            break
    return events


# Events after which the child has nothing more to say.
END_EVENTS = ("done", "syntax_error", "sandbox_error", "program_end")
EVENT_KINDS = ("started", "program", "test", "value", "done", "syntax_error", "sandbox_error")


def parse_event(line: bytes, nonce: str, caps: ResultCaps = ResultCaps()) -> dict | None:
    """One event line `<nonce> ('kind', index, 'result', 'detail', 'output')` → a dict of those
    five, or None (not ours, too long, garbled). Never raises."""
    try:
        if len(line) > caps.line_bytes:
            return None
        mark, _, body = line.partition(b" ")
        if not hmac.compare_digest(mark, nonce.encode()):
            return None
        fields = ast.literal_eval(body.decode("utf-8", errors="replace"))
        if not (type(fields) is tuple and len(fields) == 5 and fields[0] in EVENT_KINDS and type(fields[1]) is int
                and all(type(f) is str for f in fields[2:])):
            return None
    except Exception:  # SyntaxError, ValueError, MemoryError, RecursionError, …: not an event
        return None
    kind, index, result, detail, output = fields
    if kind == "program" and result != "ok":
        kind = "program_end"  # the program's top level timed out or crashed: no test follows
    return {"kind": kind, "index": index, "result": result, "detail": detail, "output": output}


def kill_group(child: subprocess.Popen) -> None:
    """SIGKILL to the child, its process group and, in the namespace modes, its own children: the
    PID 1 of the program's namespace (a program can leave the group with setsid, and the kernel
    clears unshare's --kill-child when the runner changes user), after which the kernel ends
    every process of the namespace. Then reap the child."""
    try:
        with open(f"/proc/{child.pid}/task/{child.pid}/children") as f:
            inner = [int(pid) for pid in f.read().split()]
    except (OSError, ValueError):
        inner = []
    for pid in inner:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for kill, target in ((os.killpg, child.pid), (os.kill, child.pid)):
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    child.wait()


def remove_folder(folder: str) -> None:
    """Remove the guard mode's folder, however deep its tree (`rm -rf` walks it without recursion
    limits; Python's rmtree would raise past about a thousand levels)."""
    subprocess.run(["rm", "-rf", "--", folder], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    if os.path.exists(folder):
        shutil.rmtree(folder, ignore_errors=True)


def compared(event: dict, comparison: Comparison, caps: ResultCaps) -> tuple[str, str]:
    """(result, detail) of a computed value against the test's expected literal, in the parent."""
    try:
        if len(event["detail"]) > caps.value_chars:
            raise ValueError("too large")
        value = ast.literal_eval(event["detail"])
        equal = bool(value == comparison.expected)
    except Exception:
        return "error", "the call's value could not be read"
    if equal:
        return PASSED, ""
    shown = event["detail"] if len(event["detail"]) <= 200 else event["detail"][:200] + " …"
    return FAILED, "AssertionError: " + (comparison.message or f"the call returned {shown}")


def make_report(events: list[dict], comparisons: list[Comparison | None], returncode: int | None, seconds: float,
                limits: Limits, caps: ResultCaps = ResultCaps()) -> TestReport:
    """TestReport from the child's events (which may stop anywhere: it can be killed at any point).
    A compared test passes only on a "value" equal to its expected literal; a test run in the child
    only on its "passed" event; the first event of a test decides it."""
    num_tests = len(comparisons)
    tests = ["not_run"] * num_tests
    report = TestReport(CRASH, tests, seconds=seconds)
    details: dict[int, str] = {}
    for event in events:
        kind, index = event["kind"], event["index"]
        if kind == "syntax_error":
            report.outcome, report.detail = SYNTAX_ERROR, event["detail"]
            return report
        if kind == "program_end":
            report.outcome = TIMEOUT if event["result"] == "timeout" else CRASH
            report.detail, report.output = event["detail"], event["output"][: limits.output_chars]
            return report
        if kind in ("test", "value") and 0 <= index < num_tests and tests[index] == "not_run":
            comparison = comparisons[index]
            if kind == "value" and comparison is not None:
                tests[index], detail = compared(event, comparison, caps)
            elif kind == "test" and (event["result"] != PASSED or comparison is None):
                tests[index] = event["result"] if event["result"] in (PASSED, "failed", "error", "timeout") else "error"
                detail = event["detail"]
            else:
                continue  # a "passed" for a compared test, or a value for a test run in the child: not believed
            if tests[index] != PASSED:
                details[index] = detail
        if kind == "done":
            report.output = event["output"][: limits.output_chars]
    finished = any(e["kind"] == "done" for e in events)
    ordered = [details[k] for k in sorted(details)]
    if any(t == "timeout" for t in tests) or any(e["kind"] == "killed" for e in events):
        report.outcome = TIMEOUT
        ordered.append(f"the program and its tests ran out of time ({limits.seconds_per_program:g} s)")
    elif not finished:
        report.outcome = CRASH  # killed by the OS: out of memory, CPU limit, a signal
        ordered.append(f"the program died (exit status {returncode})")
    else:
        report.outcome = PASSED if all(t == PASSED for t in tests) else FAILED
    report.detail = ordered[0] if ordered else ""
    return report
