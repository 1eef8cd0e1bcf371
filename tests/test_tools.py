"""tools.py: the calculator, a fixed policy. Values worked by hand; every input a policy could
write that is not arithmetic, or is arithmetic too large, is an error text, never an exception."""
from fractions import Fraction
from pathlib import Path

import torch

import pytest

import tools


@pytest.mark.parametrize("expression, value", [
    ("964*59", "56876"),  # 964·59 = 964·60 − 964 = 57840 − 964
    ("361 + 25 * 12", "661"),  # 25·12 = 300
    ("237 * 82", "19434"),  # 237·80 + 237·2 = 18960 + 474
    ("1/3 + 1/6", "1/2"),  # 2/6 + 1/6 = 3/6
    ("2*(3+4) - -5", "19"),
    ("7/2", "7/2"),
    ("0.1 + 0.2", "3/10"),  # exact: decimals are read as written, not as binary floats
    ("2**10", "1024"),
    ("2^-2", "1/4"),  # ^ is read as a power
    ("17 // 5", "3"),
    ("-17 % 5", "3"),  # Python's sign convention: −17 = 5·(−4) + 3
    ("6 × 7 ÷ 3", "14"),
    ("613\\times47", "28811"),  # LaTeX's operators, as a trained caller writes them: 613·47 = 24520 + 4291
    ("6 \\cdot 7 \\div 3", "14"),
    ("  +42 ", "42"),
    ("1e3 + .5", "2001/2"),
    ("0x10 + 1_000", "1016"),
])
def test_the_calculator_is_exact_on_integers_and_fractions(expression, value):
    assert tools.format_value(tools.calculate(expression)) == value


@pytest.mark.parametrize("expression, words", [
    ("", "empty expression"),
    ("3 +", "not an arithmetic expression"),
    ("7 / (3 - 3)", "division by zero"),
    ("5 % 0", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("__import__('os').system('id')", "not Call"),
    ("x + 1", "not Name"),
    ("(1).real", "not Attribute"),
    ("[1, 2]", "not List"),
    ("True + 1", "not Constant"),
    ("'a' * 3", "not Constant"),
    ("2 ** 0.5", "whole numbers"),
    ("2 ** 65", "whole numbers up to 64"),
    ("10 ** 64 * 10 ** 64 * 10 ** 64 * 10 ** 64", "more than 200 digits"),
    ("9" * 201, "longer than 200 characters"),
    ("+".join(["1"] * 99), "more than 100 parts"),
    ("(" * 150 + "1" + ")" * 150, "longer than 200 characters"),
    ("-" * 190 + "1", "more than 100 parts"),
    ("lambda: 1", "not Lambda"),
    ("1j", "not Constant"),
    ("1e999999999", "more than 200 digits"),  # refused from its exponent, before 10^999999999 is built
    ("1e-400", "more than 200 digits"),  # not rounded to 0 as a float would be
    ("1e200 * 1e200", "more than 200 digits"),
    ("2 ** -64 ** 64", "whole numbers up to 64"),  # ** is right-associative: the exponent is −64^64
])
def test_what_is_not_bounded_arithmetic_is_refused_with_a_reason(expression, words):
    with pytest.raises(tools.CalculatorError, match=words):
        tools.calculate(expression)


def test_the_tools_action_evaluates_every_call_it_reads_and_never_raises():
    text = "Multiply first: \\calc{964*59}. Then \\calc{1/0} and \\calc{open('x')}."
    assert tools.calculator_action(text) == ("964*59 = 56876\n1/0: error: division by zero\n"
                                             "open('x'): error: only numbers and + - * / // % ** ( ) are allowed, not Call")
    assert tools.calculator_action("I will just answer 5.") == "error: no \\calc{...} expression to evaluate"
    many = " ".join(f"\\calc{{{k}+1}}" for k in range(6))
    assert tools.calculator_action(many).splitlines() == ["0+1 = 1", "1+1 = 2", "2+1 = 3", "3+1 = 4",
                                                          "error: only the first 4 \\calc{...} expressions are evaluated"]
    assert tools.calculate("1/3") == Fraction(1, 3)


def test_random_text_in_a_call_always_gives_text():
    """Whatever a policy writes between the braces (2,000 random strings of the characters of
    arithmetic and of Python literals), the tool's action is a string: no exception escapes."""
    import random
    rng = random.Random(0)
    pieces = list("0123456789") + ["+", "-", "*", "/", "//", "%", "**", "(", ")", ".", "e", "_", "j", "x", " ", "^", "1e50"]
    for _ in range(2000):
        expression = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
        assert isinstance(tools.calculator_action(f"\\calc{{{expression}}}"), str)


# ---------------------------------------------------------------------------------------------
# A tool in an organisation: caller → calculator → answerer
# ---------------------------------------------------------------------------------------------

import json  # noqa: E402

import config as config_lib  # noqa: E402
import marft  # noqa: E402
import run as run_lib  # noqa: E402
from envs import Grader, Problem  # noqa: E402
from flex_pomdp import load_organisation, organisation_from_dict  # noqa: E402
from generation import Sampling  # noqa: E402
from rollout import play_episodes  # noqa: E402
from scripted import ScriptedBackend, scripted_actions  # noqa: E402

CALLER_CALCULATOR_ANSWERER = {
    "agents": [{"role": "caller", "system_prompt": "Write the arithmetic as \\calc{EXPRESSION}."},
               {"role": "calculator", "tool": "calculator"},
               {"role": "answerer", "system_prompt": "Answer with \\boxed{N}.", "graded": True}],
    "dependencies": [["caller", "calculator"], ["calculator", "answerer"], ["caller", "answerer"]],
}


class ScriptedCallerAndAnswerer(ScriptedBackend):
    """The caller writes one \\calc{...}; the answerer copies the calculator's result, which must
    be in its prompt. Records every adapter asked to generate."""

    def __init__(self, tokenizer):
        self.tokenizer, self.adapters, self.answerer_prompts = tokenizer, [], []

    def generate(self, prompt_ids, adapter, sampling):
        self.adapters.append(adapter)
        prompts = [self.tokenizer.decode(ids) for ids in prompt_ids]
        if adapter == "policy_caller":
            texts = ["\\calc{" + p.rsplit("What is ", 1)[1].split("?")[0] + "}" for p in prompts]
        else:
            self.answerer_prompts += prompts
            texts = ["\\boxed{" + p.rsplit("Calculator: ", 1)[1].split(" = ")[1].split("<")[0].strip() + "}" for p in prompts]
        return scripted_actions(self.tokenizer, texts)


def test_a_tool_acts_in_sigma_order_and_takes_no_sample_position_or_adapter(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    profile = tmp_path / "calc.json"
    profile.write_text(json.dumps(CALLER_CALCULATOR_ANSWERER))
    org, cfg = load_organisation(str(profile)), config_lib.Config(agents=str(profile))
    assert org.order == ("caller", "calculator", "answerer") and org.learners == ("caller", "answerer")
    problems = [Problem("What is 964 * 59?", "56876", "", ""), Problem("What is 361 + 25 * 12?", "661", "", "")]
    team = ScriptedCallerAndAnswerer(tokenizer)
    with Grader() as grader:
        rollout = play_episodes(team.generate, tokenizer, org, problems, grader, Sampling(1.0, 1.0, 16), cfg)
    assert team.adapters == ["policy_caller", "policy_answerer"]  # the calculator generates nothing
    assert "Calculator: 964 * 59 = 56876" in team.answerer_prompts[0] and "Calculator: 361 + 25 * 12 = 661" in team.answerer_prompts[1]
    assert rollout.solved == [True, True]
    assert [org.order[n] for n in rollout.agent_index] == ["caller", "caller", "answerer", "answerer"]
    assert rollout.position == [0, 0, 1, 1]  # the answerer is the step's second action: the tool has no place


def test_a_team_with_a_tool_trains_without_an_adapter_for_the_tool(tmp_path, tiny_model_dir):
    profile = tmp_path / "calc.json"
    profile.write_text(json.dumps(CALLER_CALCULATOR_ANSWERER))
    cfg = config_lib.parse_args(["--model", str(tiny_model_dir), "--agents", str(profile), "--lora_rank", "2", "--batch_size", "2",
                              "--max_new_tokens", "4", "--eval_problems", "2", "--eval_samples", "1", "--iterations", "1",
                              "--threads", "1", "--output_dir", str(tmp_path), "--run_name", "tool"])
    org, model, _, heads, optimisers = run_lib.build(cfg)
    assert set(optimisers) == {"policy_caller", "policy_answerer", "critic"}
    assert not any(".policy_calculator." in name for name, _ in model.named_parameters())
    summary = marft.train(cfg)
    row = json.loads((tmp_path / "tool" / "metrics.jsonl").read_text().splitlines()[1])
    assert summary["final_iteration"] == 1 and "charts/value_mean/calculator" not in row
    assert {"losses/policy_loss/caller", "losses/policy_loss/answerer"} <= set(row)
    assert not any(key.endswith("/calculator") for key in row)


@pytest.mark.parametrize("change, words", [
    (lambda spec: spec["agents"][1].update(graded=True), "takes only 'role', 'tool' and 'description'"),
    (lambda spec: spec["agents"][1].update(system_prompt="Compute."), r"takes only .* not \['system_prompt'\]"),
    (lambda spec: spec["agents"][1].update(tool=""), "names a tool"),
    (lambda spec: spec.update(agents=[spec["agents"][1] | {"role": "a"}, spec["agents"][1]], dependencies=[]), "graded"),
])
def test_a_tool_entry_that_cannot_work_is_named(change, words):
    spec = json.loads(json.dumps(CALLER_CALCULATOR_ANSWERER))
    change(spec)
    with pytest.raises(ValueError, match=words):
        organisation_from_dict(spec, "team.json")


def test_an_unknown_tool_and_a_tool_as_orchestrator_are_refused_at_start(tmp_path):
    with pytest.raises(ValueError, match="cannot be a tool"):
        organisation_from_dict({"agents": [{"role": "solver", "system_prompt": "S", "graded": True, "description": "d"},
                                           {"role": "calculator", "tool": "calculator"}],
                                "orchestrator": "calculator", "max_calls": 2}, "team.json")
    with pytest.raises(ValueError, match=r"\['calculator'\] need a one-line 'description'"):
        organisation_from_dict({"agents": [{"role": "boss", "system_prompt": "B"},
                                           {"role": "solver", "system_prompt": "S", "graded": True, "description": "d"},
                                           {"role": "calculator", "tool": "calculator"}],
                                "orchestrator": "boss", "max_calls": 2}, "team.json")
    spec = json.loads(json.dumps(CALLER_CALCULATOR_ANSWERER))
    spec["agents"][1]["tool"] = "abacus"
    profile = tmp_path / "abacus.json"
    profile.write_text(json.dumps(spec))
    with pytest.raises(SystemExit) as stop:
        config_lib.parse_args(["--agents", str(profile)])
    assert "names the tool 'abacus'; the tools are calculator" in str(stop.value)


class ScriptedOrchestratorWithCalculator(ScriptedBackend):
    """The boss writes the expression and calls the calculator, then calls the solver, then
    finishes; the solver copies the calculator's result from the step so far."""

    def __init__(self, tokenizer):
        self.tokenizer, self.adapters = tokenizer, []

    def generate(self, prompt_ids, adapter, sampling):
        self.adapters.append(adapter)
        texts = []
        for ids in prompt_ids:
            prompt = self.tokenizer.decode(ids).rsplit("Problem: ", 1)[1]
            if adapter == "policy_solver":
                texts.append("\\boxed{" + prompt.split("Calculator: ")[1].split(" = ")[1].split("<")[0].split()[0] + "}")
            elif "Solver: " in prompt:
                texts.append("Done. \\call{finish}")
            elif "Calculator: " in prompt:
                texts.append("Now answer. \\call{solver}")
            else:
                texts.append("\\calc{" + prompt.split("What is ")[1].split("?")[0] + "} \\call{calculator}")
        return scripted_actions(self.tokenizer, texts)


def test_an_orchestrator_calls_the_calculator_as_it_calls_an_executor(tmp_path, tiny_model_dir):
    """The calculator reads every earlier action of the step, acts when called, is counted among
    the calls (the call-rate metric), and takes no sample or position."""
    from transformers import AutoTokenizer
    from rollout import orchestration_metrics
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    profile = tmp_path / "boss.json"
    profile.write_text(json.dumps({
        "agents": [{"role": "boss", "system_prompt": "Decide who acts."},
                   {"role": "solver", "system_prompt": "Answer with \\boxed{N}.", "graded": True, "description": "answers"},
                   {"role": "calculator", "tool": "calculator", "description": "evaluates every \\calc{EXPR} exactly"}],
        "orchestrator": "boss", "max_calls": 3}))
    org, cfg = load_organisation(str(profile)), config_lib.Config(agents=str(profile))
    assert org.learners == ("boss", "solver")
    with Grader() as grader:
        rollout = play_episodes(ScriptedOrchestratorWithCalculator(tokenizer).generate, tokenizer, org,
                                [Problem("What is 964 * 59?", "56876", "", "")], grader, Sampling(1.0, 1.0, 16), cfg)
    assert rollout.calls == [[["calculator", "solver"]]] and rollout.step_ends == [["finish"]]
    assert rollout.solved == [True]
    assert [org.order[n] for n in rollout.agent_index] == ["boss", "boss", "solver", "boss"]
    assert rollout.position == [0, 1, 2, 3]
    assert orchestration_metrics(rollout, org)["charts/calls/calculator"] == 1.0


# ---------------------------------------------------------------------------------------------
# The PPO tables skip the tool: the advantages of caller → calculator → answerer, by hand
# ---------------------------------------------------------------------------------------------

def test_gae_over_caller_calculator_answerer_is_the_two_agent_chain_and_charges_each_call(tmp_path, tiny_model_dir):
    """Two episodes played for real (scripted policies): the calculator's output is in the
    answerer's observation, and the advantages are those of a two-action chain caller → answerer.

    γ_a = 1 (the trainer's), λ = .5, credit last, values V(caller) = .3 / .5, V(answerer) = .6 / .2
    (episodes 0 / 1); episode 0 is solved (R = 1), episode 1 is not (its gold answer is 660, the
    calculator says 661):
        ep0  Â_ans = 1 − .6 = .4;   δ_call = .6 − .3 = .3,   Â_call = .3 + .5·.4 = .5
        ep1  Â_ans = 0 − .2 = −.2;  δ_call = .2 − .5 = −.3,  Â_call = −.3 + .5·(−.2) = −.4
    With --tool_call_cost .1 each episode's R drops by .1 (one call each):
        ep0  Â_ans = .9 − .6 = .3,   Â_call = .3 + .5·.3 = .45
        ep1  Â_ans = −.1 − .2 = −.3, Â_call = −.3 + .5·(−.3) = −.45
    """
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    profile = tmp_path / "calc.json"
    profile.write_text(json.dumps(CALLER_CALCULATOR_ANSWERER))
    org = load_organisation(str(profile))
    problems = [Problem("What is 964 * 59?", "56876", "", ""), Problem("What is 361 + 25 * 12?", "660", "", "")]
    values = torch.tensor([0.3, 0.5, 0.6, 0.2]).unsqueeze(-1)  # samples: caller ep0, caller ep1, answerer ep0, answerer ep1
    for cost, expected in ((0.0, [0.5, -0.4, 0.4, -0.2]), (0.1, [0.45, -0.45, 0.3, -0.3])):
        cfg = config_lib.Config(agents=str(profile), credit="last", lam=0.5, tool_call_cost=cost)
        team = ScriptedCallerAndAnswerer(tokenizer)
        with Grader() as grader:
            rollout = play_episodes(team.generate, tokenizer, org, problems, grader, Sampling(1.0, 1.0, 16), cfg)
        assert "Calculator: 361 + 25 * 12 = 661" in team.answerer_prompts[1]
        assert rollout.team_reward[:, 0].tolist() == pytest.approx([1.0 - cost, 0.0 - cost])
        old = marft.OldPolicy(logprob=torch.zeros(4, 1), values=values, mask=torch.ones(4, 1), token_mask=torch.ones(4, 1))
        advantages, returns, _, _ = marft.compute_advantages(org, rollout, old, cfg)
        assert advantages[:, 0].tolist() == pytest.approx(expected)
        assert returns[:, 0].tolist() == pytest.approx([a + v for a, v in zip(expected, values[:, 0].tolist())], abs=1e-6)
        assert [u["calls"] for steps in rollout.infos for u in [steps[0]["tools"]]] == [1, 1]


def test_tool_use_counts_calls_errors_and_answers_taken_from_the_tool():
    from rollout import Rollout, tool_metrics, tool_use
    org = load_organisation("calculator_team")
    step = lambda call, result, answer: [("caller", call), ("calculator", result), ("answerer", answer)]
    steps = [step("\\calc{2*3}", "2*3 = 6", "\\boxed{6}"),  # a value, taken
             step("\\calc{2*3} \\calc{1/0}", "2*3 = 6\n1/0: error: division by zero", "\\boxed{7}"),  # an error; 6 not taken
             step("six", "error: no \\calc{...} expression to evaluate", "\\boxed{6}")]  # an error, no value
    used = [tool_use(org, s) for s in steps]
    assert used == [{"calls": 1, "errors": 0, "answer_is_tool_output": True},
                    {"calls": 1, "errors": 1, "answer_is_tool_output": False},
                    {"calls": 1, "errors": 1, "answer_is_tool_output": None}]
    rollout = Rollout(infos=[[{"tools": u}] for u in used])
    assert tool_metrics(rollout, org, "eval") == {"eval/tools/calls_per_episode": 1.0, "eval/tools/error_rate": 2 / 3,
                                                  "eval/tools/answer_is_tool_output": 0.5}
    assert tool_metrics(rollout, load_organisation("chain"), "eval") == {}  # no tool, no tool metrics


@pytest.mark.parametrize("program, action", [
    ("print(964 * 59)\nprint(sum(range(10)))", "56876\n45"),
    ("x = 1\n", "(the program printed nothing)"),
    ("print('partial')\n1 / 0", "partial\nerror: crash: ZeroDivisionError: division by zero"),
    ("print(1", "error: syntax_error: SyntaxError: '(' was never closed (program.py, line 1)"),
    ("import socket", "error: crash"),
    ("open('/etc/passwd').read()", "error: crash"),
    ("print('a' * 1500)", "a" * 1000 + "\n[output cut at 1000 characters]"),
])
def test_the_python_runner_prints_what_the_program_prints_and_errors_as_text(program, action):
    assert tools.tool_action("python", f"Let me run it.\n```python\n{program}\n```\nThat's it.").startswith(action)


def test_the_python_runner_never_hangs_and_needs_a_block():
    import time
    started = time.monotonic()
    assert tools.tool_action("python", "```python\nwhile True:\n    pass\n```").startswith("error: timeout")
    assert time.monotonic() - started < tools.PYTHON_LIMITS.seconds_per_program + 2
    assert tools.tool_action("python", "print(1)") == "error: no ```python block to run"
    assert tools.tool_value("python", "56876\n45") == "45" and tools.tool_value("python", "1\nerror: crash: X") is None
    assert tools.tool_value("calculator", "2*3 = 6\n1/0: error: division by zero") == "6"


# ---------------------------------------------------------------------------------------------
# The word task and its organisations
# ---------------------------------------------------------------------------------------------

def test_the_word_tasks_hold_out_operands_and_templates_and_take_no_data_option():
    import tasks
    cfg = config_lib.parse_args(["--task", "word"])
    assert cfg.agents == "calculator_team"
    train, held_out = tasks.task_problems(tasks.task_of(cfg), cfg)
    assert {p.level for p in train} == {"boxes", "floors", "stamps", "tickets", "stamps_packs", "stamps_given", "stamps_spelled"}
    assert {p.level for p in held_out} == {"boxes", "rows", "floors", "stamps", "tickets", "crates"}
    assert not {p.problem for p in train} & {p.problem for p in held_out}
    mixed = config_lib.parse_args(["--task", "word_mixed"])
    assert mixed.agents == "orchestrated_calculator"
    train, held_out = tasks.task_problems(tasks.task_of(mixed), mixed)
    assert [tasks.problem_kind(p.level).startswith("small") for p in held_out[:4]] == [False, True, False, True]
    with pytest.raises(SystemExit, match="reads no --data"):
        tasks.task_problems(tasks.task_of(cfg), config_lib.parse_args(["--task", "word", "--data", "code"]))


def test_word_metrics_by_kind_worked_by_hand():
    import tasks
    info = lambda level, correct, calls: {"level": level, "correct": correct, "tools": {"calls": calls}}
    infos = [info("boxes", True, 1), info("boxes", False, 1), info("crates", False, 0), info("Level 2", True, 0),
             info("Level 3", True, 1), info("stamps_given", True, 1)]
    metrics = tasks.word_metrics(infos)
    assert metrics["accuracy/boxes"] == 0.5 and metrics["accuracy/crates"] == 0.0
    assert metrics["accuracy/trained_templates"] == 0.5 and metrics["accuracy/new_templates"] == 0.0
    assert metrics["accuracy/stepping_stones"] == 1.0  # a stone is a word problem, not one of the trained templates
    assert metrics["accuracy/word"] == pytest.approx(2 / 4) and metrics["accuracy/small"] == 1.0
    assert metrics["tools/call_rate/small_products"] == 0.0 and metrics["tools/call_rate/small_sums"] == 1.0
    assert metrics["tools/call_rate/word"] == pytest.approx(3 / 4) and metrics["tools/call_rate/small"] == 0.5


def test_the_calculator_organisations():
    team, boss = load_organisation("calculator_team"), load_organisation("orchestrated_calculator")
    assert team.order == ("caller", "calculator", "answerer") and team.learners == ("caller", "answerer")
    assert team.parents("answerer") == ("caller", "calculator") and team.graded_roles == ("answerer",)
    assert boss.orchestrator == "orchestrator" and boss.executors == ("caller", "calculator", "solver")
    assert boss.learners == ("orchestrator", "caller", "solver") and boss.max_calls == 3


def test_the_word_tasks_own_defaults_yield_to_the_command_line_and_to_a_config_file(tmp_path):
    cfg = config_lib.parse_args(["--task", "word"])
    assert (cfg.temperature, cfg.max_new_tokens, cfg.eval_problems) == (0.7, 32, 48)
    assert cfg.chosen["temperature"] == "0.7: the word task's default"
    given = config_lib.parse_args(["--task", "word", "--temperature", "1.0"])
    assert given.temperature == 1.0 and "temperature" not in given.chosen
    saved = tmp_path / "config.json"
    saved.write_text(json.dumps({"task": "word", "agents": "calculator_team", "temperature": 0.9, "max_new_tokens": 32,
                                 "eval_problems": 20}))
    from_file = config_lib.parse_args(["--config", str(saved)])
    assert (from_file.temperature, from_file.eval_problems) == (0.9, 20) and from_file.chosen == {}


class ScriptedProgrammerAndAnswerer(ScriptedBackend):
    """The programmer prints the problem's expression in a ```python block; the answerer boxes the
    last line the python runner's action holds (it must be in its prompt)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, prompt_ids, adapter, sampling):
        prompts = [self.tokenizer.decode(ids) for ids in prompt_ids]
        if adapter == "policy_programmer":
            texts = ["```python\nprint(" + p.rsplit("What is ", 1)[1].split("?")[0] + ")\n```" for p in prompts]
        else:
            texts = ["\\boxed{" + p.rsplit("Python: ", 1)[1].split("<")[0].strip() + "}" for p in prompts]
        return scripted_actions(self.tokenizer, texts)


def test_the_example_python_team_runs_its_programs_in_the_sandbox(tiny_model_dir):
    """examples/python_team.json: programmer → python → answerer, the program's printed output in
    the answerer's observation (a program that divides by zero gives an error text, not a crash)."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    profile = Path(__file__).resolve().parents[1] / "examples" / "python_team.json"
    cfg = config_lib.parse_args(["--task", "word", "--agents", str(profile)])
    org = load_organisation(cfg.agents)
    assert org.learners == ("programmer", "answerer")
    problems = [Problem("What is 964 * 59?", "56876", "", ""), Problem("What is 7 // 0?", "0", "", "")]
    with Grader() as grader:
        rollout = play_episodes(ScriptedProgrammerAndAnswerer(tokenizer).generate, tokenizer, org, problems, grader,
                                Sampling(1.0, 1.0, 16), cfg)
    assert rollout.solved == [True, False]
    assert [info["tools"] for steps in rollout.infos for info in steps] == [
        {"calls": 1, "errors": 0, "answer_is_tool_output": True}, {"calls": 1, "errors": 1, "answer_is_tool_output": None}]
