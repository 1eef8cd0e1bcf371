"""The first iteration of the mixed task's group run, printed: each episode's calls, how its step
ended, its team reward, and each action's group advantage (one iteration's batch: 4 problems x 4
episodes; seed 1). Run from the repository root of a clone, beside runs/word-team-stones:
python results/tools/mixed-group-probe/probe.py [more marft.py options]."""
import contextlib
import sys
sys.path.insert(0, ".")  # run from the repository root
import marft, run as run_lib
from envs.grader import Grader
from rollout import run_episodes
extra = sys.argv[1:]
cfg = run_lib.parse_args(["--task", "word_mixed", "--tool_call_cost", "0.1", "--init_from", "runs/word-team-stones",
    "--temperature", "0.3", "--advantage", "group", "--group_size", "4", "--batch_size", "4", "--iterations", "1",
    "--eval_problems", "1", "--output_dir", "/tmp/mixed-group-probe", "--run_name", "d", *extra])
job = marft.set_up(cfg)
org = job.org
with Grader() as grader, contextlib.closing(job.backend):
    batch = marft.iteration_batch(job.train_problems, cfg.batch_size, cfg.seed, 0)
    episodes = [p for p in batch for _ in range(cfg.group_size)]
    marft.seed_iteration(cfg.seed, 0)
    r = run_episodes(job.backend.generate, job.tokenizer, org, episodes, grader, job.sampling, cfg)
    old = marft.old_policy_and_values(job.model, job.value_heads, job.tokenizer.pad_token_id, org, r, cfg)
    adv, _, stats = marft.compute_advantages(org, r, old, cfg)
    print(stats, "credit", cfg.credit)
    for b in range(len(episodes)):
        print(f"ep {b} {episodes[b].level:18s} calls={r.calls[b]} end={r.step_ends[b]} R={r.team_reward[b,0].item():.2f}")
        for s in range(len(r.texts)):
            if r.episode[s] == b:
                a = adv[s][old.mask[s] > 0]
                print(f"    {org.order[r.agent_index[s]]:12s} A={a.mean().item():+.3f} {r.texts[s][:70]!r}")
