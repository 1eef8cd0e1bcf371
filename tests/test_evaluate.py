"""evaluate.py: pass@k table, breakdowns, transcripts, end-to-end runs, and loading a run's checkpoint."""
import json

import pytest
import torch
from safetensors.torch import load_file

import agents
import config as config_lib
import evaluate
import generation
import run as run_lib
from envs import Problem
from flex_pomdp import load_organisation
from envs import Grader, MathEnv
from rollout import Rollout, maj_at_k, majority_vote, same_answer, solved_counts

METRIC_KEYS = ("eval/accuracy", "eval/pass@1", "eval/pass@2", "eval/maj@1", "eval/maj@2", "eval/accuracy_greedy",
               "eval/unparseable_rate", "eval/generated_tokens_per_episode", "eval/greedy/generated_tokens_per_episode")


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def test_every_option_has_help():
    options = [a for a in evaluate.build_parser()._actions if a.option_strings and a.dest != "help"]
    assert {a.dest for a in options} >= {"run", "checkpoint", "model", "agents", "data", "limit", "samples", "greedy",
                                        "transcripts", "out", "seed", "threads", "device", "generation_batch_size"}
    assert all(a.help and a.help.strip() for a in options)


@pytest.mark.parametrize("argv, message", [
    (["--samples", "0"], "--samples"),
    (["--temperature", "0"], "--temperature"),
    (["--checkpoint", "iter_000001"], "--checkpoint needs --run"),
    (["--transcripts", "-1"], "--transcripts"),
])
def test_bad_options_fail_at_start_naming_the_option(argv, message):
    with pytest.raises(SystemExit, match=message):
        evaluate.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# Pure functions, numbers computed by hand
# ---------------------------------------------------------------------------------------------

def test_pass_at_k_values_are_powers_of_two_and_k():
    assert evaluate.pass_at_k_values(1) == [1]
    assert evaluate.pass_at_k_values(3) == [1, 2, 3]
    assert evaluate.pass_at_k_values(4) == [1, 2, 4]
    assert evaluate.pass_at_k_values(6) == [1, 2, 4, 6]


def test_pass_at_k_table_on_a_hand_made_example():
    # c = 0, 1, 4 correct of 4 samples. pass@2 of c = 1: 1 − C(3,2)/C(4,2) = 1 − 3/6 = 0.5.
    table = evaluate.pass_at_k_table([0, 1, 4], 4)
    assert list(table) == ["eval/pass@1", "eval/pass@2", "eval/pass@4"]
    assert table["eval/pass@1"] == pytest.approx((0 + 0.25 + 1) / 3)
    assert table["eval/pass@2"] == pytest.approx((0 + 0.5 + 1) / 3)
    assert table["eval/pass@4"] == pytest.approx((0 + 1 + 1) / 3)


equal = lambda a, b: a == b


@pytest.mark.parametrize("answers, solved, vote", [
    (["2", "2", "3"], [True, True, False], 1.0),  # the majority is right
    (["3", "3", "2"], [False, False, True], 0.0),  # one sample right, outvoted
    (["2", "3", "3", "2"], [True, False, False, True], 0.5),  # a 2–2 tie: right half the time
    (["1", "2", "3"], [False, True, False], 1 / 3),  # a three-way tie, one group right
    ([None, None, "2"], [False, False, True], 1.0),  # unparseable samples take no part in the vote
    ([None, None], [False, False], 0.0),  # no sample answered
    (["5"], [True], 1.0),  # k = 1: the sample itself
])
def test_majority_vote_by_hand(answers, solved, vote):
    assert majority_vote(answers, solved, equal) == pytest.approx(vote)


def test_majority_vote_groups_answers_by_the_graders_equivalence():
    with Grader() as grader:
        same = same_answer(grader)
        # "1/2" and "0.5" are one answer (2 votes, right) against "1"
        assert majority_vote([("1/2",), ("1",), ("0.5",)], [True, False, True], same) == 1.0
        # compared as text, the three are a three-way tie
        assert majority_vote([("1/2",), ("1",), ("0.5",)], [True, False, True], equal) == pytest.approx(2 / 3)
        assert same(("12",), ("12.0",)) and not same(("12",), ("13",))
        assert not same(("7", "8"), ("7", "9"))  # several graded roles: every answer must agree


def voted_rollout() -> Rollout:
    """2 problems × 4 samples, episode b on problem b mod 2, its answer in its last step's info."""
    answers = ["5", "7", "5", None, "4", "7", "4", "8"]  # problem 0: 5 5 4 4; problem 1: 7 — 7 8
    solved = [a in ("5", "7") for a in answers]
    return Rollout(solved=solved, infos=[[{"answers": {"solver": a}}] for a in answers])


@pytest.mark.parametrize("k, expected", [
    (1, (2 / 4 + 2 / 4) / 2),  # each sample alone: pass@1
    (2, ((1 + 0) / 2 + (1 + 0.5) / 2) / 2),  # blocks (5 5)(4 4) and (7 —)(7 8): the last a tie
    (3, (1 + 1) / 2),  # one block, the first 3: (5 5 4) and (7 — 7)
    (4, (0.5 + 1) / 2),  # 5 5 4 4: a tie; 7 — 7 8: 7 wins
])
def test_maj_at_k_averages_disjoint_blocks_of_each_problems_samples(k, expected):
    assert maj_at_k(voted_rollout(), 2, k, equal) == pytest.approx(expected)


def test_maj_at_k_larger_than_the_samples_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match=r"maj@5 needs 1 ≤ k ≤ the 4 samples per problem"):
        maj_at_k(voted_rollout(), 2, 5, equal)


def test_maj_table_needs_answers_from_the_environment():
    table = evaluate.maj_at_k_table(voted_rollout(), 2, 4, equal)
    assert list(table) == ["eval/maj@1", "eval/maj@2", "eval/maj@4"]
    code_like = Rollout(solved=[True, False], infos=[[{"program_outcomes": {}}], [{}]])
    assert evaluate.maj_at_k_table(code_like, 1, 2, equal) == {}


def test_the_math_environment_reports_what_it_graded_for_the_vote():
    with Grader() as grader:
        env = MathEnv(Problem("What is 2 + 3?", "5", "", ""), grader, graded_roles=("a", "b", "c"))
        env.reset()
        _, _, _, info = env.step({"a": "so \\boxed{5}", "b": "\\boxed{6} or \\boxed{ 4 }", "c": "no answer"})
    assert info["outcomes"] == {"a": "correct", "b": "wrong", "c": "unparseable"}
    assert info["answers"] == {"a": "5", "b": " 4 ", "c": None}  # the last \boxed{}, as the grader read it


def test_breakdown_groups_by_level_and_subject_with_hand_checked_numbers():
    problems = [Problem("p0", "1", "Level 1", "Algebra"), Problem("p1", "2", "Level 2", "Algebra"),
                Problem("p2", "3", "Level 1", "Geometry"), Problem("p3", "4", "", "")]
    counts = [2, 1, 0, 2]  # of 2 samples
    greedy = [True, False, False, True]
    unparseable = [(0, 2), (1, 2), (2, 2), (0, 4)]  # (unparseable, graded) per problem
    by_level = evaluate.breakdown(problems, "level", counts, 2, greedy, unparseable)
    assert list(by_level) == ["(none)", "Level 1", "Level 2"]
    assert by_level["Level 1"] == {"problems": 2, "pass@1": pytest.approx((1.0 + 0.0) / 2), "accuracy_greedy": 0.5,
                                   "unparseable_rate": pytest.approx(2 / 4)}
    assert by_level["Level 2"] == {"problems": 1, "pass@1": 0.5, "accuracy_greedy": 0.0, "unparseable_rate": 0.5}
    assert by_level["(none)"] == {"problems": 1, "pass@1": 1.0, "accuracy_greedy": 1.0, "unparseable_rate": 0.0}
    by_subject = evaluate.breakdown(problems, "type", counts, 2, None, unparseable)
    assert list(by_subject) == ["(none)", "Algebra", "Geometry"]
    assert by_subject["Algebra"] == {"problems": 2, "pass@1": pytest.approx((1.0 + 0.5) / 2), "accuracy_greedy": None,
                                     "unparseable_rate": pytest.approx(1 / 4)}
    assert by_subject["Geometry"]["pass@1"] == 0.0 and by_subject["Geometry"]["unparseable_rate"] == 1.0


def hand_made_rollout() -> Rollout:
    """Two problems, 2 samples (episodes 0..3, episode b on problem b mod 2), chain planner → solver,
    horizon 2: episode 0 takes two steps, the others one."""
    r = Rollout(team_reward=torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]]),
                solved=[True, False, True, False],
                outcomes=[[{"solver": "unparseable"}, {"solver": "correct"}], [{"solver": "wrong"}],
                          [{"solver": "correct"}], [{"solver": "unparseable"}]])
    for b, t in ((0, 0), (1, 0), (2, 0), (3, 0), (0, 1)):
        for n, role in enumerate(("planner", "solver")):
            r.texts.append(f"{role} e{b} t{t}")
            r.episode.append(b)
            r.step.append(t)
            r.agent_index.append(n)
            r.position.append(n)
    return r


def test_unparseable_tallies_and_solved_episodes_per_problem():
    # problem 0: episodes 0 (unparseable, then correct) and 2 (correct); problem 1: 1 (wrong), 3 (unparseable)
    assert evaluate.unparseable_tallies(hand_made_rollout(), 2) == [(1, 3), (1, 2)]
    assert solved_counts(hand_made_rollout(), 2) == [2, 0]


def test_transcripts_list_every_agent_in_sigma_order_with_outcomes_and_reward():
    org = load_organisation("chain")
    problems = [Problem("What is 1 + 1?", "2", "Level 1", "Arithmetic"), Problem("What is 2 * 3?", "6", "", "")]
    (first, second) = evaluate.transcripts(hand_made_rollout(), problems, org, 2)
    assert first["problem"] == "What is 1 + 1?" and first["answer"] == "2" and first["solved"] is True
    assert [s["step"] for s in first["steps"]] == [0, 1]
    assert first["steps"][1] == {"step": 1, "actions": [{"role": "planner", "text": "planner e0 t1"},
                                                         {"role": "solver", "text": "solver e0 t1"}],
                                 "outcomes": {"solver": "correct"}, "reward": 1.0}
    assert second["problem"] == "What is 2 * 3?" and len(second["steps"]) == 1
    assert second["steps"][0]["outcomes"] == {"solver": "wrong"} and second["steps"][0]["reward"] == 0.0
    assert "planner: planner e0 t0" in evaluate.format_transcript(first)


def test_dataset_stem():
    assert evaluate.dataset_stem("../shared/data/math_test.jsonl") == "math_test"
    assert evaluate.dataset_stem("arithmetic") == "arithmetic"
    assert evaluate.dataset_stem("arithmetic:1,2,3") == "arithmetic-1-2-3"
    assert evaluate.dataset_stem("openai/gsm8k:main") == "openai-gsm8k-main"


# ---------------------------------------------------------------------------------------------
# End to end with the tiny random model (its answers are garbage: accuracy ≈ 0)
# ---------------------------------------------------------------------------------------------

MATH_ROWS = [
    {"problem": "What is $1+1$?", "solution": "It is $\\boxed{2}$.", "level": "Level 1", "type": "Algebra"},
    {"problem": "What is $\\frac{1}{2}+\\frac{1}{2}$?", "solution": "$\\boxed{1}$", "level": "Level 2", "type": "Prealgebra"},
    {"problem": "How many sides has a square?", "solution": "A square has $\\boxed{4}$ sides.", "level": "Level 1",
     "type": "Geometry"},
]


@pytest.fixture
def math_file(tmp_path):
    path = tmp_path / "mini_math.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in MATH_ROWS))
    return path


@pytest.mark.parametrize("organisation", ["chain", "single", "chain3"])
def test_end_to_end_on_a_math_file(tiny_model_dir, math_file, tmp_path, organisation, capsys):
    out = tmp_path / f"eval-{organisation}.json"
    report = evaluate.main(["--model", str(tiny_model_dir), "--agents", organisation, "--data", str(math_file),
                            "--samples", "2", "--max_new_tokens", "4", "--transcripts", "2", "--threads", "1",
                            "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved == json.loads(json.dumps(report))
    assert all(key in saved["metrics"] for key in METRIC_KEYS)
    assert saved["metrics"]["eval/pass@1"] == pytest.approx(saved["metrics"]["eval/accuracy"])
    # one graded answer per episode: a vote of one is the sample itself
    assert saved["metrics"]["eval/maj@1"] == pytest.approx(saved["metrics"]["eval/accuracy"])
    assert 0 < saved["metrics"]["eval/generated_tokens_per_episode"] <= 4 * len(load_organisation(organisation).order)
    assert set(saved["by_subject"]) == {"Algebra", "Prealgebra", "Geometry"}
    assert set(saved["by_level"]) == {"Level 1", "Level 2"}
    assert sum(g["problems"] for g in saved["by_subject"].values()) == 3
    roles = list(load_organisation(organisation).order)
    assert saved["evaluated"]["roles"] == roles and saved["evaluated"]["problems"] == 3
    assert len(saved["transcripts"]) == 2
    for transcript in saved["transcripts"]:
        for step in transcript["steps"]:
            assert [a["role"] for a in step["actions"]] == roles
            assert set(step["outcomes"]) == set(load_organisation(organisation).graded_roles)
    printed = capsys.readouterr().out
    assert "subject: Geometry" in printed and "gold answer: 2" in printed


def test_default_output_name_and_limit(tiny_model_dir, math_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = evaluate.main(["--model", str(tiny_model_dir), "--agents", "single", "--data", str(math_file),
                            "--limit", "1", "--samples", "1", "--no-greedy", "--max_new_tokens", "2", "--threads", "1"])
    assert (tmp_path / "eval-base-mini_math.json").is_file()
    assert report["evaluated"]["problems"] == 1 and "eval/accuracy_greedy" not in report["metrics"]
    assert report["by_subject"]["Algebra"]["accuracy_greedy"] is None


def test_shuffle_picks_a_seeded_subset(tiny_model_dir, math_file, tmp_path):
    def picked(seed):
        report = evaluate.main(["--model", str(tiny_model_dir), "--agents", "single", "--data", str(math_file),
                                "--shuffle", "--seed", str(seed), "--limit", "2", "--samples", "1", "--no-greedy",
                                "--max_new_tokens", "1", "--transcripts", "2", "--threads", "1",
                                "--out", str(tmp_path / "shuffled.json")])
        return [t["problem"] for t in report["transcripts"]]

    first = picked(5)
    assert len(first) == 2 and first == picked(5)
    assert {p for s in range(5, 10) for p in picked(s)} == {row["problem"] for row in MATH_ROWS}


# ---------------------------------------------------------------------------------------------
# A run folder: config.json + checkpoints/iter_XXXXXX/adapters/<adapter>/
# ---------------------------------------------------------------------------------------------

def fake_run(tiny_model_dir, root):
    """A run folder as marft.py writes it, whose solver adapter has random lora_B weights."""
    run = root / "run"
    config = dict(model=str(tiny_model_dir), agents="chain", shared_adapter=False, lora_rank=4,
                  horizon=1, max_new_tokens=3, max_prompt_tokens=512,
                  temperature=1.0, top_p=1.0, arithmetic_levels="1", seed=3, lr=1e-4)  # + a key evaluate.py ignores
    run.mkdir()
    (run / "config.json").write_text(json.dumps(config))
    base, _ = agents.load_base_model(str(tiny_model_dir))
    torch.manual_seed(123)
    adapters = ["policy_planner", "policy_solver", "critic"]
    model = agents.attach_adapters(base, adapters, agents.lora_config(4, config_lib.LORA_ALPHA, config_lib.LORA_TARGETS.split(",")))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name and ".policy_solver." in name:
                param.copy_(torch.randn_like(param))
    folder = run / "checkpoints" / "iter_000002"
    model.save_pretrained(folder / "adapters", selected_adapters=adapters)
    (run / "checkpoints" / "latest").write_text("iter_000002")
    return run, folder


def test_build_policies_loads_the_checkpoint_weights(tiny_model_dir, tmp_path):
    run, folder = fake_run(tiny_model_dir, tmp_path)
    cfg = config_lib.read_config(run, "--run")
    org = load_organisation(cfg.agents)
    assert run_lib.checkpoint_folder(run, None, "--run") == folder
    model, _ = evaluate.build_policies(cfg, org, folder)
    assert set(model.peft_config) == {"policy_planner", "policy_solver"}  # policies only, no critic
    saved = load_file(folder / "adapters" / "policy_solver" / "adapter_model.safetensors")
    loaded = dict(model.named_parameters())
    checked = 0
    for key, tensor in saved.items():  # e.g. ...q_proj.lora_B.weight → ...q_proj.lora_B.policy_solver.weight
        name = key.replace(".lora_A.weight", ".lora_A.policy_solver.weight").replace(".lora_B.weight", ".lora_B.policy_solver.weight")
        assert torch.equal(loaded[name].detach().cpu(), tensor), name
        checked += "lora_B" in key
    assert checked == 2 * 7 and all(saved[k].abs().sum() > 0 for k in saved if "lora_B" in k)  # 2 layers × 7 projections
    # the base model: every fresh adapter's lora_B is 0
    base_model, _ = evaluate.build_policies(cfg, org, None)
    assert all(p.abs().sum() == 0 for n, p in base_model.named_parameters() if "lora_B" in n)


def test_evaluating_a_run_writes_into_the_run_folder(tiny_model_dir, tmp_path):
    run, _ = fake_run(tiny_model_dir, tmp_path)
    report = evaluate.main(["--run", str(run), "--limit", "2", "--samples", "1", "--transcripts", "1", "--threads", "1"])
    assert (run / "eval-iter_000002-arithmetic.json").is_file()
    what = report["evaluated"]
    assert what["checkpoint"] == "iter_000002" and what["seed"] == 3 and what["max_new_tokens"] == 3
    assert what["dataset"] == "arithmetic:1" and set(report["by_level"]) == {"Level 1"}


def test_run_errors_name_the_fix(tiny_model_dir, tmp_path):
    run, _ = fake_run(tiny_model_dir, tmp_path)
    with pytest.raises(SystemExit, match="iter_000002"):
        evaluate.main(["--run", str(run), "--checkpoint", "iter_000009"])
    with pytest.raises(SystemExit, match="--model/--agents cannot be combined with --run"):
        evaluate.main(["--run", str(run), "--model", str(tiny_model_dir)])
    with pytest.raises(SystemExit, match="config.json"):
        evaluate.main(["--run", str(tmp_path)])
    (run / "checkpoints" / "latest").unlink()
    with pytest.raises(SystemExit, match="latest is missing.*iter_000002"):
        evaluate.main(["--run", str(run)])
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps(dict(config, agents="chain3")))  # a verifier the checkpoint lacks
    with pytest.raises(SystemExit, match="no adapter 'policy_verifier'"):
        evaluate.main(["--run", str(run), "--checkpoint", "iter_000002"])


def test_greedy_only_evaluations_skip_the_sampled_episodes():
    """Training's evaluations between the first and the last decode greedily only: no sampled
    episode is generated and only eval/accuracy_greedy is reported; a full evaluation samples
    eval_samples episodes per problem, then decodes greedily."""
    from transformers import AutoTokenizer

    from envs import Grader
    from rollout import heldout_metrics

    tokenizer = AutoTokenizer.from_pretrained(agents.embedded_tokenizer_folder())
    calls = []  # (prompts, temperature) of each generate call

    def scripted(prompt_ids, adapter, sampling):  # greedy answers right (5), samples wrong (4)
        calls.append((len(prompt_ids), sampling.temperature))
        text = "\\boxed{5}" if sampling.temperature == 0 else "\\boxed{4}"
        ids = tokenizer(text, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        return generation.Actions([ids] * len(prompt_ids), [[0.0] * len(ids)] * len(prompt_ids))

    problems = [Problem("What is 2 + 3?", "5", "", ""), Problem("What is 1 + 4?", "5", "", "")]
    cfg = config_lib.Config(agents="single", eval_samples=3)
    with Grader() as grader:
        metrics, sampled, greedy = heldout_metrics(scripted, tokenizer, load_organisation("single"), problems, grader,
                                                   cfg, greedy_only=True)
        assert calls == [(2, 0.0)] and sampled is None and greedy is not None
        answer_tokens = len(tokenizer("\\boxed{5}", add_special_tokens=False).input_ids) + 1  # and the end of text
        assert metrics == {"eval/accuracy_greedy": 1.0, "eval/greedy/generated_tokens_per_episode": answer_tokens}
        calls.clear()
        metrics, sampled, greedy = heldout_metrics(scripted, tokenizer, load_organisation("single"), problems, grader, cfg)
    assert calls == [(6, 1.0), (2, 0.0)]  # 2 problems × 3 samples, then one greedy episode each
    assert metrics["eval/accuracy"] == 0.0 and metrics["eval/pass@3"] == 0.0 and metrics["eval/accuracy_greedy"] == 1.0
    assert metrics["eval/maj@3"] == 0.0  # three samples agree on 4: the vote is wrong
