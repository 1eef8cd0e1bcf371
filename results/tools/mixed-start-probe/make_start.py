"""The mixed task's orchestrator at its start, with the word team's trained caller: a run folder
holding the base model's adapters with policy_caller loaded from runs/word-team-stones (what
`marft.py --init_from runs/word-team-stones` starts from), for evaluate.py to sample.

    python results/tools/mixed-start-probe/make_start.py /tmp/runs/mixed-init0
    python evaluate.py --run /tmp/runs/mixed-init0 --limit 16 --samples 2 --no-greedy --temperature 0.3 \
        --transcripts 32 --out eval-T0.3.json        # and --temperature 0.7
"""
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import agents  # noqa: E402
import marft  # noqa: E402
import run  # noqa: E402

folder = Path(sys.argv[1])
cfg = run.parse_args(["--task", "word_mixed", "--tool_call_cost", "0.1", "--init_from", "runs/word-team-stones",
                      "--output_dir", str(folder.parent), "--run_name", folder.name])
org, model, _, value_heads, optimisers = marft.build(cfg)
print(run.init_policy_adapters(cfg.init_from, model, agents.policy_adapter_names(org.learners, cfg.shared_adapter)))
folder.mkdir(parents=True, exist_ok=True)
(folder / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
run.save_checkpoint(folder, 0, model, value_heads, optimisers, 0.0, keep=1)
