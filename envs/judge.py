"""The code sandbox's two processes: the judge, and the program's process it forks (envs/sandbox.py
starts this file as `python -I -S -B -c <this file's text> fd`; it imports nothing of marft).

The judge reads its job on stdin in two parts: (limits, prelude, program), then it forks the program's
process, then the tests (never in the program's memory). It limits itself, drops privileges if root,
and runs every test itself, with its own builtins, standard modules and the problem's prelude; a test
calls the program's functions through proxies (`Judge.call`). Only the judge holds the pipe `fd`: one
event a line, ('kind', index, 'result', 'detail', 'output').

Between the two processes, one line a message, the repr of a tuple of plain data: ('call', number,
name, args, kwargs), ('output', number) from the judge; ('running',) or ('sandbox_error', detail), then
('ready', names), ('crash', detail, output) or ('syntax_error', detail), then ('value', number, value),
('raised', number, kind, message), ('output', number, text) from the program. `from_repr` rebuilds them
evaluating nothing: nothing the program says is believed beyond plain values the judge asked for.
"""
import ast, builtins, contextlib, ctypes, io, json, os, resource, signal, sys

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
        if kind is ast.Name and node.id in ("inf", "nan", "infj", "nanj"):
            return float(node.id) if node.id[-1] != "j" else complex(0, float(node.id[:-1]))
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

def write_line(fd, text):
    # All of it: a write to a pipe that a signal interrupts may return having written part.
    data = (text + "\n").encode("utf-8", "replace")
    while data:
        data = data[os.write(fd, data):]

def send(fd, message):
    write_line(fd, repr(message))

# ------------------------------------------------------------------ the program's process

def serve(job, settings):
    # Runs in the forked process, reading calls on fd 0 and answering on fd 3 (nothing else open).
    limits = job["limits"]
    if settings["filter"]:
        install_filter(settings["filter"])
    state = {"computing": False}
    class Interrupted(BaseException):
        pass
    def interrupted(signum, frame):  # the judge's signal that a call ran out of time (only inside a call)
        if state["computing"]:
            state["computing"] = False
            raise Interrupted("the call ran out of time")
    signal.signal(signal.SIGALRM, interrupted)
    refuse_c_modules(limits["refused_modules"])
    requests, folder = Lines(0, 1 << 24), os.getcwd()
    output = capture_output(limits["output_chars"])
    send(3, ("running",))  # from here on, everything on fd 3 may be the program's
    namespace = run_program(job, settings, folder, output)
    send(3, ("ready", sorted(str(k) for k, v in dict.items(namespace) if type(k) is str and callable(v))))
    while True:
        message = from_repr(requests.next(), 1_000_000)
        if message[0] == "output":
            send(3, ("output", message[1], output()))
            continue
        _, number, name, args, kwargs = message
        try:
            function = namespace[name]
            state["computing"] = True
            value = function(*args, **kwargs)
            state["computing"] = False
            answer = repr(("value", number, plain(value)))
            if len(answer) > limits["value_chars"]:
                raise ValueError("the value is too large to report")
        except BaseException as err:
            state["computing"] = False
            kind = type(err).__name__ if isinstance(type(err).__name__, str) else "Exception"
            answer = repr(("raised", number, kind[:80], last_line(err)))
        write_line(3, answer)


def install_filter(bpf):
    # The seccomp filter (envs/sandbox.py builds it), after no_new_privs; or one line and exit.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        class Program(ctypes.Structure):
            _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
        code = ctypes.create_string_buffer(bpf, len(bpf))
        program = Program(len(bpf) // 8, ctypes.addressof(code))
        if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(program), 0, 0) != 0:  # NO_NEW_PRIVS, SECCOMP
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    except BaseException as err:
        send(3, ("sandbox_error", "the seccomp filter could not be installed: " + last_line(err)))
        os._exit(3)


def refuse_c_modules(refused):
    # The refused C modules leave sys.modules and this file's globals, and no C module loads on any
    # path (import, importlib, _imp): a refused module stays refused.
    for name in list(sys.modules):
        if name.split(".")[0] in refused:
            del sys.modules[name]
    for name in refused:
        globals().pop(name, None)
    import _imp
    def no_c_module(*args):
        raise ImportError("sandbox: no C module is loaded once the program runs (import it from PRELOADED_MODULES)")
    for loader in ("create_builtin", "create_dynamic", "exec_builtin", "exec_dynamic"):
        if hasattr(_imp, loader):
            setattr(_imp, loader, no_c_module)


def capture_output(cap):
    # What the program prints goes into a buffer of `cap` characters; returns the reader of it.
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
    printed = Printed(cap)
    sys.stdout = sys.stderr = printed
    sys.stdin = io.StringIO("")
    def output():
        try:
            return "".join(p for p in printed.parts if type(p) is str)[:cap]
        except BaseException:
            return ""
    return output


def run_program(job, settings, folder, output):
    # The prelude and the program at top level; their namespace, or one line and exit.
    try:
        code = compile(job["prelude"] + job["program"], "program.py", "exec")
    except (SyntaxError, ValueError) as err:
        send(3, ("syntax_error", last_line(err)))
        os._exit(0)
    namespace = {"__name__": "program", "exit": sys.exit, "quit": sys.exit}  # as the site module would give
    if settings["guard"]:
        sys.addaudithook(guard_for(folder, job["limits"]))
    sys.setrecursionlimit(2000)
    try:
        exec(code, namespace)
    except BaseException as err:
        send(3, ("crash", last_line(err), output()))
        os._exit(0)
    return namespace


def guard_for(folder, limits):
    # The Python guard of the program's process: clear errors for an honest program that reaches for a
    # process, a socket, C or a file outside its folder. A convenience: the kernel and the judge decide,
    # and nothing of value is in this process. Most of what it calls is bound here, before the program runs.
    _realpath, _fsdecode, _sep, _isabs, _str, _bytes = os.path.realpath, os.fsdecode, os.sep, os.path.isabs, str, bytes
    _isinstance, _len, _int, _PermissionError, _as_str, _join = isinstance, len, int, PermissionError, str.__str__, bytes.join
    _PathTypes = (str, bytes, os.PathLike)
    readable = tuple(os.path.realpath(p) + os.sep for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, folder})
    refused_modules = frozenset(limits["refused_modules"])
    refused_events = frozenset({
        "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn",
        "socket.__new__", "socket.connect", "socket.bind", "socket.sendto", "ctypes.dlopen", "ctypes.dlsym",
        "ctypes.call_function", "os.kill", "os.killpg", "os.truncate", "os.utime", "os.chown", "os.chflags",
        "os.setxattr", "os.removexattr", "os.chroot", "os.mknod", "os.mkfifo"})
    path_events = {"os.remove": (1, (1,)), "os.rmdir": (1, (1,)), "os.mkdir": (1, (2,)), "os.chmod": (1, (2,)),
                   "os.rename": (2, (2, 3)), "os.link": (2, (2, 3)), "os.symlink": (2, (2,)), "shutil.rmtree": (1, ()),
                   "os.listdir": (1, ()), "os.scandir": (1, ()), "os.chdir": (1, ())}
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
        if event in refused_events:
            raise _PermissionError("sandbox: " + event + " is not allowed")
        if event == "import" and args and (_str(args[0]).split(".")[0] in refused_modules
                                           or _str(args[0]).startswith(("_test", "_xx"))):
            raise _PermissionError("sandbox: importing " + _str(args[0]) + " is not allowed")
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

def quietly(function, *args):  # an OSError here (a descriptor or process already gone) changes nothing
    try:
        function(*args)
    except OSError:
        pass

def read_exactly(fd, size):
    data = b""
    while len(data) < size:
        chunk = os.read(fd, min(size - len(data), 1 << 20))
        if not chunk:
            break
        data += chunk
    return data

class Judge:
    """The judge's side: its limits, the program's process it forks, the proxies the tests call."""
    def __init__(self, part, results):
        self.part, self.limits, self.results = part, part["limits"], results
        self.program = {"pid": 0, "to": -1, "answers": None, "names": set(), "in_call": 0, "calls": 0}
        self.pristine, self.problem, self.complete, self.declared = {}, {}, frozenset(), frozenset()
        self.settings = {}  # the program's process's seccomp filter and Python guard, read before the fork

    def say(self, kind, index=-1, result="", detail="", output=""):
        try:
            send(self.results, (kind, index, result, str(detail)[: self.limits["detail_chars"]], output))
        except BaseException:
            os._exit(3)

    def leave(self, kind=None, **event):
        # Say a last event (if any), end the program's process, exit.
        if kind:
            self.say(kind, **event)
        if self.program["pid"]:
            self.stop_program()
        os._exit(0)

    def limit_itself(self):
        # rlimits, the preloaded modules, no /proc for others of its user; or one line and exit.
        limits = self.limits
        try:
            mib = 1024 * 1024
            for name, value in (("RLIMIT_AS", limits["memory_mib"] * mib), ("RLIMIT_CPU", int(limits["seconds_per_program"]) + 1),
                                ("RLIMIT_FSIZE", limits["file_mib"] * mib), ("RLIMIT_NOFILE", limits["open_files"]),
                                ("RLIMIT_CORE", 0)):
                kind = getattr(resource, name)
                hard = resource.getrlimit(kind)[1]
                value = value if hard == resource.RLIM_INFINITY else min(value, hard)
                resource.setrlimit(kind, (value, value))
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file past the limit raises OSError instead of killing
            for name in limits["preload"] + [n for n in sys.builtin_module_names if n not in limits["refused_modules"]]:
                with contextlib.suppress(ImportError):
                    __import__(name)
            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no other process of its user reads its /proc
        except Exception as err:
            self.leave("sandbox_error", detail=last_line(err))  # no program's process yet

    def drop_privileges(self, chroot):
        # To `nobody` when root; the program's process of the guard mode first into its folder
        # alone (chroot: no host file to read or write, no /proc, no /tmp).
        if os.getuid() == 0 and self.limits["drop_to"] is not None:
            if chroot:
                os.chroot(os.getcwd())
                os.chdir("/")
            os.setgroups([])
            os.setgid(self.limits["drop_to"])
            os.setuid(self.limits["drop_to"])

    def start_program(self):
        # Fork the program's process, before the judge reads the tests (they are never in its
        # memory): fd 0 the calls it reads, fd 3 its answers, nothing else open (not the job).
        limits = self.limits
        calls_r, calls_w = os.pipe()
        answers_r, answers_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.dup2(calls_r, 0)
                os.dup2(answers_w, 3)
                os.closerange(4, 1 << 16)
                processes = min(limits["processes"], resource.getrlimit(resource.RLIMIT_NPROC)[1])
                resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))  # the program's, after the judge's one fork
                self.drop_privileges(limits["chroot"])
                serve(self.part, self.settings)
            finally:
                os._exit(4)
        os.close(calls_r)
        os.close(answers_w)
        self.program.update(pid=pid, to=calls_w, answers=Lines(answers_r, limits["value_chars"] + 4096))
        self.drop_privileges(False)

    def answer(self):
        try:
            message = from_repr(self.program["answers"].next(), 1_000_000)
        except Exception as err:  # EOF, garbage, an int too large for a float, …: never the judge's own error
            raise Gone("the program's process " + ("ended" if type(err) is EOFError else "answered garbage"))
        if type(message) is not tuple or not message or type(message[0]) is not str:
            raise Gone("the program's process answered garbage")
        return message

    def stop_program(self):
        program = self.program
        pid, program["pid"] = program["pid"], 0
        for fd in (program["to"], program["answers"].fd if program["answers"] else -1):
            quietly(os.close, fd)
        program.update(to=-1, answers=None, in_call=0)
        quietly(os.kill, pid, signal.SIGKILL)
        quietly(os.waitpid, pid, 0)

    def answer_to(self, number):
        # The program's answer to call `number` (an answer to a call given up on is dropped).
        while True:
            message = self.answer()
            if message[0] in ("value", "raised", "output") and len(message) > 1 and type(message[1]) is int:
                if message[1] == number:
                    return message
                if message[1] < number:
                    continue
            raise Gone("the program's process answered garbage")

    def call(self, name, args, kwargs):
        # One call of the program's function `name`: plain data there, plain data back.
        program = self.program
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
            message = self.answer_to(number)
        except (Gone, OSError):
            self.stop_program()
            raise Gone("the program's process ended")
        program["in_call"] = 0
        if message[0] == "value" and len(message) == 3:
            return message[2]
        if message[0] == "raised" and len(message) == 4 and type(message[2]) is str and type(message[3]) is str:
            kind, text = self.pristine.get(message[2]), message[3].partition(": ")[2]
            crosses = isinstance(kind, type) and issubclass(kind, Exception) and not issubclass(kind, (StopIteration, StopAsyncIteration))
            try:  # (a StopIteration would end the test's own loop, `all(map(f, xs))`, as if every f(x) were true)
                error = kind(text) if crosses else RuntimeError(message[3])
            except BaseException:
                error = RuntimeError(message[3])
            raise error
        self.stop_program()
        raise Gone("the program's process answered garbage")

    def interrupt_program(self):
        # A test ran out of time during a call: the program's process turns the judge's signal into
        # an exception and answers that call; one that does not answer within 0.5 s is ended.
        program = self.program
        if not (program["pid"] and program["in_call"]):
            return
        try:
            os.kill(program["pid"], signal.SIGALRM)
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            self.answer_to(program["in_call"])
            signal.setitimer(signal.ITIMER_REAL, 0)
            program["in_call"] = 0
        except BaseException:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self.stop_program()

    def proxy(self, name):
        def candidate(*args, **kwargs):
            return self.call(name, args, kwargs)
        candidate.__name__ = candidate.__qualname__ = name
        return candidate

    def test_globals(self, code):
        # What a test sees: the judge's builtins and standard modules, the problem's prelude, and a
        # proxy for each name it uses that the program defines as a function (never a builtin,
        # a standard module's name, or a helper the prelude defines in full).
        names = dict(self.problem)
        names["__builtins__"], names["__name__"] = dict(self.pristine), "test"
        used, stack = set(), [code]
        while stack:
            c = stack.pop()
            used |= set(c.co_names)
            stack += [k for k in c.co_consts if type(k) is type(code)]
        defined = self.program["names"]
        for name in used:
            if name in self.declared and name in defined:  # the problem says the program defines it
                names[name] = self.proxy(name)
                continue
            if name in self.pristine or name in self.complete:
                continue
            if name in self.limits["preload"] and name in sys.modules:
                names[name] = sys.modules[name]
            elif name in defined:
                names[name] = self.proxy(name)
        return names

    def read_tests(self):
        # The job's second part, read after the fork; each test compiled (a malformed one: its error).
        rest = json.loads(read_exactly(0, 1 << 62))
        os.close(0)
        self.complete, self.declared = frozenset(rest["complete"]), frozenset(rest["declared"])
        tests = []
        for index, code in enumerate(rest["tests"]):
            try:
                tests.append(compile(code, "test_" + str(index), "exec"))
            except (SyntaxError, ValueError) as err:  # a malformed test: an error of that test, not of the sandbox
                tests.append(last_line(err))
        self.pristine = dict(builtins.__dict__)
        self.problem = {"__builtins__": dict(self.pristine), "__name__": "problem"}
        exec(compile(self.part["prelude"], "prelude.py", "exec"), self.problem)  # the problem's own helpers, for the tests
        return tests

    def start(self):
        # Fork the program, read the tests, and wait for the program's top level; returns the tests
        # once it is ready (its function names kept), or says why not (crash, syntax_error, …) and leaves.
        signal.setitimer(signal.ITIMER_REAL, self.limits["seconds_per_test"])
        try:
            self.start_program()
            tests = self.read_tests()
            first = self.answer()  # ("running",), or why the sandbox could not start it: before any code of the program
            if first[0] == "sandbox_error" and len(first) == 2 and type(first[1]) is str:
                signal.setitimer(signal.ITIMER_REAL, 0)
                self.leave("sandbox_error", detail=first[1])
            if first != ("running",):
                raise Gone("the program's process answered garbage")
            first = self.answer()  # the program's: ready, crash or syntax_error
            signal.setitimer(signal.ITIMER_REAL, 0)
        except OutOfTime:
            self.leave("program", result="timeout", detail="the program's top level ran out of time")
        except Gone as err:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self.leave("program", result="crash", detail=str(err))
        except Exception as err:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self.leave("sandbox_error", detail=last_line(err))
        strings = all(type(f) is str for f in first[1:])
        if first[0] == "ready" and len(first) == 2 and type(first[1]) is list:
            self.program["names"] = {n for n in first[1] if type(n) is str}
        elif first[0] == "syntax_error" and len(first) == 2 and strings:
            self.leave("syntax_error", detail=first[1])
        elif first[0] == "crash" and len(first) == 3 and strings:
            self.leave("program", result="crash", detail=first[1], output=first[2][: self.limits["output_chars"]])
        else:
            self.leave("program", result="crash", detail="the program's process answered garbage")
        self.say("program", result="ok")
        return tests

    def run_tests(self, tests):
        for index, test in enumerate(tests):
            try:
                if type(test) is str:
                    self.say("test", index, "error", test)
                    continue
                names = self.test_globals(test)
                signal.setitimer(signal.ITIMER_REAL, self.limits["seconds_per_test"])
                exec(test, names)
                signal.setitimer(signal.ITIMER_REAL, 0)
                self.say("test", index, "passed")
            except OutOfTime:
                self.interrupt_program()
                self.say("test", index, "timeout", "test " + str(index) + " ran out of time")
            except BaseException as err:
                signal.setitimer(signal.ITIMER_REAL, 0)
                self.say("test", index, "failed" if issubclass(type(err), AssertionError) else "error", last_line(err))

    def printed(self):
        # What the program printed, asked for last (nothing once its process was ended).
        program = self.program
        if not program["pid"]:
            return ""
        signal.setitimer(signal.ITIMER_REAL, self.limits["seconds_per_test"])
        try:
            program["calls"] += 1
            send(program["to"], ("output", program["calls"]))
            message = self.answer_to(program["calls"])
            signal.setitimer(signal.ITIMER_REAL, 0)
            return message[2] if message[0] == "output" and len(message) == 3 and type(message[2]) is str else ""
        except BaseException:
            signal.setitimer(signal.ITIMER_REAL, 0)
            return ""


def alarm(signum, frame):
    raise OutOfTime()


def main():
    # The job's first part (limits, prelude, program): what the program's process is forked with.
    part = json.loads(read_exactly(0, int(read_exactly(0, 12))))
    judge = Judge(part, int(sys.argv[1]))
    del sys.argv[1:]
    judge.limit_itself()
    judge.settings = {"filter": bytes.fromhex(judge.limits["filter"]), "guard": judge.limits["python_guard"]}
    signal.signal(signal.SIGALRM, alarm)
    judge.say("started", detail=judge.limits["filter_status"])
    judge.run_tests(judge.start())
    judge.leave("done", output=judge.printed()[: judge.limits["output_chars"]])


if __name__ == "__main__":
    main()
