"""The learning claim of the main job, checked on a real run of the embedded model.

A shortened default: the default organisation (planner → solver), task (levels 2 and 3), estimator
(critic + GAE), learning rates and 16 problems per iteration, for 2 iterations instead of 10, on
the first 12 held-out problems (six of each level), evaluated greedily only (`--eval_samples 0`:
the sampled pass@1 is not asserted here). The held-out greedy accuracy must rise by at least 3 of the
12 problems, as in the README's default run (measured
here: 4 → 9 of 12 on one thread, as on two; one thread because the suite runs two test files at
once on 2 cores)."""
import pytest

import config
import marft


@pytest.mark.slow
def test_a_shortened_default_run_raises_the_held_out_greedy_accuracy(tmp_path):
    cfg = config.parse_args(["--iterations", "2", "--batch_size", "16", "--eval_problems", "12", "--eval_samples", "0",
                          "--output_dir", str(tmp_path), "--run_name", "short", "--threads", "1"])
    defaults = config.Config()
    assert (cfg.agents, cfg.arithmetic_levels, cfg.advantage, cfg.lr) == (defaults.agents, defaults.arithmetic_levels,
                                                                          defaults.advantage, defaults.lr)
    summary = marft.train(cfg)
    first, last = summary["initial"], summary["final"]
    assert last["eval/accuracy_greedy"] >= first["eval/accuracy_greedy"] + 0.25, summary

