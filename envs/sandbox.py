"""The sandbox: run an agent's program against unit tests so that nothing it does can forge a
reward, hang, crash the trainer, reach the network or outlive its run.

The code environment (envs/code_env.py) grades a program by the fraction of its tests that pass;
this module runs them. One call, `run_tests(program, tests, limits, prelude)`. A policy under RL
pressure finds every unearned reward, so the design assumes that the program owns its whole
process (any frame, any module, any syscall the kernel lets through) and keeps the verdict out of it:

    judge       the sandbox's first process. It reads the job, sets the limits, drops to `nobody`
                and forks the program's process; then it runs each test itself, with the
                problem's prelude (HumanEval's imports and helper functions) and the builtins and
                standard modules of its own. The test calls the program's functions through
                proxies: each call crosses a pipe as plain data (builtin types, bounded size) and
                its answer comes back as plain data, parsed by the judge (`from_repr`), never
                evaluated. The verdict of every test is the judge's; it alone writes to the
                trainer. Nothing of the program (its names, objects, `==`, `abs`, a fake `math`)
                is in the test's namespace except those proxies.
    program     the forked process: it closes every descriptor but its two pipe ends, installs a
                seccomp filter (`DENIED_SYSCALLS`, x86-64: no process, thread, signal to another
                process, ptrace, namespace, mount, keyring, bpf, io_uring, memfd, SysV/POSIX IPC,
                socket), removes the interpreter's means to load any further C module (so a
                refused module stays refused on every import path: `import`, `importlib`,
                `_imp`), installs the Python guard, runs the prelude and the program's top level,
                then answers calls. A test that runs out of time kills it; the next test that calls
                it starts a fresh one from the judge (the program's top level runs again).
    isolation   the operating system's, when the machine allows it (`isolation()`, decided once
                per process, recorded in the run's config as `sandbox/isolation`):
                "namespaces"       (the trainer is root) util-linux `unshare` gives the judge its
                                   own PID, network, mount, IPC and UTS namespaces; inside, a new
                                   root of its own (`pivot_root`, the old root detached): the
                                   system's /usr and the interpreter's folder read-only, a
                                   size-capped tmpfs as its working folder (/sandbox), /tmp and
                                   /dev/shm, four character devices, no /proc, /sys, /etc, /home
                                   or /work; then it drops to the unprivileged user `nobody`.
                                   The network namespace has only a loopback that is down.
                                   When the judge (PID 1 of its namespace) ends, the kernel ends
                                   every process of it; its files were only ever in tmpfs.
                "user-namespaces"  (the trainer is not root) the same inside a user namespace
                                   (`unshare --user --map-root-user`) with no capability left
                                   (`setpriv --bounding-set=-all`), as the trainer's mapped user.
                "guard"            (no namespaces: another OS, a container that forbids them)
                                   a fresh folder of the host, `nobody` (under root), the seccomp
                                   filter and the Python guard. Said once on stderr, never silent.
    guard       a Python audit hook in the program's process: refuses files outside its folder
                (reading the standard library excepted), the modules that start processes or
                threads, open sockets or call C (`REFUSED_MODULES`), tracing hooks and frames.
                A convenience that gives an honest program a clear error; nothing relies on it.
    limits      set on each process before the program runs (`Limits`): address space, CPU
                seconds, largest file, open files, no core dumps; each tmpfs is capped at
                `disk_mib`. The limits are per process (`sandbox/limits` in the config: no cgroup
                here); the program's process can start no other, so a run holds at most two.
    time        each test runs under the judge's wall-clock alarm (`seconds_per_test`); the whole
                run under `seconds_per_program`, after which the trainer kills the judge and
                with it every process of the run, and reaps every one of them.
    parsing     the trainer reads only the judge's events (one per test and a few more), with caps
                on every line and on the total, parsed under a catch-all; a detail is cut at
                `DETAIL_CHARS` before it reaches an observation.

Outcomes of a program: "passed" (every test), "failed" (some test failed or raised),
"syntax_error", "timeout" (a test or the program ran out of time), "crash" (the program's own
top level raised or exited, or a process died, e.g. out of memory), "no_program" (decided by the
environment: no fenced python block). Each test's result is "passed", "failed" (assertion),
"error" (another exception, or an answer that is not plain data), "timeout" or "not_run".

What remains (docs/code-tasks.md: "The code sandbox"): a test that hands the program something
that is not plain data (a function, an object of the test's) or relies on the program changing
its arguments in place fails, since only copies of plain data cross; a program can special-case
the inputs it is tested on if the task text shows them; it can use CPU and memory up to the
limits while it runs; off x86-64 there is no seccomp filter (said in the config).
"""
from __future__ import annotations

import ast
import dataclasses
import json
import os
import platform
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

PASSED, FAILED, SYNTAX_ERROR, TIMEOUT, CRASH, NO_PROGRAM = "passed", "failed", "syntax_error", "timeout", "crash", "no_program"
OUTCOMES = (PASSED, FAILED, SYNTAX_ERROR, TIMEOUT, CRASH, NO_PROGRAM)
NAMESPACES, USER_NAMESPACES, GUARD = "namespaces", "user-namespaces", "guard"
NOBODY = 65534  # uid and gid of `nobody` on Debian and most Linux systems
DETAIL_CHARS = 300  # a test's detail (the first failure's message), as it may reach an observation
PYTHON_GUARD = True  # the audit hook in the program's process; tests turn it off to play a program that owns its process


@dataclass(frozen=True)
class Limits:
    seconds_per_test: float = 2.0  # wall clock, per test (the judge's alarm)
    seconds_per_program: float = 10.0  # wall clock, the program and all its tests (the trainer kills the run)
    memory_mib: int = 512  # address space of each process (the judge's and the program's)
    file_mib: int = 4  # largest file a process may write
    disk_mib: int = 16  # size of each tmpfs of the namespace modes (the folder, /tmp, /dev/shm)
    open_files: int = 64
    processes: int = 32  # RLIMIT_NPROC (binds the unprivileged user only; the program's process can start none)
    output_chars: int = 10_000  # printed output kept, per program


@dataclass(frozen=True)
class ResultCaps:
    """What the trainer reads of the judge, and the judge of the program, at most."""
    line_bytes: int = 1 << 17  # one of the judge's event lines; a longer one is dropped
    total_bytes: int = 1 << 20  # everything read from the judge; then the run is killed
    value_chars: int = 100_000  # one answer of the program (its repr), as the judge reads it
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


# Standard-library modules the judge imports before it drops privileges and forks: the program may
# import these (and any pure-Python module it can read), and a test may use them by name without
# importing them (MBPP's `math.isclose`), from the judge. In the guard mode the interpreter's own
# files may be readable by their owner only, so that `nobody` could import nothing new.
PRELOADED_MODULES = ["math", "cmath", "collections", "collections.abc", "itertools", "functools", "operator", "re",
                     "string", "heapq", "bisect", "random", "statistics", "fractions", "decimal", "datetime", "copy",
                     "typing", "dataclasses", "enum", "json", "array", "textwrap", "unicodedata", "hashlib", "time",
                     "struct", "base64", "binascii", "ast"]
# Modules a program may not import (refused by name by the guard, and, being C modules, not loadable
# at all in the program's process once it starts: `sys.modules` loses them and `_imp` its loaders).
REFUSED_MODULES = ["subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing", "pty", "socket", "_socket",
                   "ctypes", "_ctypes", "threading", "_thread", "concurrent", "asyncio", "signal", "_signal",
                   "faulthandler", "gc", "marshal", "_testcapi", "_testinternalcapi", "_xxsubinterpreters", "select",
                   "mmap", "fcntl", "resource", "_posixshmem"]
# Syscalls the program's process may not make (x86-64 numbers; EPERM): processes and threads,
# signals to other processes, tracing, namespaces and mounts, keyrings (not covered by namespaces:
# state across runs), bpf, io_uring, memfd (memory outside the address-space limit), SysV and POSIX
# IPC, sockets, and the rest of the kernel's administration.
DENIED_SYSCALLS = {
    "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "execve": 59, "execveat": 322, "setsid": 112, "setpgid": 109,
    "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "pidfd_open": 434,
    "pidfd_send_signal": 424, "pidfd_getfd": 438, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "process_madvise": 440, "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
    "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "perf_event_open": 298, "userfaultfd": 323, "memfd_create": 319,
    "memfd_secret": 447, "socket": 41, "socketpair": 53, "shmget": 29, "msgget": 68, "semget": 64, "mq_open": 240,
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "reboot": 169, "acct": 163, "syslog": 103, "swapon": 167, "swapoff": 168, "quotactl": 179, "personality": 135,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "iopl": 172, "ioperm": 173,
}


def seccomp_program(denied: list[int]) -> bytes:
    """A classic-BPF seccomp filter (struct sock_filter[]): x86-64 syscalls in `denied`, the x32
    ABI and any other architecture (int 0x80) get EPERM; everything else is allowed."""
    load, equal, at_least, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    n = len(denied)
    deny_at = 6 + n  # index of the final `ret deny`
    code = [(load, 0, 0, 4), (equal, 1, 0, 0xC000003E), (ret, 0, 0, deny), (load, 0, 0, 0),  # arch == x86-64, then nr
            (at_least, deny_at - 5, 0, 0x40000000)]  # the x32 ABI
    code += [(equal, deny_at - (6 + k), 0, number) for k, number in enumerate(denied)]
    code += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    return b"".join(struct.pack("<HBBI", *instruction) for instruction in code)


def syscall_filter() -> str:
    """What the program's process runs under: "seccomp" (x86-64 Linux), else why not."""
    if not sys.platform.startswith("linux"):
        return "none (not Linux)"
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"none (no syscall table for {platform.machine()}: the limits are per process and the guard refuses processes)"
    return "seccomp"


# ---------------------------------------------------------------------------------------------
# The judge and the program's process (one script; the judge forks the program's process)
# ---------------------------------------------------------------------------------------------

# The judge runs `python -I -S -B -c RUNNER fd`. It reads its job (limits, prelude, program, tests)
# from stdin and closes it, limits itself, drops privileges if it is root, then forks the program's
# process and runs the tests, writing one event per line on the pipe `fd`, which only it holds:
#     ('kind', index, 'result', 'detail', 'output')
# Between the judge and the program's process, one line each way per message, the repr of a tuple
# of plain data: ('call', name, args, kwargs) and ('output',) from the judge; ('ready', names),
# ('crash', detail, output), ('syntax_error', detail), ('value', value), ('raised', kind, message)
# and ('output', text) from the program. The judge parses what it reads with `from_repr`.
RUNNER = r"""# marft sandbox: the judge, and the program's process it forks
import ast, builtins, ctypes, io, json, os, resource, select, signal, sys

def from_repr(text, most_nodes):
    # Plain data from its repr, built node by node (never evaluated): None, bool, int, float (inf
    # and nan too), complex, str, bytes, and tuples, lists, sets, frozensets and dicts of them.
    tree = ast.parse(text, mode="eval").body
    count = [0]
    def build(node, depth):
        count[0] += 1
        if depth > 60 or count[0] > most_nodes:
            raise ValueError("the answer is nested too deeply or too large")
        kind = type(node)
        if kind is ast.Constant and type(node.value) in (type(None), bool, int, float, complex, str, bytes):
            return node.value
        if kind is ast.Name and node.id in ("inf", "nan"):
            return float(node.id)
        if kind is ast.UnaryOp and type(node.op) in (ast.USub, ast.UAdd):
            value = build(node.operand, depth + 1)
            if type(value) not in (int, float, complex):
                raise ValueError("not plain data")
            return -value if type(node.op) is ast.USub else value
        if kind is ast.BinOp and type(node.op) in (ast.Add, ast.Sub):  # a complex number: real ± imaginary
            left, right = build(node.left, depth + 1), build(node.right, depth + 1)
            if type(left) not in (int, float) or type(right) is not complex:
                raise ValueError("not plain data")
            return left + right if type(node.op) is ast.Add else left - right
        if kind in (ast.Tuple, ast.List, ast.Set):
            items = [build(item, depth + 1) for item in node.elts]
            return {ast.Tuple: tuple, ast.List: list, ast.Set: set}[kind](items)
        if kind is ast.Dict and None not in node.keys:
            return {build(k, depth + 1): build(v, depth + 1) for k, v in zip(node.keys, node.values)}
        if (kind is ast.Call and type(node.func) is ast.Name and node.func.id in ("set", "frozenset")
                and not node.keywords and len(node.args) <= 1):
            return (set if node.func.id == "set" else frozenset)(build(node.args[0], depth + 1) if node.args else ())
        raise ValueError("not plain data")
    return build(tree, 0)

def plain(value, depth=0, budget=None):
    # A value as builtin data only (what crosses between the two processes): a subclass of a
    # builtin type becomes its base; anything else (a function, an object) is refused.
    budget = budget if budget is not None else [0]
    budget[0] += 1
    if depth > 40 or budget[0] > 1_000_000:
        raise ValueError("the value is nested too deeply or too large")
    kind = type(value)
    if kind in (type(None), bool, int, float, complex, str, bytes):
        return value
    for base in (int, float, complex, str, bytes):
        if isinstance(value, base):
            return str.__str__(value) if base is str else base(value)
    for base in (list, tuple, set, frozenset):
        if isinstance(value, base):
            return base([plain(v, depth + 1, budget) for v in base(value)])
    if isinstance(value, dict):
        return {plain(k, depth + 1, budget): plain(v, depth + 1, budget) for k, v in dict.items(value)}
    raise TypeError("a " + str(kind.__name__)[:80] + " is not plain data")

def last_line(err):  # "Kind: message", cut (no traceback)
    try:
        message = str(err)
    except BaseException:
        message = "?"
    name = type(err).__name__ if isinstance(type(err).__name__, str) else "Exception"
    return (name + ": " + message if message else name)[:300]

class Lines:
    # Lines from a pipe, each at most `cap` bytes (a longer one is an error), read with os.read.
    def __init__(self, fd, cap):
        self.fd, self.cap, self.buffer = fd, cap, b""
    def next(self):
        while b"\n" not in self.buffer:
            if len(self.buffer) > self.cap:
                raise ValueError("a message too large to read")
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                raise EOFError("the program's process ended")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        if len(line) > self.cap:
            raise ValueError("a message too large to read")
        return line.decode("utf-8", "replace")

def send(fd, message):
    data = (repr(message) + "\n").encode("utf-8", "replace")
    while data:
        data = data[os.write(fd, data):]

# ------------------------------------------------------------------ the program's process

def serve(job, settings):
    # Runs in the forked process, reading calls on fd 0 and answering on fd 3 (nothing else open).
    limits = job["limits"]
    if settings["filter"]:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            class Program(ctypes.Structure):
                _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
            code = ctypes.create_string_buffer(settings["filter"], len(settings["filter"]))
            program = Program(len(settings["filter"]) // 8, ctypes.addressof(code))
            if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(program), 0, 0) != 0:  # NO_NEW_PRIVS, SECCOMP
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        except BaseException as err:
            send(3, ("sandbox_error", "the seccomp filter could not be installed: " + last_line(err)))
            os._exit(3)

    class Interrupted(BaseException):
        pass

    computing = [False]

    def interrupted(signum, frame):  # the judge's signal that a call ran out of time
        if computing[0]:
            computing[0] = False
            raise Interrupted("the call ran out of time")

    signal.signal(signal.SIGALRM, interrupted)
    for name in list(sys.modules):  # the C modules refused to the program, and what holds them
        if name.split(".")[0] in limits["refused_modules"]:
            del sys.modules[name]
    for name in limits["refused_modules"]:  # and the judge's own references to them
        globals().pop(name, None)
    import _imp

    def no_c_module(*args):
        raise ImportError("sandbox: no C module is loaded once the program runs (import it from PRELOADED_MODULES)")

    for loader in ("create_builtin", "create_dynamic", "exec_builtin", "exec_dynamic"):
        if hasattr(_imp, loader):  # no further C module on any path (import, importlib, _imp)
            setattr(_imp, loader, no_c_module)
    del _imp
    requests, folder = Lines(0, 1 << 24), os.getcwd()

    class Printed(io.TextIOBase):
        def __init__(self, cap):
            self.cap, self.parts, self.size = cap, [], 0
        def writable(self):
            return True
        def write(self, text):
            if self.size < self.cap:
                self.parts.append(str(text)[: self.cap - self.size])
            self.size += len(text)
            return len(text)

    printed = Printed(limits["output_chars"])
    sys.stdout = sys.stderr = printed
    sys.stdin = io.StringIO("")

    def output():
        try:
            return "".join(p for p in printed.parts if type(p) is str)[: limits["output_chars"]]
        except BaseException:
            return ""

    try:
        code = compile(job["prelude"] + job["program"], "program.py", "exec")
    except (SyntaxError, ValueError) as err:
        send(3, ("syntax_error", last_line(err)))
        os._exit(0)
    namespace = {"__name__": "program", "exit": sys.exit, "quit": sys.exit}  # as the site module would give
    if settings["guard"]:
        sys.addaudithook(guard_for(folder, limits))
    sys.setrecursionlimit(2000)
    try:
        exec(code, namespace)
    except BaseException as err:
        send(3, ("crash", last_line(err), output()))
        os._exit(0)
    send(3, ("ready", sorted(str(k) for k, v in dict.items(namespace) if type(k) is str and callable(v))))
    while True:
        message = from_repr(requests.next(), 1_000_000)
        if message[0] == "output":
            os.write(3, (repr(("output", message[1], output())) + "\n").encode("utf-8", "replace"))
            continue
        _, number, name, args, kwargs = message
        try:
            function = namespace[name]
            computing[0] = True
            value = function(*args, **kwargs)
            computing[0] = False
            answer = repr(("value", number, plain(value)))
            if len(answer) > limits["value_chars"]:
                raise ValueError("the value is too large to report")
        except BaseException as err:
            computing[0] = False
            kind = type(err).__name__ if isinstance(type(err).__name__, str) else "Exception"
            answer = repr(("raised", number, kind[:80], last_line(err)))
        os.write(3, (answer + "\n").encode("utf-8", "replace"))


def guard_for(folder, limits):
    # The Python guard of the program's process (a convenience: the kernel and the judge decide).
    _realpath, _fsdecode, _sep, _isabs, _str, _bytes = os.path.realpath, os.fsdecode, os.sep, os.path.isabs, str, bytes
    _isinstance, _len, _int, _PermissionError, _as_str, _join = isinstance, len, int, PermissionError, str.__str__, bytes.join
    _PathTypes = (str, bytes, os.PathLike)
    readable = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, folder})
    refused_modules = frozenset(limits["refused_modules"])
    refused_events = frozenset({
        "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn",
        "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "ctypes.dlopen", "ctypes.dlsym",
        "ctypes.call_function", "os.kill", "os.killpg", "sys._getframe", "sys._current_frames", "sys.settrace",
        "sys.setprofile", "gc.get_objects", "gc.get_referrers", "gc.get_referents", "os.truncate", "os.utime",
        "os.chown", "os.chflags", "os.setxattr", "os.removexattr", "os.chroot", "os.mknod", "os.mkfifo", "code.__new__",
        "marshal.loads", "marshal.load", "function.__new__"})
    path_events = {"os.remove": (1, (1,)), "os.rmdir": (1, (1,)), "os.mkdir": (1, (2,)), "os.chmod": (1, (2,)),
                   "os.rename": (2, (2, 3)), "os.link": (2, (2, 3)), "os.symlink": (2, (2,)), "shutil.rmtree": (1, ()),
                   "os.listdir": (1, ()), "os.scandir": (1, ()), "os.chdir": (1, ())}
    frame_attributes = frozenset({"tb_frame", "f_back", "f_locals", "f_globals", "gi_frame", "cr_frame", "ag_frame",
                                  "f_builtins"})

    def outside(value):
        path = _realpath(_fsdecode(value))
        return not (path + _sep).startswith(folder + _sep), path

    def exact(value):  # a str or bytes argument as its real content (a subclass can lie in its methods)
        if _isinstance(value, _str):
            return _as_str(value)
        if _isinstance(value, _bytes):
            return _join(b"", [value])
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
    return guard

# ------------------------------------------------------------------ the judge

class OutOfTime(BaseException):
    pass

class Gone(Exception):
    pass

def read_exactly(fd, size):
    data = b""
    while len(data) < size:
        chunk = os.read(fd, min(size - len(data), 1 << 20))
        if not chunk:
            break
        data += chunk
    return data

def main():
    # The job's first part (limits, prelude, program): what the program's process is forked with.
    part = json.loads(read_exactly(0, int(read_exactly(0, 12))))
    limits, results = part["limits"], int(sys.argv[1])
    del sys.argv[1:]

    def say(kind, index=-1, result="", detail="", output=""):
        line = repr((kind, index, result, str(detail)[: limits["detail_chars"]], output)) + "\n"
        try:
            os.write(results, line.encode("utf-8", "replace"))
        except BaseException:
            os._exit(3)

    program = {"pid": 0, "to": -1, "answers": None, "names": set(), "in_call": 0, "calls": 0}

    def leave():
        if program["pid"]:
            stop_program()
        os._exit(0)

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
        for name in limits["preload"] + [n for n in sys.builtin_module_names if n not in limits["refused_modules"]]:
            try:
                __import__(name)
            except ImportError:
                pass
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no other process of its user reads its /proc
        if os.getuid() == 0 and limits["drop_to"] is not None:
            os.setgroups([])
            os.setgid(limits["drop_to"])
            os.setuid(limits["drop_to"])
    except Exception as err:
        say("sandbox_error", detail=last_line(err))
        os._exit(0)
    settings = {"filter": bytes.fromhex(limits["filter"]), "guard": limits["python_guard"]}

    def start_program():
        # Fork the program's process, before the judge reads the tests (they are never in its
        # memory): fd 0 the calls it reads, fd 3 its answers, nothing else open (not the job).
        calls_r, calls_w = os.pipe()
        answers_r, answers_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.dup2(calls_r, 0)
                os.dup2(answers_w, 3)
                os.closerange(4, 1 << 16)
                serve(part, settings)
            finally:
                os._exit(4)
        os.close(calls_r)
        os.close(answers_w)
        program.update(pid=pid, to=calls_w, answers=Lines(answers_r, limits["value_chars"] + 4096))

    def answer():
        try:
            message = from_repr(program["answers"].next(), 1_000_000)
        except (EOFError, OSError, ValueError, SyntaxError, MemoryError, RecursionError, TypeError) as err:
            raise Gone("the program's process " + ("ended" if type(err) is EOFError else "answered garbage"))
        if type(message) is not tuple or not message or type(message[0]) is not str:
            raise Gone("the program's process answered garbage")
        return message

    def stop_program():
        pid, program["pid"] = program["pid"], 0
        for fd in (program["to"], program["answers"].fd if program["answers"] else -1):
            try:
                os.close(fd)
            except OSError:
                pass
        program.update(to=-1, answers=None, in_call=0)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass

    def answer_to(number):
        # The program's answer to call `number` (an answer to a call given up on is dropped).
        while True:
            message = answer()
            if message[0] in ("value", "raised", "output") and len(message) > 1 and type(message[1]) is int:
                if message[1] == number:
                    return message
                if message[1] < number:
                    continue
            raise Gone("the program's process answered garbage")

    def call(name, args, kwargs):
        # One call of the program's function `name`: plain data there, plain data back.
        try:
            crossing = ("call", plain(args), plain(kwargs))
        except (TypeError, ValueError) as err:
            raise TypeError("this test passes the program something that cannot cross to its process (" + str(err) + ")")
        if not program["pid"]:
            raise Gone("the program's process was ended when an earlier test ran out of time")
        program["calls"] += 1
        program["in_call"] = number = program["calls"]
        try:
            send(program["to"], ("call", number, name) + crossing[1:])
            message = answer_to(number)
        except (Gone, OSError):
            stop_program()
            raise Gone("the program's process ended")
        program["in_call"] = 0
        if message[0] == "value" and len(message) == 3:
            return message[2]
        if message[0] == "raised" and len(message) == 4 and type(message[2]) is str and type(message[3]) is str:
            kind, text = pristine.get(message[2]), message[3].partition(": ")[2]
            try:
                error = kind(text) if isinstance(kind, type) and issubclass(kind, Exception) else RuntimeError(message[3])
            except BaseException:
                error = RuntimeError(message[3])
            raise error
        stop_program()
        raise Gone("the program's process answered garbage")

    def interrupt_program():
        # A test ran out of time during a call: the program's process turns the judge's signal into
        # an exception and answers that call; one that does not answer within 0.5 s is ended.
        if not (program["pid"] and program["in_call"]):
            return
        try:
            os.kill(program["pid"], signal.SIGALRM)
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            answer_to(program["in_call"])
            signal.setitimer(signal.ITIMER_REAL, 0)
            program["in_call"] = 0
        except BaseException:
            signal.setitimer(signal.ITIMER_REAL, 0)
            stop_program()

    def proxy(name):
        def candidate(*args, **kwargs):
            return call(name, args, kwargs)
        candidate.__name__ = candidate.__qualname__ = name
        return candidate

    def test_globals(code):
        # What a test sees: the judge's builtins and standard modules, the problem's prelude, and a
        # proxy for each name it uses that the program defines as a function (never a builtin,
        # a standard module's name, or a helper the prelude defines in full).
        names = dict(problem)
        names["__builtins__"], names["__name__"] = dict(pristine), "test"
        used, stack = set(), [code]
        while stack:
            c = stack.pop()
            used |= set(c.co_names)
            stack += [k for k in c.co_consts if type(k) is type(code)]
        for name in used:
            if name in pristine or name in complete:
                continue
            if name in limits["preload"] and name in sys.modules:
                names[name] = sys.modules[name]
            elif name in program["names"]:
                names[name] = proxy(name)
        return names

    def alarm(signum, frame):
        raise OutOfTime()

    signal.signal(signal.SIGALRM, alarm)
    say("started", detail=limits["filter_status"])
    signal.setitimer(signal.ITIMER_REAL, limits["seconds_per_test"])
    try:
        start_program()
        rest = json.loads(read_exactly(0, 1 << 62))  # the tests, read after the fork
        os.close(0)
        complete = frozenset(rest["complete"])
        tests = []
        for index, code in enumerate(rest["tests"]):
            try:
                tests.append(compile(code, "test_" + str(index), "exec"))
            except (SyntaxError, ValueError) as err:  # a malformed test: an error of that test, not of the sandbox
                tests.append(last_line(err))
        del rest
        pristine = dict(builtins.__dict__)
        problem = {"__builtins__": dict(pristine), "__name__": "problem"}
        exec(compile(part["prelude"], "prelude.py", "exec"), problem)  # the problem's own helpers, for the tests
        first = answer()
        signal.setitimer(signal.ITIMER_REAL, 0)
    except OutOfTime:
        say("program", result="timeout", detail="the program's top level ran out of time")
        leave()
    except Gone as err:
        signal.setitimer(signal.ITIMER_REAL, 0)
        say("program", result="crash", detail=str(err))
        leave()
    except Exception as err:
        signal.setitimer(signal.ITIMER_REAL, 0)
        say("sandbox_error", detail=last_line(err))
        leave()
    strings = all(type(f) is str for f in first[1:])
    if first[0] == "ready" and len(first) == 2 and type(first[1]) is list:
        program["names"] = {n for n in first[1] if type(n) is str}
    elif first[0] in ("syntax_error", "sandbox_error") and len(first) == 2 and strings:
        say(first[0], detail=first[1])
        leave()
    elif first[0] == "crash" and len(first) == 3 and strings:
        say("program", result="crash", detail=first[1], output=first[2][: limits["output_chars"]])
        leave()
    else:
        say("program", result="crash", detail="the program's process answered garbage")
        leave()
    say("program", result="ok")
    for index, test in enumerate(tests):
        try:
            if type(test) is str:
                say("test", index, "error", test)
                continue
            names = test_globals(test)
            signal.setitimer(signal.ITIMER_REAL, limits["seconds_per_test"])
            exec(test, names)
            signal.setitimer(signal.ITIMER_REAL, 0)
            say("test", index, "passed")
        except OutOfTime:
            interrupt_program()
            say("test", index, "timeout", "test " + str(index) + " ran out of time")
        except AssertionError as err:
            signal.setitimer(signal.ITIMER_REAL, 0)
            say("test", index, "failed", last_line(err))
        except BaseException as err:
            signal.setitimer(signal.ITIMER_REAL, 0)
            say("test", index, "error", last_line(err))
    printed = ""
    if program["pid"]:
        signal.setitimer(signal.ITIMER_REAL, limits["seconds_per_test"])
        try:
            program["calls"] += 1
            send(program["to"], ("output", program["calls"]))
            message = answer_to(program["calls"])
            signal.setitimer(signal.ITIMER_REAL, 0)
            printed = message[2] if message[0] == "output" and len(message) == 3 and type(message[2]) is str else ""
        except BaseException:
            signal.setitimer(signal.ITIMER_REAL, 0)
    say("done", output=printed[: limits["output_chars"]])
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
                works = run_tests("def x():\n    return 1\n", ["assert x() == 1"], Limits(), mode=candidate).outcome == PASSED
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


def sandbox_record() -> dict[str, str]:
    """What the run's config.json records of the sandbox, once a program has run."""
    if _ISOLATION is None:
        return {}
    return {"sandbox/isolation": _ISOLATION, "sandbox/syscall_filter": syscall_filter(),
            "sandbox/limits": "per process (no cgroup); the program's process can start no other"}


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up on this machine (not the program's fault)."""


# ---------------------------------------------------------------------------------------------
# The trainer: start the judge, read its events with caps, decide
# ---------------------------------------------------------------------------------------------

def why_it_cannot_run() -> str:
    """"" when the sandbox runs a one-line program and its test here, else why not (the start-of-run
    check of the code task and of the python runner)."""
    try:
        works = run_tests("def x():\n    return 1\n", ["assert x() == 1"]).outcome == PASSED
    except SandboxError as err:
        return str(err)
    return "" if works else "the code sandbox could not run a one-line program here"


def complete_names(prelude: str) -> list[str]:
    """The names the prelude binds at its top level, but for the functions it only declares (a body
    of a docstring, imports, `pass` or `...`: HumanEval's entry point, which the program defines)."""
    try:
        tree = ast.parse(prelude)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return []
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            declared = all(isinstance(s, (ast.Pass, ast.Import, ast.ImportFrom))
                           or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)) for s in node.body)
            names += [] if declared else [node.name]
        elif isinstance(node, ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names += [(alias.asname or alias.name).split(".")[0] for alias in node.names]
        else:
            names += [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    return sorted(set(names))


def with_value_shown(test: str) -> str:
    """`assert A == B` without a message → the same test, which says what A was when it fails
    (the feedback a team reads: "the call returned 6"); any other test as it is."""
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return test
    statement = tree.body[0] if len(tree.body) == 1 else None
    if not (isinstance(statement, ast.Assert) and statement.msg is None and isinstance(statement.test, ast.Compare)
            and len(statement.test.ops) == 1 and isinstance(statement.test.ops[0], ast.Eq)):
        return test
    left, right = ast.unparse(statement.test.left), ast.unparse(statement.test.comparators[0])
    return (f"_value = {left}\n_shown = repr(_value)\n"
            f"assert _value == {right}, 'the call returned ' + (_shown if len(_shown) <= 200 else _shown[:200] + ' …')\n")


def run_tests(program: str, tests: list[str], limits: Limits = Limits(), mode: str | None = None,
              prelude: str = "") -> TestReport:
    """Run `prelude` + `program`'s top level in the program's process, then each test (Python
    statements, e.g. `assert f(2) == 4`) in the judge, with the prelude's helpers and proxies for
    the program's functions (`mode`: the machine's `isolation()` unless given). Never raises for
    anything the program does; raises SandboxError when the sandbox itself cannot be set up."""
    mode = mode or isolation()
    started, caps = time.monotonic(), ResultCaps()
    prelude = prelude + "\n" if prelude and not prelude.endswith("\n") else prelude
    root = os.getuid() == 0
    status = syscall_filter()
    settings = {**dataclasses.asdict(limits), "refused_modules": REFUSED_MODULES, "value_chars": caps.value_chars,
                "preload": PRELOADED_MODULES, "drop_to": NOBODY if root else None, "detail_chars": DETAIL_CHARS,
                "filter": seccomp_program(sorted(DENIED_SYSCALLS.values())).hex() if status == "seccomp" else "",
                "filter_status": status, "python_guard": PYTHON_GUARD}
    # Two parts: the judge forks the program's process after the first, so the tests are never in its memory.
    first = json.dumps({"limits": settings, "prelude": prelude, "program": program}).encode()
    second = json.dumps({"tests": [with_value_shown(t) for t in tests], "complete": complete_names(prelude)}).encode()
    folder = None
    if mode == GUARD:  # a folder of the host, writable by `nobody` only
        folder = os.path.realpath(tempfile.mkdtemp(prefix="marft-sandbox-"))
        if root:
            os.chown(folder, NOBODY, NOBODY)
    read_end, write_end = os.pipe()
    child = None
    try:
        with tempfile.TemporaryFile() as stdin:  # unnamed: nothing of the job is left in a file
            stdin.write(b"%012d" % len(first) + first + second)
            stdin.seek(0)
            child = subprocess.Popen(child_command(mode, write_end, limits), cwd=folder or "/", env=child_environment(folder or "/sandbox"),
                                     stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     pass_fds=(write_end,), start_new_session=True, close_fds=True)
        os.close(write_end)
        write_end = None
        events = read_events(read_end, child, started + limits.seconds_per_program, len(tests), caps)
    finally:
        for fd in (read_end, write_end):
            if fd is not None:
                os.close(fd)
        if child is not None:
            end_run(child, mode)
        if folder is not None:
            remove_folder(folder)
    before_start = events[: next((k for k, e in enumerate(events) if e["kind"] == "started"), len(events))]
    errors = [e for e in events if e["kind"] == "sandbox_error"]
    if errors:
        raise SandboxError(f"the code sandbox ({mode}) could not start a program here: {errors[0]['detail']}")
    if before_start == events and not any(e["kind"] == "killed" for e in events):  # the judge never started
        raise SandboxError(f"the code sandbox ({mode}) could not start a program here "
                           f"(its child exited with status {child.returncode})")
    return make_report(events, len(tests), child.returncode, time.monotonic() - started, limits)


def read_events(read_end: int, child: subprocess.Popen, deadline: float, num_tests: int,
                caps: ResultCaps = ResultCaps()) -> list[dict]:
    """The judge's events until it ends or closes the pipe, the deadline passes (then a "killed"
    event closes the list), or it has written more than the caps allow (the rest is never read)."""
    buffer, total, events = b"", 0, []
    most = num_tests + caps.extra_events
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
            if len(buffer) > caps.line_bytes:  # a line too long to be one of the judge's: drop up to its end
                buffer = b"\0"  # the rest of the line parses as nothing
            events += [e for e in (parse_event(line, caps) for line in lines) if e is not None]
            if len(events) > most or total > caps.total_bytes:
                events = events[:most]
                break
        elif child.poll() is not None:  # the judge is gone
            break
    return events


# Events after which the judge has nothing more to say.
END_EVENTS = ("done", "syntax_error", "sandbox_error", "program_end")
EVENT_KINDS = ("started", "program", "test", "done", "syntax_error", "sandbox_error")


def parse_event(line: bytes, caps: ResultCaps = ResultCaps()) -> dict | None:
    """One event line `('kind', index, 'result', 'detail', 'output')` → a dict of those five, or
    None (too long, garbled). Never raises."""
    try:
        if len(line) > caps.line_bytes:
            return None
        fields = ast.literal_eval(line.decode("utf-8", errors="replace"))
        if not (type(fields) is tuple and len(fields) == 5 and fields[0] in EVENT_KINDS and type(fields[1]) is int
                and all(type(f) is str for f in fields[2:])):
            return None
    except Exception:  # SyntaxError, ValueError, MemoryError, RecursionError, …: not an event
        return None
    kind, index, result, detail, output = fields
    if kind == "program" and result != "ok":
        kind = "program_end"  # the program's top level timed out or crashed: no test follows
    return {"kind": kind, "index": index, "result": result, "detail": detail[:DETAIL_CHARS], "output": output}


def children_in_group(group: int) -> list[int]:
    """This process's children (of any of its threads) in process group `group`: what a run leaves
    to the trainer when it is a child subreaper (or PID 1) and the run's parent died first."""
    found = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids = [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            continue
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
                if int(fields[2]) == group:  # state, ppid, pgrp
                    found.append(pid)
            except (OSError, ValueError, IndexError):
                continue
    return found


def end_run(child: subprocess.Popen, mode: str) -> None:
    """End a run and reap every process of it. In the namespace modes the judge (PID 1 of its
    namespace, the child of `unshare`) is killed first and `unshare` is let reap it (the kernel
    then ends every process of the namespace); in the guard mode the run's process group goes
    (the program's process cannot leave it: setsid and setpgid are denied). Whatever the trainer
    inherits as a child subreaper is reaped too: no zombie is left."""
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
    if mode != GUARD:
        try:
            child.wait(timeout=2.0)  # unshare reaps the judge and exits with it
        except subprocess.TimeoutExpired:
            pass
    for kill, target in ((os.killpg, child.pid), (os.kill, child.pid)):
        try:
            kill(target, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    child.wait()
    for pid in children_in_group(child.pid):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ChildProcessError, ProcessLookupError, PermissionError):
            pass


def remove_folder(folder: str) -> None:
    """Remove the guard mode's folder, however deep its tree (`rm -rf` walks it without recursion
    limits; Python's rmtree would raise past about a thousand levels)."""
    subprocess.run(["rm", "-rf", "--", folder], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    if os.path.exists(folder):
        shutil.rmtree(folder, ignore_errors=True)


def make_report(events: list[dict], num_tests: int, returncode: int | None, seconds: float, limits: Limits) -> TestReport:
    """TestReport from the judge's events (which may stop anywhere: the run can be killed at any
    point). The first event of a test decides it."""
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
        if kind == "test" and 0 <= index < num_tests and tests[index] == "not_run":
            tests[index] = event["result"] if event["result"] in (PASSED, "failed", "error", "timeout") else "error"
            if tests[index] != PASSED:
                details[index] = event["detail"]
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
