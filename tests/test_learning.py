"""The learning claim of the main job, checked on a real run of the embedded model.

A shortened default: the default organisation (planner → solver), task (levels 2 and 3), estimator
(critic + GAE), learning rates and 16 problems per iteration, for 2 iterations instead of 12, on
the first 12 held-out problems (six of each level) with one sample each. The held-out greedy
accuracy must rise by at least 3 of the 12 problems, as in the README's default run (measured
here: 4 → 9 of 12 in 4 minutes on 2 cores)."""
import pytest

import marft
import run


@pytest.mark.slow
def test_a_shortened_default_run_raises_the_held_out_greedy_accuracy(tmp_path):
    cfg = run.parse_args(["--iterations", "2", "--batch_size", "16", "--eval_problems", "12", "--eval_samples", "1",
                          "--output_dir", str(tmp_path), "--run_name", "short", "--threads", "2"])
    defaults = run.Config()
    assert (cfg.agents, cfg.arithmetic_levels, cfg.advantage, cfg.lr) == (defaults.agents, defaults.arithmetic_levels,
                                                                          defaults.advantage, defaults.lr)
    summary = marft.train(cfg)
    first, last = summary["initial"], summary["final"]
    assert last["eval/accuracy_greedy"] >= first["eval/accuracy_greedy"] + 0.25, summary


# The orchestrator must learn whom to call: alice answers (graded solver), bob cannot (not graded,
# so a step in which bob was called has no answer and reward 0). Both are described alike and the
# orchestrator's two worked examples call each once, so only the reward tells them apart.
WHOM_TO_CALL = {
    "agents": [
        {"role": "orchestrator", "system_prompt": "You lead a team. Choose the member who should answer the problem.",
         "examples": [{"user": "Problem: What is 4 + 1?", "assistant": "\\call{alice}"},
                      {"user": "Problem: What is 2 + 3?", "assistant": "\\call{bob}"}]},
        {"role": "bob", "system_prompt": "Repeat the problem in your own words. Do not solve it.",
         "description": "a member of the team"},
        {"role": "alice", "system_prompt": "You are a math solver. Compute the result and end with the final answer as \\boxed{N}.",
         "graded": True, "description": "a member of the team",
         "examples": [{"user": "Problem: What is 2 + 3?\n\nOrchestrator: \\call{alice}",
                       "assistant": "2 + 3 = 5. The answer is \\boxed{5}."}]},
    ],
    "orchestrator": "orchestrator",
    "max_calls": 1,
}


@pytest.mark.slow
def test_the_orchestrator_learns_whom_to_call(tmp_path):
    import json
    profile = tmp_path / "whom_to_call.json"
    profile.write_text(json.dumps(WHOM_TO_CALL))
    cfg = run.parse_args(["--agents", str(profile), "--arithmetic_levels", "1", "--advantage", "group", "--group_size", "4",
                          "--batch_size", "4", "--credit", "shared", "--iterations", "4", "--eval_problems", "12",
                          "--eval_samples", "1", "--max_new_tokens", "24", "--lr", "5e-4",
                          "--output_dir", str(tmp_path), "--run_name", "whom", "--threads", "2"])
    summary = marft.train(cfg)
    first, last = summary["initial"], summary["final"]
    assert last["eval/calls/alice"] >= first["eval/calls/alice"] + 0.25, summary
