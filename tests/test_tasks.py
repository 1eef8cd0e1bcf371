"""tasks.py: the registry (the built-in math and code tasks are registered as a task of your own
is), --task loading a task from a file or a module and every mistake it can meet, and the example
task (examples/units.py) trained end to end on a tiny model, resumed, and evaluated."""
import dataclasses
import json
import re
import subprocess
import sys

import pytest

import agents
import config as config_lib
import evaluate
import generation
import marft
import run as run_lib
import tasks
from conftest import ROOT
from envs import CodeEnv, Grader, MathEnv, Problem, make_arithmetic_problems, make_code_problems
from flex_pomdp import load_organisation
from rollout import play_episodes
from scripted import ScriptedBackend, scripted_actions

EXAMPLE = str(ROOT / "examples" / "units.py")  # one spec for the whole session: a file is loaded once per spec


# ---------------------------------------------------------------------------------------------
# The registry and the built-in tasks
# ---------------------------------------------------------------------------------------------

def test_the_builtin_tasks_are_registered_as_a_task_of_your_own_is():
    assert tasks.TASKS["math"] is tasks.MATH and tasks.TASKS["code"] is tasks.CODE
    units = tasks.find_task(EXAMPLE)
    assert isinstance(units, tasks.Task) and tasks.TASKS["units"] is units and tasks.find_task(EXAMPLE) is units
    assert list(tasks.MATH.organisations) == ["single", "chain", "chain3", "chain4", "parallel", "orchestrated",
                                              "calculator_team", "orchestrated_calculator"]
    assert list(tasks.WORD.organisations) == ["calculator_team", "single", "orchestrated_calculator", "chain"]
    assert list(tasks.CODE.organisations) == ["coder", "planner_coder", "coder_reviewer"]
    cfg = config_lib.Config(horizon=2)
    context = tasks.EpisodeContext(graded_roles=("solver",), grader=None, role_rewards={})
    assert isinstance(tasks.MATH.make_env(Problem("1 + 1?", "2", "", ""), cfg, context), MathEnv)
    assert isinstance(tasks.CODE.make_env(make_code_problems("test", seed=1)[0], cfg, context), CodeEnv)


@pytest.mark.parametrize("argv, task, organisation", [
    ([], "math", "chain"),  # the default run
    (["--agents", "parallel", "--arithmetic_levels", "1"], "math", "parallel"),
    (["--data", "MATH_FILE"], "math", "chain"),
    (["--data", "code"], "code", "coder"),  # before --task, --agents coder had to be given
    (["--data", "humaneval", "--agents", "coder_reviewer"], "code", "coder_reviewer"),
    (["--data", "MBPP_FILE", "--agents", "PROFILE"], "code", "PROFILE"),  # the file's first row is a code task
    (["--task", "code", "--agents", "planner_coder"], "code", "planner_coder"),
    (["--task", EXAMPLE], EXAMPLE, "converter"),  # the task's own organisation
])
def test_without_task_the_data_chooses_it_and_without_agents_the_task_does(argv, task, organisation, tmp_path):
    files = {"MATH_FILE": tmp_path / "math.jsonl", "MBPP_FILE": tmp_path / "mbpp.jsonl", "PROFILE": tmp_path / "coders.json"}
    files["MATH_FILE"].write_text(json.dumps({"problem": "1 + 1?", "answer": "2"}) + "\n")
    files["MBPP_FILE"].write_text(json.dumps({"text": "Add one.", "test_list": ["assert f(1) == 2"]}) + "\n")
    files["PROFILE"].write_text(json.dumps({"agents": [{"role": "coder", "system_prompt": "Code.", "graded": True}],
                                            "dependencies": []}))
    cfg = config_lib.parse_args([str(files.get(a, a)) for a in argv])
    assert (cfg.task, cfg.agents) == (task, str(files.get(organisation, organisation)))


def test_the_default_command_line_is_the_default_config_with_its_task_recorded():
    assert dataclasses.replace(config_lib.parse_args([]), task="") == config_lib.Config()


def test_training_and_rollouts_on_a_builtin_task_go_through_the_registry(monkeypatch):
    """run.load_task and play_episodes ask the registry for the run's task: a math task swapped in
    the registry is the one whose problems are loaded and whose environments play the episodes."""
    from transformers import AutoTokenizer

    loaded, made = [], []

    def load(cfg):
        loaded.append(cfg)
        return tasks.MATH.load(cfg)

    def make_env(problem, cfg, context):
        made.append((problem, context.graded_roles))
        return tasks.MATH.make_env(problem, cfg, context)

    monkeypatch.setitem(tasks.TASKS, "math", dataclasses.replace(tasks.MATH, load=load, make_env=make_env))
    cfg = config_lib.parse_args(["--agents", "single", "--eval_problems", "3", "--arithmetic_levels", "1"])
    train, held_out = run_lib.load_task(cfg)
    assert loaded == [cfg] and len(held_out) == 3 and train == make_arithmetic_problems("train", seed=1, levels=(1,))
    tokenizer = AutoTokenizer.from_pretrained(agents.embedded_tokenizer_folder())
    answers = [re.search(r"What is (\d) \+ (\d)\?", p.problem).groups() for p in held_out]
    texts = [f"\\boxed{{{int(a) + int(b)}}}" for a, b in answers]
    with Grader() as grader:
        rollout = play_episodes(lambda ids, adapter, sampling: scripted_actions(tokenizer, texts), tokenizer,
                                load_organisation("single"), held_out, grader, generation.Sampling(1.0, 1.0, 8), cfg)
    assert made == [(p, ("solver",)) for p in held_out] and rollout.solved == [True] * 3


# ---------------------------------------------------------------------------------------------
# --task: every mistake stops the run with a message naming the fix
# ---------------------------------------------------------------------------------------------

TASK_FILES = {
    "not_a_task.py": "task = 42\n",
    "no_task.py": "from tasks import Task\n",
    "two_tasks.py": "from tasks import Task\nfirst = Task('first', print, print)\nsecond = Task('second', print, print)\n",
    "taken_name.py": "from tasks import Task\ntask = Task('math', print, print)\n",
    "no_load.py": "from tasks import Task\ntask = Task('no_load', None, print)\n",
    "bad_default.py": "from tasks import Task\ntask = Task('bad_default', print, print, organisations={}, default_organisation='x')\n",
    "bad_recipe.py": "from tasks import Task\ntask = Task('bad_recipe', print, print, organisations={}, "
                     "organisation_options={'solo': {'lr': 1e-4}})\n",
}


@pytest.mark.parametrize("spec, message", [
    ("missing.py", "no such file"),
    ("no_task.py", "defines no tasks.Task"),
    ("two_tasks.py", "defines several tasks (first, second): name one"),
    ("two_tasks.py:third", "has no 'third'; its tasks: first, second"),
    ("not_a_task.py:task", "task is not a tasks.Task (int)"),
    ("taken_name.py", "a task named 'math' is registered already"),
    ("no_load.py", "load must be a function"),
    ("bad_default.py", "default_organisation 'x' is none of its organisations"),
    ("bad_recipe.py", "organisation_options maps names of its organisations"),
    ("no_such_task", "no registered task of that name (math, code"),
    ("no_such_package.tasks:task", "no module 'no_such_package.tasks' to import"),
])
def test_task_mistakes_stop_the_run_naming_the_fix(spec, message, tmp_path):
    for name, text in TASK_FILES.items():
        (tmp_path / name).write_text(text)
    source, colon, name = spec.partition(":")
    path = tmp_path / source if source.endswith(".py") else source
    with pytest.raises(SystemExit) as err:
        config_lib.parse_args(["--task", f"{path}{colon}{name}"])
    assert str(err.value).startswith("--task=") and message in str(err.value)


def test_a_misspelt_option_in_a_task_recipe_is_named_even_where_the_recipe_steps_aside(tmp_path):
    """The recipe's option names are checked on every run of its organisation, also when the command
    line gives one of its options and sets it aside (else a plug-in's typo would go unnoticed there)."""
    (tmp_path / "typo.py").write_text(
        "from tasks import Task\ntask = Task('typo_recipe', print, print, organisations={'solo': {}}, "
        "organisation_options={'solo': {'minibatch_size': 4, 'minbatch_size': 4}})\n")
    for given in ([], ["--minibatch_size", "8"]):
        with pytest.raises(SystemExit, match="task typo_recipe: its options name 'minbatch_size', which is no option"):
            config_lib.parse_args(["--task", str(tmp_path / "typo.py"), "--agents", "solo", *given])


def test_an_organisation_the_task_does_not_offer_is_refused_naming_those_it_does():
    with pytest.raises(SystemExit) as err:
        config_lib.parse_args(["--task", EXAMPLE, "--agents", "chain"])
    assert "'chain' is an organisation of the math task, but the run's task is units" in str(err.value)
    assert "an organisation of the units task (converter)" in str(err.value)
    with pytest.raises(SystemExit, match="neither an organisation of the units task"):
        config_lib.parse_args(["--task", EXAMPLE, "--agents", "no_such_profile.json"])


def test_what_a_task_returns_is_checked():
    cfg = config_lib.Config()
    hollow = tasks.Task("hollow", load=lambda cfg: [Problem("1?", "1", "", "")], make_env=lambda problem, cfg, context: 42)
    with pytest.raises(SystemExit, match=r"task hollow: load\(cfg\) must return \(train, held_out\)"):
        tasks.task_problems(hollow, cfg)
    with pytest.raises(SystemExit, match="gave 1 train and 0 held-out problems"):
        tasks.task_problems(dataclasses.replace(hollow, load=lambda cfg: ([Problem("1?", "1", "", "")], [])), cfg)
    with pytest.raises(SystemExit, match="make_env returned int, not an envs.Environment"):
        tasks.make_env(hollow, Problem("1?", "1", "", ""), cfg, None)
    with pytest.raises(SystemExit, match="an info without outcomes"):
        tasks.check_step_info(hollow, {"correct": True})


def test_a_task_mistake_on_the_command_line_is_one_paragraph_and_makes_no_run_folder(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "marft.py"), "--task", "missing_task.py", "--output_dir",
                             str(tmp_path / "runs")], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "--task='missing_task.py': no such file" in result.stderr and not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------------------------
# The example task
# ---------------------------------------------------------------------------------------------

def test_the_example_fits_one_screen_and_holds_out_amounts_it_never_trains_on():
    assert len((ROOT / "examples" / "units.py").read_text().splitlines()) <= 80
    units = tasks.find_task(EXAMPLE)
    amount = lambda p: re.search(r"are in ([\d.]+) ", p.problem).group(1)
    train, held_out = units.load(config_lib.Config(seed=1))
    assert (len(train), len(held_out)) == (180, 60)
    assert not {amount(p) for p in train} & {amount(p) for p in held_out}
    assert units.load(config_lib.Config(seed=1)) == (train, held_out) and units.load(config_lib.Config(seed=2))[1] != held_out
    assert Problem("How many centimetres are in 35 metres? One metre is 100 centimetres.", "3500", "metres to centimetres",
                   "units") in train + held_out


def test_the_example_environment_rewards_the_right_amount_and_feeds_back_a_wrong_one():
    units = tasks.find_task(EXAMPLE)
    problem = Problem("How many centimetres are in 35 metres? One metre is 100 centimetres.", "3500", "", "")
    context = tasks.EpisodeContext(graded_roles=("converter",), grader=None, role_rewards={})
    env = tasks.make_env(units, problem, config_lib.Config(horizon=2), context)
    assert env.reset() == problem.problem
    observation, reward, done, info = env.step({"converter": "35 × 100 = \\boxed{35}"})
    assert (reward, done, info["correct"], info["outcomes"]) == (0.0, False, False, {"converter": "wrong"})
    assert observation.endswith("Your previous answer was wrong. Try again.")
    _, reward, done, second = env.step({"converter": "\\boxed{3,500}"})
    assert (reward, done, second["outcomes"]) == (1.0, True, {"converter": "correct"})
    env.reset()
    assert env.step({"converter": "no idea"})[3]["outcomes"] == {"converter": "unparseable"}
    assert units.metrics([info, second]) == {"relative_error": pytest.approx((1 - 35 / 3500) / 2)}


PAIRS = {(small, big): factor for big, small, factor in [("metres", "centimetres", 100), ("kilometres", "metres", 1000),
         ("kilograms", "grams", 1000), ("hours", "minutes", 60), ("days", "hours", 24), ("feet", "inches", 12)]}


def scripted_answer(problem_text: str) -> tuple[str, float]:
    """(ScriptedConverter's response, its relative error): as the base model mostly does greedily,
    powers of ten converted right, the others (12, 24, 60) left unconverted (an error of 1 − 1/factor)."""
    small, amount, big = re.search(r"How many (\w+) are in (\d+) (\w+)\?", problem_text).groups()
    amount, factor = int(amount), PAIRS[small, big]
    if factor in (100, 1000):
        return f"{amount} × {factor} = \\boxed{{{amount * factor}}}", 0.0
    return f"\\boxed{{{amount}}}", 1 - 1 / factor


class ScriptedConverter(ScriptedBackend):
    """A generation backend that answers each units problem as `scripted_answer` says."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompt_ids, adapter, sampling):
        assert adapter == "policy_converter"
        texts = [scripted_answer(self.tokenizer.decode(ids).rsplit("Problem: ", 1)[1])[0] for ids in prompt_ids]
        return scripted_actions(self.tokenizer, texts)


def test_the_example_trains_with_task_resumes_and_evaluate_reuses_its_task(tiny_model_dir, tmp_path, monkeypatch):
    """`--task examples/units.py` trains the example (tiny model, scripted converter): its rewards
    and its own metric are logged, config.json records the task, --resume and evaluate.py --run
    find it again from there."""
    monkeypatch.setattr(generation, "make_backend", lambda cfg, model, tokenizer, *a, **k: ScriptedConverter(tokenizer))
    argv = ["--task", EXAMPLE, "--model", str(tiny_model_dir), "--lora_rank", "2",
            "--batch_size", "6", "--iterations", "2", "--eval_problems", "4", "--eval_samples", "1", "--eval_interval", "1",
            "--threads", "1", "--output_dir", str(tmp_path), "--run_name", "units"]
    marft.train(config_lib.parse_args(argv))
    run_dir = tmp_path / "units"
    config = json.loads((run_dir / "config.json").read_text())
    assert (config["task"], config["agents"]) == (EXAMPLE, "converter")
    marft.train(config_lib.parse_args(["--resume", str(run_dir), "--iterations", "3", "--threads", "1"]))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    train, held_out = tasks.find_task(EXAMPLE).load(config_lib.Config(seed=1))
    for iteration in (1, 2, 3):
        answers = [scripted_answer(p.problem) for p in run_lib.iteration_batch(train, 6, 1, iteration - 1)]
        assert rows[iteration]["charts/reward"] == pytest.approx(sum(error == 0 for _, error in answers) / 6)
        assert rows[iteration]["charts/relative_error"] == pytest.approx(sum(error for _, error in answers) / 6)
    expected = [scripted_answer(p.problem) for p in held_out[:4]]
    accuracy = sum(error == 0 for _, error in expected) / 4
    assert rows[0]["eval/accuracy"] == pytest.approx(accuracy)
    assert rows[0]["eval/relative_error"] == pytest.approx(sum(error for _, error in expected) / 4)

    report = evaluate.main(["--run", str(run_dir), "--limit", "4", "--samples", "1", "--transcripts", "1", "--threads", "1"])
    assert report["evaluated"]["task"] == EXAMPLE and report["evaluated"]["dataset"] == "units (held-out)"
    assert [t["problem"] for t in report["transcripts"]] == [held_out[0].problem]
    assert report["metrics"]["eval/accuracy"] == pytest.approx(accuracy)
    assert (run_dir / "eval-iter_000003-units.json").is_file()
    with pytest.raises(SystemExit, match="the units task evaluates its own held-out problems"):
        evaluate.main(["--task", EXAMPLE, "--data", "arithmetic"])


# ---------------------------------------------------------------------------------------------
# A task's mistakes: overlapping splits, an environment that raises, misspelt option names
# ---------------------------------------------------------------------------------------------

SOLVER = {"agents": [{"role": "solver", "graded": True, "system_prompt": "Solve it; end with \\boxed{N}."}], "dependencies": []}


class StrictEnv:
    """An environment whose step divides by zero on a problem that says 1/0 (or on every problem)."""

    def __init__(self, problem: Problem, always: bool):
        self.problem, self.always = problem, always

    def reset(self, seed=None):
        return self.problem.problem

    def step(self, joint_action):
        if self.always or "1/0" in self.problem.problem:
            return 1 / 0
        return self.problem.problem, 1.0, True, {"correct": True, "outcomes": {"solver": "correct"}}


def own_task(name: str, train: list[Problem], held_out: list[Problem], always_raises: bool = False, **options) -> tasks.Task:
    return tasks.Task(name, load=lambda cfg: (train, held_out), organisations={"solo": SOLVER}, **options,
                      make_env=lambda problem, cfg, context: StrictEnv(problem, always_raises))


def test_held_out_problems_that_are_training_problems_stop_the_run_naming_both(monkeypatch):
    """Two problems are the same when their text is, whitespace aside: the first held-out problem the
    run evaluates that is a training problem is named with its index in each list."""
    train = [Problem("What is 2 + 2?", "4", "", ""), Problem("What is 3 + 3?", "6", "", "")]
    held_out = [Problem("What is 5 + 5?", "10", "", ""), Problem("  What is 3 +\n3?", "6", "", "")]
    monkeypatch.setitem(tasks.TASKS, "twice", own_task("twice", train, held_out))
    with pytest.raises(SystemExit) as stop:
        run_lib.load_task(config_lib.parse_args(["--task", "twice"]))
    assert str(stop.value) == ("task twice: held-out problem 1 is training problem 1 ('What is 3 + 3?'); held-out problems "
                               "must be none of the training problems: make its load(cfg) return two disjoint lists")
    assert run_lib.load_task(config_lib.parse_args(["--task", "twice", "--eval_problems", "1"])) == (train, held_out[:1])


DATA = str(ROOT.parent / "shared" / "data") + "/"


@pytest.mark.parametrize("argv", [[], ["--arithmetic_levels", "1,2,3,4", "--seed", "2"], ["--task", "word"], ["--task", "word_mixed"],
                                  ["--data", "code"], ["--data", "humaneval"], ["--data", DATA + "math_test.jsonl"],
                                  ["--data", DATA + "gsm8k_train.jsonl", "--eval_data", DATA + "gsm8k_test.jsonl"],
                                  ["--data", DATA + "math_train.jsonl", "--eval_data", DATA + "math_test.jsonl", "--skip_malformed_rows"]])
def test_the_builtin_tasks_hold_out_problems_they_do_not_train_on(argv):
    if any(DATA in a for a in argv) and not (ROOT.parent / "shared" / "data").is_dir():
        pytest.skip("no ../shared/data here")
    train, held_out = run_lib.load_task(config_lib.parse_args(argv))
    text = lambda p: " ".join(p.problem.split())
    assert held_out and not {text(p) for p in train} & {text(p) for p in held_out}


@pytest.mark.skipif(not (ROOT.parent / "shared" / "data").is_dir(), reason="no ../shared/data here")
def test_math_test_row_4886_is_math_train_row_3322_and_a_run_evaluating_it_stops():
    """MATH's test file repeats one training problem (test line 4886, train line 3322, the same text but
    a trailing newline; 0-based 4885 and 3321, no malformed row before it): the default 50 held-out
    problems leave it out, all 5000 do not."""
    argv = ["--data", DATA + "math_train.jsonl", "--eval_data", DATA + "math_test.jsonl", "--skip_malformed_rows"]
    with pytest.raises(SystemExit) as stop:
        run_lib.load_task(config_lib.parse_args([*argv, "--eval_problems", "5000"]))
    assert str(stop.value).startswith("task math: held-out problem 4885 is training problem 3321 ('The points $(0,0)\\\\,$")
    assert "leave it out of --data or --eval_data" in str(stop.value)


def test_an_environment_that_raises_is_named_by_task_problem_step_and_roles(monkeypatch):
    from transformers import AutoTokenizer

    problems = [Problem("What is 1 + 1?", "2", "", ""), Problem("What is 1/0?", "inf", "", "")]
    monkeypatch.setitem(tasks.TASKS, "strict", own_task("strict", problems, [Problem("What is 2 + 2?", "4", "", "")]))
    cfg = config_lib.parse_args(["--task", "strict"])
    tokenizer = AutoTokenizer.from_pretrained(agents.embedded_tokenizer_folder())
    with Grader() as grader, pytest.raises(RuntimeError) as error:
        play_episodes(lambda ids, adapter, sampling: scripted_actions(tokenizer, ["\\boxed{2}"] * len(ids)), tokenizer,
                      tasks.organisation_of(cfg), problems, grader, generation.Sampling(1.0, 1.0, 8), cfg)
    assert str(error.value) == ("task strict: its environment's step() raised ZeroDivisionError (division by zero) on problem 1 "
                                "('What is 1/0?') of the rollout, step 0, acting: solver (the task's own traceback is above)")
    assert isinstance(error.value.__cause__, ZeroDivisionError)


def test_an_environment_that_cannot_step_stops_the_run_before_its_folder(monkeypatch, tiny_model_dir, tmp_path):
    """run.set_up steps the first training and held-out problems once with empty actions before it
    writes the run folder: an environment that raises stops the run there, leaving nothing."""
    train, held_out = [Problem("What is 1 + 1?", "2", "", "")], [Problem("What is 2 + 2?", "4", "", "")]
    monkeypatch.setitem(tasks.TASKS, "broken", own_task("broken", train, held_out, always_raises=True))
    cfg = config_lib.parse_args(["--task", "broken", "--model", str(tiny_model_dir), "--output_dir", str(tmp_path / "runs")])
    with pytest.raises(RuntimeError) as error:
        marft.train(cfg)
    assert str(error.value).startswith("task broken: its environment's step() raised ZeroDivisionError (division by zero) on "
                                       "training problem 0 ('What is 1 + 1?'), step 0 (a trial step with empty actions")
    assert isinstance(error.value.__cause__, ZeroDivisionError) and not (tmp_path / "runs").exists()


def test_a_misspelt_task_option_is_named_with_the_nearest_option(monkeypatch):
    monkeypatch.setitem(tasks.TASKS, "typo_options", own_task("typo_options", [], [], options={"temprature": 0.7}))
    with pytest.raises(SystemExit, match=r"^task typo_options: its options name 'temprature', which is no option of "
                                         r"marft.py \(did you mean temperature\?\)"):
        config_lib.parse_args(["--task", "typo_options"])


def test_a_task_of_your_own_records_none_of_the_builtin_tasks_data_options(tmp_path):
    """config.json of a run of the example leaves out --data, --arithmetic_levels, … (it reads none of
    them); --config and --resume read it back with their defaults."""
    run_lib.Run(config_lib.parse_args(["--task", EXAMPLE, "--output_dir", str(tmp_path), "--run_name", "u"]))
    saved = json.loads((tmp_path / "u" / "config.json").read_text())
    assert saved["task"] == EXAMPLE and not set(tasks.DATA_OPTIONS) & set(saved)
    for again in (config_lib.parse_args(["--config", str(tmp_path / "u")]), config_lib.parse_args(["--resume", str(tmp_path / "u")])):
        assert again.task == EXAMPLE and all(getattr(again, o) == getattr(config_lib.Config(), o) for o in tasks.DATA_OPTIONS)
    # its own load may read any option: one given a value is kept
    units = tasks.find_task(EXAMPLE)
    assert tasks.unread_options(units, config_lib.Config(data="mine.jsonl")) == set(tasks.DATA_OPTIONS) - {"data"}
    assert tasks.unread_options(tasks.MATH, config_lib.Config()) == set()
