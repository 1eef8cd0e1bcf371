"""tools.py: the calculator, a fixed policy. Values worked by hand; every input a policy could
write that is not arithmetic, or is arithmetic too large, is an error text, never an exception."""
from fractions import Fraction

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
    org, cfg = load_organisation(str(profile)), run_lib.Config(agents=str(profile))
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
    cfg = run_lib.parse_args(["--model", str(tiny_model_dir), "--agents", str(profile), "--lora_rank", "2", "--batch_size", "2",
                              "--max_new_tokens", "4", "--eval_problems", "2", "--eval_samples", "1", "--iterations", "1",
                              "--threads", "1", "--output_dir", str(tmp_path), "--run_name", "tool"])
    org, model, _, heads, optimisers = marft.build(cfg)
    assert set(optimisers) == {"policy_caller", "policy_answerer", "critic"}
    assert not any(".policy_calculator." in name for name, _ in model.named_parameters())
    summary = marft.train(cfg)
    row = json.loads((tmp_path / "tool" / "metrics.jsonl").read_text().splitlines()[1])
    assert summary["final_iteration"] == 1 and "charts/value_mean/calculator" not in row
    assert {"losses/policy_loss/caller", "losses/policy_loss/answerer"} <= set(row)
    assert not any(key.endswith("/calculator") for key in row)


@pytest.mark.parametrize("change, words", [
    (lambda spec: spec["agents"][1].update(graded=True), "takes only 'role', 'tool' and 'description'"),
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
        run_lib.parse_args(["--agents", str(profile)])
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
    org, cfg = load_organisation(str(profile)), run_lib.Config(agents=str(profile))
    assert org.learners == ("boss", "solver")
    with Grader() as grader:
        rollout = play_episodes(ScriptedOrchestratorWithCalculator(tokenizer).generate, tokenizer, org,
                                [Problem("What is 964 * 59?", "56876", "", "")], grader, Sampling(1.0, 1.0, 16), cfg)
    assert rollout.calls == [[["calculator", "solver"]]] and rollout.step_ends == [["finish"]]
    assert rollout.solved == [True]
    assert [org.order[n] for n in rollout.agent_index] == ["boss", "boss", "solver", "boss"]
    assert rollout.position == [0, 1, 2, 3]
    assert orchestration_metrics(rollout, org)["charts/calls/calculator"] == 1.0
