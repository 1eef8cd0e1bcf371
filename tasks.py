"""Tasks as plug-ins: what the agents are trained on, and how one episode of it is scored.

Paper: MARFT (Liao et al., arXiv 2504.16129), Sec. "Flex-POMDP": a task fixes the states (its problems),
the transitions and the team reward R; the organisation (N, D) is chosen for it. README: "Adding a task".

A `Task` is a name, `load(cfg)` → (train, held-out problems), `make_env(problem, cfg, context)` → an
envs.Environment playing one episode, and optionally organisations, metrics and default options; `register`
puts it in `TASKS`, the built-in ones as --task's plug-ins:

    math        --data arithmetic (generated), a MATH/GSM8K .jsonl/.json file or an HF dataset id
    code        --data code (generated), humaneval or an MBPP-format file: the sandbox runs the programs
    word        word problems whose arithmetic is beyond the 135M model (envs/word_problems.py)
    word_mixed  the word problems alternating with small arithmetic (calculator calls cost --tool_call_cost)

--task takes a registered name, `package.module:name`, or `path/to/file.py[:name]`; left out, --data
chooses math or code (`default_task_name`).
"""
from __future__ import annotations

import functools
import importlib.util
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Callable

import distributed
from envs import CodeEnv, Environment, Grader, MathEnv, Problem, load_problems, make_arithmetic_problems
from envs import sandbox
from envs.code_problems import is_mbpp_row
from envs.word_problems import HELD_OUT_TEMPLATES, STONE_NAMES, TEMPLATE_NAMES, make_word_problems
from flex_pomdp import BUILTIN_ORGANISATIONS, CODE_ORGANISATIONS, Organisation, load_organisation, organisation_from_dict

TASKS: dict[str, Task] = {}  # name → Task (`register`)


@dataclass(frozen=True)
class EpisodeContext:
    """What every environment of a rollout is built with, besides its problem and the Config."""
    graded_roles: tuple[str, ...]  # whose answers the environment scores (with an orchestrator: "answer", the team's)
    grader: Grader  # math-verify grading of \boxed{} answers with timeouts, one for the whole run
    role_rewards: dict  # role → ((term, weight), ...): the per-role reward terms of the agents' profiles


@dataclass(frozen=True)
class Task:
    """A task (module docstring): --agents names one of its organisations; metrics log as charts/<name>, eval/<name>."""
    name: str
    load: Callable  # (cfg) → (train, held_out)
    make_env: Callable  # (problem, cfg, context) → envs.Environment
    organisations: Mapping = field(default_factory=dict)  # name → profile dict | () → Organisation
    default_organisation: str = ""  # "": the first of `organisations`
    metrics: Callable | None = None  # (infos of every step played: list[dict]) → {name: value}
    options: Mapping = field(default_factory=dict)  # option → value: defaults for options the command line leaves out
    organisation_options: Mapping = field(default_factory=dict)  # organisation → {option → value} on top of `options`


def register(task: Task) -> Task:
    """Add a task to the registry and return it; a malformed task, or a taken name, raises ValueError naming the fix."""
    if not isinstance(task.name, str) or not task.name or not task.name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"task name {task.name!r}: give a non-empty name of letters, digits, _ and -")
    for part in ("load", "make_env"):
        if not callable(getattr(task, part)):
            raise ValueError(f"task {task.name}: {part} must be a function (the module docstring of tasks.py gives its signature)")
    if not isinstance(task.options, Mapping) or not all(isinstance(name, str) for name in task.options):
        raise ValueError(f"task {task.name}: options maps option names (config.Config fields) to their values")
    if not isinstance(task.organisation_options, Mapping) or not all(
            name in task.organisations and isinstance(options, Mapping) for name, options in task.organisation_options.items()):
        raise ValueError(f"task {task.name}: organisation_options maps names of its organisations to {{option: value}} "
                         "defaults (config.Config fields)")
    if task.metrics is not None and not callable(task.metrics):
        raise ValueError(f"task {task.name}: metrics must be a function of the steps' info dicts, or None")
    if not isinstance(task.organisations, Mapping) or not all(
            isinstance(spec, dict) or callable(spec) for spec in task.organisations.values()):
        raise ValueError(f"task {task.name}: organisations maps names to profiles (the profile file's JSON object) "
                         "or to functions that return a flex_pomdp.Organisation")
    if task.default_organisation and task.default_organisation not in task.organisations:
        raise ValueError(f"task {task.name}: default_organisation {task.default_organisation!r} is none of its "
                         f"organisations ({', '.join(task.organisations) or 'none'})")
    if TASKS.get(task.name, task) is not task:
        raise ValueError(f"a task named {task.name!r} is registered already: give yours another name")
    TASKS[task.name] = task
    return task


def default_organisation(task: Task) -> str:
    """The organisation without --agents: the task's default, else its first ("" if none: give a profile file)."""
    return task.default_organisation or next(iter(task.organisations), "")


# --- Finding the run's task: a registered name, or a plug-in loaded from a module or a file ---
def find_task(spec: str) -> Task:
    """The task --task names (module docstring); one loaded from a module or a file is registered."""
    return TASKS[spec] if spec in TASKS else load_plugin(spec)


@functools.cache  # one module object per spec, so the task it defines is registered once
def load_plugin(spec: str) -> Task:
    """Import the module or file of a --task spec and take its Task (the one it defines, without `:name`)."""
    source, _, name = spec.partition(":")
    if source.endswith(".py") or "/" in source:
        path = Path(source)
        if not path.is_file():
            raise SystemExit(f"--task={spec!r}: no such file {path}; give a .py file that defines a tasks.Task, "
                             f"package.module:name, or a registered task ({', '.join(TASKS)})")
        module_spec = importlib.util.spec_from_file_location(f"marft_task_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_spec.name] = module  # as an import would: its dataclasses and pickles find it
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(source)
        except ModuleNotFoundError as err:
            if err.name is None or not (source == err.name or source.startswith(err.name + ".")):
                raise  # the module exists and one of its own imports is missing: its traceback says which
            raise SystemExit(f"--task={spec!r}: no registered task of that name ({', '.join(TASKS)}) and no module "
                             f"{source!r} to import; a task of your own is package.module:name (its folder on "
                             "PYTHONPATH) or path/to/file.py") from None
    defined = {n: value for n, value in vars(module).items()
               if isinstance(value, Task) and all(value is not other for other in TASKS.values())}
    if name:
        if not hasattr(module, name):
            raise SystemExit(f"--task={spec!r}: {source} has no {name!r}"
                             f"{'; its tasks: ' + ', '.join(defined) if defined else ' and defines no tasks.Task'}")
        task = getattr(module, name)
        if not isinstance(task, Task):
            raise SystemExit(f"--task={spec!r}: {name} is not a tasks.Task ({type(task).__name__}); "
                             "build it with Task(name=..., load=..., make_env=...) (README: Adding a task)")
    elif len(defined) == 1:
        task, = defined.values()
    else:
        raise SystemExit(f"--task={spec!r}: {source} defines "
                         + (f"several tasks ({', '.join(defined)}): name one, {source}:<name>" if defined else
                            "no tasks.Task: build one with Task(name=..., load=..., make_env=...) (README: Adding a task)"))
    try:
        return register(task)
    except ValueError as err:
        raise SystemExit(f"--task={spec!r}: {err}") from None


def default_task_name(data: str, agents: str) -> str:
    """The task without --task: code for --data code or humaneval, a .jsonl/.json file whose first row is an
    MBPP-format code task, or an HF dataset id with a code organisation (--agents); math otherwise."""
    if data in ("code", "humaneval"):
        return "code"
    if data.endswith((".jsonl", ".json")):
        try:  # unreadable: math, whose load says why
            with open(data, encoding="utf-8") as rows:
                first = json.loads(next(r for r in rows if r.strip())) if data.endswith(".jsonl") else json.load(rows)[0]
            return "code" if is_mbpp_row(first) else "math"
        except (OSError, ValueError, StopIteration, LookupError, TypeError):
            return "math"
    return "code" if agents in CODE_ORGANISATIONS and data.partition(":")[0] != "arithmetic" else "math"


def task_of(cfg) -> Task:
    """The run's task: --task, or the one --data chooses when --task is left out."""
    return find_task(cfg.task or default_task_name(cfg.data, cfg.agents))


def organisation_of(cfg) -> Organisation:
    """The run's organisation: one of its task's organisations or a profile JSON file (--agents)."""
    task, name = task_of(cfg), cfg.agents
    offered = ", ".join(task.organisations) or "none"
    if not name:
        raise SystemExit(f"--agents: the {task.name} task offers no organisation of its own; give a profile JSON file")
    if name not in task.organisations and not Path(name).is_file():
        owner = next((other.name for other in TASKS.values() if name in other.organisations), None)
        if owner:
            raise SystemExit(f"--agents={name!r} is an organisation of the {owner} task, but the run's task is {task.name} "
                             f"(--task, or --data when --task is left out): use --task {owner}, an organisation of the "
                             f"{task.name} task ({offered}), or a profile JSON file")
        raise SystemExit(f"--agents={name!r} is neither an organisation of the {task.name} task ({offered}) "
                         "nor an existing profile JSON file")
    spec = task.organisations.get(name, lambda: load_organisation(name))  # not the task's: a profile file
    try:
        return spec() if callable(spec) else organisation_from_dict(spec, f"task {task.name}, organisation {name!r}")
    except ValueError as err:
        raise SystemExit(f"--agents={name!r}: {err}") from None


# --- What the trainer asks of a task, checked: problems, environments, step infos ---
def task_problems(task: Task, cfg) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out problems) of `task.load(cfg)`, both non-empty lists of envs.Problem."""
    loaded = task.load(cfg)
    if not (isinstance(loaded, (tuple, list)) and len(loaded) == 2
            and all(isinstance(part, (tuple, list)) and all(isinstance(p, Problem) for p in part) for part in loaded)):
        raise SystemExit(f"task {task.name}: load(cfg) must return (train, held_out), two lists of envs.Problem; "
                         f"it returned a {type(loaded).__name__}")
    train, held_out = map(list, loaded)
    if not train or not held_out:
        raise SystemExit(f"task {task.name}: load(cfg) gave {len(train)} train and {len(held_out)} held-out problems; "
                         "a run needs both")
    return train, held_out


def check_disjoint(task: Task, train: list[Problem], held_out: list[Problem], cfg) -> None:
    """Stop at the first held-out problem that is a training problem (held-out accuracy would count it), naming both."""
    same_problem_key = lambda problem: " ".join(problem.problem.split())  # the same text, whitespace aside
    first_in_train = {same_problem_key(problem): index for index, problem in reversed(list(enumerate(train)))}
    for index, problem in enumerate(held_out):
        if (key := same_problem_key(problem)) in first_in_train:
            text = key if len(key) <= 60 else key[:60] + "…"
            fix = (f"leave it out of --data or --eval_data (--data={cfg.data!r}, --eval_data={cfg.eval_data!r})"
                   if task.load in (load_math, load_code) else "make its load(cfg) return two disjoint lists")
            raise SystemExit(f"task {task.name}: held-out problem {index} is training problem {first_in_train[key]} "
                             f"({text!r}); held-out problems must be none of the training problems: {fix}")


def make_env(task: Task, problem: Problem, cfg, context: EpisodeContext) -> Environment:
    """`task.make_env(problem, cfg, context)`, checked to be an envs.Environment."""
    env = task.make_env(problem, cfg, context)
    if not isinstance(env, Environment):
        raise SystemExit(f"task {task.name}: make_env returned {type(env).__name__}, not an envs.Environment "
                         "(an object with reset(seed) and step(joint_action))")
    return env


def check_step_info(task: Task, info) -> None:
    """The info of env.step must say whether the episode is solved and how each graded answer was judged."""
    missing = [key for key in ("correct", "outcomes") if key not in info] if isinstance(info, dict) else ["a dict"]
    if missing:
        raise SystemExit(f"task {task.name}: its environment's step() returned an info without {', '.join(missing)}: "
                         "give {'correct': bool, 'outcomes': {graded role: 'correct' | 'wrong' | 'unparseable'}, ...}")


# --- The built-in tasks: math and code, read from --data (and --eval_data) ---
def read_data(cfg, code: bool) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out) of --data: generated ones split by seed, others at their last eval_problems rows; or --eval_data."""
    def read_problems(option: str, source: str, split: str) -> list[Problem]:
        try:
            return load_problems(source, split=split, seed=cfg.seed, skip_malformed=cfg.skip_malformed_rows)
        except (ValueError, FileNotFoundError, ImportError) as err:
            fix = ("" if cfg.skip_malformed_rows else
                   " (--skip_malformed_rows leaves malformed rows out with a warning naming each)")
            raise SystemExit(f"--{option}={source!r}: {err}{fix}") from None
    source = f"arithmetic:{cfg.arithmetic_levels}" if cfg.data == "arithmetic" else cfg.data
    train = read_problems("data", source, "train")
    if cfg.eval_data:
        held_out = read_problems("eval_data", cfg.eval_data, "test")
    elif cfg.data in ("arithmetic", "code"):  # generated: its test split
        held_out = read_problems("data", source, "test")
    else:  # hold out the last rows
        if len(train) <= cfg.eval_problems:
            raise SystemExit(f"--data={cfg.data!r} has {len(train)} rows: too few to hold out {cfg.eval_problems}; give --eval_data")
        train, held_out = train[: -cfg.eval_problems], train[-cfg.eval_problems :]
    check_data(code, cfg, train + held_out, "data" if not cfg.eval_data else "data and --eval_data")
    return train, held_out


def check_data(code: bool, cfg, problems: list[Problem], option: str) -> None:
    """The built-in tasks' data: math problems without tests, or code tasks with tests (no per-role rewards, a sandbox)."""
    kinds = {bool(p.tests) for p in problems}
    if len(kinds) > 1:
        raise SystemExit(f"--{option}: mixes code tasks (rows with tests) and math problems; give one kind")
    if kinds == {True} and not code:
        raise SystemExit(f"--{option} holds code tasks (rows with tests), but the run's task is math: use --task code "
                         f"with a code organisation ({', '.join(CODE_ORGANISATIONS)})")
    if not code:
        return
    if kinds == {False}:
        raise SystemExit(f"--{option} holds math problems, but the run's task is code: use --data code, humaneval or an "
                         "MBPP-format file, or --task math")
    if rewarded := [a.role for a in organisation_of(cfg).agents if a.rewards]:
        raise SystemExit(f"--agents={cfg.agents!r}: the per-role reward terms of {rewarded} score \\boxed{{}} answers, "
                         "and a code task takes none: remove 'rewards' from the profile")
    if why := sandbox.why_it_cannot_run():
        raise SystemExit(f"--{option} holds code tasks, but {why}")
    if distributed.is_main():
        print(f"[sandbox] programs run with isolation: {sandbox.isolation()} (README: The code sandbox)", flush=True)


load_math = functools.partial(read_data, code=False)  # (cfg) → (train, held-out)
load_code = functools.partial(read_data, code=True)


def math_env(problem: Problem, cfg, context: EpisodeContext) -> MathEnv:
    return MathEnv(problem, context.grader, list(context.graded_roles), horizon=cfg.horizon,
                   role_rewards=context.role_rewards)


def code_env(problem: Problem, cfg, context: EpisodeContext) -> CodeEnv:
    return CodeEnv(problem, list(context.graded_roles), horizon=cfg.horizon, role_rewards=context.role_rewards)


def program_outcome_rates(infos: list[dict]) -> dict[str, float]:
    """program/<outcome>: the fraction of graded programs that ended each way (passed, failed, …)."""
    ended = [outcome for info in infos for outcome in info.get("program_outcomes", {}).values()]
    return {f"program/{outcome}": ended.count(outcome) / len(ended) for outcome in sandbox.OUTCOMES} if ended else {}


# --- The word task: arithmetic beyond the model, where calling the calculator must be learned ---
WORD_SPLITS = (("train", 200), ("test", 50))  # (split, word problems per template)
SMALL_KINDS = {"Level 2": "small_products", "Level 3": "small_sums"}  # the mixed task's arithmetic (envs/problems.py)


def load_word(cfg) -> tuple[list[Problem], list[Problem]]:
    """Word problems (envs/word_problems.py), split by operands, two templates held out entirely."""
    refuse_data(cfg, "word")
    return tuple(make_word_problems(split, cfg.seed, count) for split, count in WORD_SPLITS)


def load_word_mixed(cfg) -> tuple[list[Problem], list[Problem]]:
    """The word problems and small arithmetic (SMALL_KINDS) alternating: any first N rows hold both kinds alike."""
    refuse_data(cfg, "word_mixed")
    alternate = lambda big, small: [row for pair in zip(big, small) for row in pair]
    return tuple(alternate(make_word_problems(split, cfg.seed, count), make_arithmetic_problems(split, cfg.seed, (2, 3)))
                 for split, count in WORD_SPLITS)


def refuse_data(cfg, task: str) -> None:
    given = [f"--{name}" for name in ("data", "eval_data", "arithmetic_levels")
             if getattr(cfg, name) != next(f.default for f in fields(cfg) if f.name == name)]
    if given:
        raise SystemExit(f"the {task} task makes its own problems and reads no {' or '.join(given)}: leave it out "
                         "(or use --task math to train on a file)")


def problem_kind(level: str) -> str:
    """A word problem's template name, small_products or small_sums (the mixed task's "small"), or the level."""
    return SMALL_KINDS.get(level, level)


def word_metrics(infos: list[dict]) -> dict[str, float]:
    """accuracy/<kind> and tools/call_rate/<kind> (steps in which a tool was called) over the steps played,
    per `problem_kind` and per group (trained, held-out and stepping-stone templates, all word, small)."""
    groups: dict[str, list[dict]] = {}
    for info in infos:
        kind = problem_kind(info["level"])
        group = ("new_templates" if kind in HELD_OUT_TEMPLATES else "stepping_stones" if kind in STONE_NAMES
                 else "trained_templates")
        for name in ([kind, "word", group] if kind in TEMPLATE_NAMES else [kind, "small"]):
            groups.setdefault(name, []).append(info)
    metrics = {}
    for name, members in sorted(groups.items()):
        metrics[f"accuracy/{name}"] = sum(info["correct"] for info in members) / len(members)
        metrics[f"tools/call_rate/{name}"] = sum(info["tools"]["calls"] > 0 for info in members) / len(members)
    return metrics


# One agent learns fastest with no critic: its episodes against their mean (REINFORCE++; docs/learning-per-minute.md).
_SINGLE_AGENT_OPTIONS = {"advantage": "group", "group_baseline": "batch", "group_size": 1, "minibatch_size": 16}
MATH = register(Task("math", load_math, math_env, default_organisation="chain",
                     organisations={n: build for n, build in BUILTIN_ORGANISATIONS.items() if n not in CODE_ORGANISATIONS},
                     organisation_options={"single": _SINGLE_AGENT_OPTIONS}))
CODE = register(Task("code", load_code, code_env, default_organisation="coder", metrics=program_outcome_rates,
                     organisations={n: BUILTIN_ORGANISATIONS[n] for n in CODE_ORGANISATIONS}))
_WORD_ORGANISATIONS = ("calculator_team", "single", "orchestrated_calculator", "chain")
# At T = 1 the untrained calculator team solves too few sampled episodes to learn from; a caller's turn is short.
_WORD_OPTIONS = {"temperature": 0.7, "max_new_tokens": 32, "eval_problems": 48}
WORD = register(Task("word", load_word, math_env, metrics=word_metrics, options=_WORD_OPTIONS,
                     organisations={n: BUILTIN_ORGANISATIONS[n] for n in _WORD_ORGANISATIONS}))
WORD_MIXED = register(replace(WORD, name="word_mixed", load=load_word_mixed, default_organisation="orchestrated_calculator"))


# --- The built-in tasks' data options, and those each built-in load reads: a run's config.json records those ---
DATA_OPTIONS = ("data", "eval_data", "arithmetic_levels", "skip_malformed_rows")
_LOADS_READ = {load_math: {"data", "eval_data", "arithmetic_levels", "skip_malformed_rows"},
               load_code: {"data", "eval_data", "skip_malformed_rows"}, load_word: set(), load_word_mixed: set()}


def unread_options(task: Task, cfg) -> set[str]:
    """The DATA_OPTIONS that `task` does not read (left out of config.json); where its load or make_env is its
    own (it may read any option), only those at their defaults. The built-in environments read none."""
    read = _LOADS_READ.get(task.load, set())
    own = task.load not in _LOADS_READ or task.make_env not in (math_env, code_env)
    defaults = {f.name: f.default for f in fields(cfg)}
    return {option for option in DATA_OPTIONS if option not in read and not (own and getattr(cfg, option) != defaults[option])}
