"""marft.train under torchrun with the scripted backend (tests/scripted.py), for tests/test_distributed.py:

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/distributed_worker.py <marft.py options>

(MARFT_TEST_BACKEND=real keeps the backend that --backend names: one vLLM engine per rank;
MARFT_TEST_VARIED_REWARDS=1 adds conftest.varied_step's reward to the math environment's.)

After the run the ranks compare their trainable weights (every adapter, the critic, the value
heads) bit for bit; the process exits with status 3 when any rank's differ from rank 0's."""
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import config  # noqa: E402
import distributed  # noqa: E402
import generation  # noqa: E402
import marft  # noqa: E402
import run  # noqa: E402
from scripted import ScriptedTeam  # noqa: E402

if os.environ.get("MARFT_TEST_VARIED_REWARDS") == "1":
    from conftest import varied_step
    from envs import MathEnv
    MathEnv.step = varied_step(MathEnv.step)
if os.environ.get("MARFT_TEST_BACKEND") != "real":
    generation.make_backend = lambda cfg, model, tokenizer, *args, **kwargs: ScriptedTeam(tokenizer)
built = {}
build = run.build
run.build = lambda cfg: built.setdefault("parts", build(cfg))  # keep the model and the value heads to compare
close = distributed.close
distributed.close = lambda: None  # the comparison below still needs the process group

marft.train(config.parse_args(sys.argv[1:]))
_, model, _, value_heads, _ = built["parts"]
weights = torch.cat([p.detach().reshape(-1).double() for module in (model, value_heads)
                     for p in module.parameters() if p.requires_grad])
every_rank = distributed.all_gather_objects(weights)
same = all(torch.equal(every_rank[0], other) for other in every_rank[1:])
close()
if not same:
    print(f"rank weights differ: max |Δ| {max((every_rank[0] - w).abs().max().item() for w in every_rank[1:])}", flush=True)
    sys.exit(3)
