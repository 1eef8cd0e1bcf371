"""A MARFT run as a process and on disk: its set-up, the plumbing around each iteration (seed,
problems, phase timer, metrics, checkpoint), its folder and its checkpoints; no equation of the
paper (marft.train holds them).

    runs/<name>/config.json, metrics.jsonl (+ tensorboard/), summary.json     `Run`, `MetricsLog`
    checkpoints/iter_<k>/adapters/<adapter>/   peft format: every policy and critic adapter
    checkpoints/iter_<k>/value_heads.pt        the critic's Linear(H, 1) heads (none with --advantage group)
    checkpoints/iter_<k>/optimizers.pt         every Adam state, by adapter name
    checkpoints/iter_<k>/state.json            {"iteration": k, "elapsed_seconds": …}
    checkpoints/latest                         the name of the newest complete checkpoint, replaced atomically

Resuming needs no random-generator state: iteration k is seeded from (seed, k) (`seed_iteration`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import agents as agents_lib
import critic as critic_lib
import distributed
import generation
import ppo
import speed
import tasks
from config import Config
from envs import Problem, sandbox
from flex_pomdp import Organisation
from rollout import Rollout, check_environment, orchestration_metrics, task_metrics, tool_metrics


# ---- Setting up a run ------------------------------------------------------------------------

@dataclass
class Job:
    """What the loop of `train` works with, made once by `set_up`."""
    device: str  # this rank's torch device
    run: Run  # the run folder: config, metrics log, checkpoints
    train_problems: list[Problem]
    held_out: list[Problem]
    org: Organisation  # agents N, dependency function D, order σ
    model: object  # PeftModel: the base model with every policy and critic adapter
    tokenizer: object
    value_heads: torch.nn.ModuleDict
    optimisers: dict  # one Adam per adapter (a critic's also owns its value head)
    backend: object  # the generator: generation.HFGenerator or generation.VLLMGenerator
    sampling: generation.Sampling
    start: int  # the first iteration to run: 0, or a resumed run's checkpoint


def set_up(cfg: Config) -> Job:
    """This rank's device, the task's problems, the run folder, the model with its adapters, critic and
    optimisers (with --resume from the last checkpoint), the generation backend. A trial step with empty
    actions (rollout.check_environment) first stops an environment that raises, with nothing written."""
    device = set_up_process(cfg)
    train_problems, held_out = load_task(cfg)
    check_environment(cfg, tasks.organisation_of(cfg), {"training": (0, train_problems[0]), "held-out": (0, held_out[0])})
    run = Run(cfg)
    org, model, tokenizer, value_heads, optimisers = build(cfg)
    if cfg.model.startswith(agents_lib.RANDOM_MODEL):
        own = " The vLLM engine draws random weights of its own: rollout/logprob_abs_diff is large by design."
        print_main(f"[model] {cfg.model}: RANDOM weights on {device}. The accuracies of this run mean nothing; its "
                   f"seconds and bytes do.{own if cfg.backend == 'vllm' else ''}", flush=True)
    policy_adapters = agents_lib.policy_adapter_names(org.learners, cfg.shared_adapter)
    start = run.restore(model, value_heads, optimisers)
    if cfg.init_from and start == 0:  # a resumed run's checkpoint already holds what --init_from gave it
        loaded = init_policy_adapters(cfg.init_from, model, policy_adapters)
        print_main(f"[init_from] {', '.join(loaded)} from {cfg.init_from}; every other adapter starts as the base", flush=True)
    backend = generation.make_backend(cfg, model, tokenizer, policy_adapters,
                                      fallback_sync_dir=run.dir / "vllm_adapters", external_launcher=distributed.world_size() > 1)
    return Job(device, run, train_problems, held_out, org, model, tokenizer, value_heads, optimisers, backend,
               generation.Sampling.of(cfg), start)


def set_up_process(cfg: Config) -> str:
    """This rank's device (current before anything touches CUDA), its torch threads, the allocator."""
    device = distributed.init(cfg.device)
    torch.set_num_threads(distributed.local_threads(cfg.threads))
    print_main(threads_line(torch.get_num_threads()), flush=True)
    speed.return_freed_memory()
    return device


def threads_line(threads: int) -> str:
    """The start line on threads: torch's count and how OpenMP's idle threads wait (scripts/setup_env.sh)."""
    if os.environ.get("OMP_WAIT_POLICY"):
        wait = f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}"
    elif os.environ.get("GOMP_SPINCOUNT"):
        shared = os.environ.get("MARFT_SHARED_CPU")
        wait = (f"spin {os.environ['GOMP_SPINCOUNT']} rounds, then sleep"
                + (f" (other processes kept {shared} cores busy at start)" if shared else ""))
    else:
        wait = "spin 300,000 rounds, then sleep (libgomp's default; on a busy machine set GOMP_SPINCOUNT=3000)"
    return f"[threads] {threads} torch threads; OpenMP's idle threads {wait}"


def build(cfg: Config):
    """Organisation, base model with every policy and critic adapter, value heads, optimisers (none for a critic
    with --advantage group)."""
    org = tasks.organisation_of(cfg)
    policy_adapters = agents_lib.policy_adapter_names(org.learners, cfg.shared_adapter)
    critic_adapters = [critic_lib.SHARED_CRITIC] if cfg.advantage == "gae" else []
    model, tokenizer = agents_lib.build_model(cfg, policy_adapters + critic_adapters)
    value_heads = critic_lib.make_value_heads(model.get_base_model().config.hidden_size, critic_adapters).to(model.device)
    # Adam with torch's default β = (0.9, 0.999)
    optimisers = {a: torch.optim.Adam(agents_lib.adapter_parameters(model, a), lr=cfg.lr) for a in policy_adapters}
    optimisers.update({a: torch.optim.Adam(critic_lib.critic_parameters(model, value_heads, a), lr=cfg.critic_lr)
                       for a in critic_adapters})
    return org, model, tokenizer, value_heads, optimisers


def random_config_error(path: str) -> str | None:
    """Why `path` cannot be a random model's config (None when it can)."""
    if not Path(path).is_file():
        return f"no such file {path!r}"
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"{path!r} is not JSON ({error})"
    if not isinstance(config, dict) or "model_type" not in config:
        return f"{path!r} has no model_type: it is not a transformers model config"
    return None


MODEL_CHOICES = ('give "smollm2" (the embedded SmolLM2-135M-Instruct), a local HF folder holding config.json, a hub id '
                 '(owner/name) or random:<config.json>')


def model_error(name: str) -> str | None:
    """Why --model `name` cannot be loaded, with the fix (None when it can), reading no weights: a local
    path must be a folder holding config.json; a hub id's config.json must be in the HF cache or on the hub."""
    if name == agents_lib.EMBEDDED_MODEL or name.startswith(agents_lib.RANDOM_MODEL):
        return None
    import huggingface_hub
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, HFValidationError, RepositoryNotFoundError
    try:
        huggingface_hub.utils.validate_repo_id(name)
        hub_id = not (Path(name).is_absolute() or name.startswith(("./", "../", "~")) or Path(name).exists())
    except HFValidationError:
        hub_id = False
    if not hub_id:
        path = Path(name)
        why = ("no such folder" if not path.exists() else "a file, not a model folder" if not path.is_dir()
               else "the folder holds no config.json: not a transformers model" if not (path / "config.json").is_file() else None)
        return why and f"{why}; {MODEL_CHOICES}"
    if isinstance(huggingface_hub.try_to_load_from_cache(name, "config.json"), str):
        return None
    cache, hub = huggingface_hub.constants.HF_HUB_CACHE, huggingface_hub.constants.ENDPOINT
    absent = f"neither a local folder nor a hub id in the local Hugging Face cache ({cache})"
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return f"{absent} and HF_HUB_OFFLINE is set: download it once online (hf download {name}), or {MODEL_CHOICES}"
    try:
        huggingface_hub.get_hf_file_metadata(huggingface_hub.hf_hub_url(name, "config.json"), timeout=5)
    except GatedRepoError:
        return f"a gated model on the hub: accept its terms on {hub}/{name} and log in (hf auth login)"
    except RepositoryNotFoundError:
        return f"{absent}, and {hub} has no such model (a private one needs hf auth login); {MODEL_CHOICES}"
    except EntryNotFoundError:
        return f"{hub}/{name} has no config.json: not a transformers model; {MODEL_CHOICES}"
    except Exception as error:  # no network, no name service, a proxy: the hub cannot be asked
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        return f"{absent}, and {hub} cannot be reached ({reason}): download it where it can (hf download {name}), or {MODEL_CHOICES}"
    return None


# ---- Around each iteration: its seed, its problems, its timer, its metrics, its checkpoint ----

def seed_iteration(seed: int, iteration: int) -> torch.Generator:
    """Re-seed every generator from (seed, iteration): resumed runs replay the same randomness."""
    stream = seed * 1_000_003 + iteration
    random.seed(stream)
    torch.manual_seed(stream)
    return torch.Generator().manual_seed(stream)


def load_task(cfg: Config) -> tuple[list[Problem], list[Problem]]:
    """(train problems, held-out problems cut to eval_problems) of the run's task; data that cannot be read
    or overlaps (tasks.check_disjoint) ends the run at start naming the fix."""
    task = tasks.task_of(cfg)
    train, held_out = tasks.task_problems(task, cfg)
    held_out = held_out[: cfg.eval_problems]
    tasks.check_disjoint(task, train, held_out, cfg)
    return train, held_out


def iteration_batch(train: list[Problem], batch_size: int, seed: int, iteration: int) -> list[Problem]:
    """Problems of iteration k: consecutive slices of a per-epoch permutation of the train set."""
    batch = []
    for position in range(iteration * batch_size, (iteration + 1) * batch_size):
        epoch, index = divmod(position, len(train))
        permutation = list(range(len(train)))
        random.Random(seed * 7919 + epoch).shuffle(permutation)
        batch.append(train[permutation[index]])
    return batch


def print_main(*args, **kwargs) -> None:
    """print, on rank 0 only (every rank runs the same loop under torchrun)."""
    if distributed.is_main():
        print(*args, **kwargs)


class PhaseTimer:
    """Wall seconds of each phase of one iteration: `with timer("rollout"): …` gives time/rollout. A phase
    ends by handing freed memory back (speed.return_freed_memory) and, on a GPU, waiting for its kernels."""

    def __init__(self, device: str = "cpu"):
        self.started, self.seconds, self.cuda = time.perf_counter(), {}, device.startswith("cuda")
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    @contextlib.contextmanager
    def __call__(self, phase: str):
        t0 = time.perf_counter()
        yield
        if self.cuda:
            torch.cuda.synchronize()
        speed.return_freed_memory()
        self.seconds[phase] = time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        gpu = {"perf/peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30} if self.cuda else {}
        return {**{f"time/{p}": s for p, s in self.seconds.items()}, "time/iteration": time.perf_counter() - self.started, **gpu}


def iteration_metrics(org: Organisation, rollout: Rollout, old, returns: torch.Tensor, cfg: Config,
                      timer: PhaseTimer) -> dict:
    """The iteration's training-rollout, critic and speed metrics (README: Metrics); `old`: marft.OldPolicy."""
    episodes, generated_tokens = len(rollout.solved), sum(len(r) for r in rollout.response_ids)
    metrics = {
        "charts/reward": (rollout.team_reward.sum() / episodes).item(),
        "charts/accuracy": sum(rollout.solved) / episodes,
        "charts/unparseable_rate": rollout.unparseable / max(rollout.graded_answers, 1),
        "charts/response_tokens": generated_tokens / len(rollout.response_ids),
        "charts/generated_tokens": generated_tokens,  # all agents' responses; summed over iterations: the run's budget
        "charts/truncated_prompts": rollout.truncated_prompts,
        "grader/timeouts": rollout.ungraded,
        "perf/rollout_tokens_per_second": generated_tokens / max(rollout.generation_seconds, 1e-9),
        # the (prompt + response) tokens each PPO epoch trains on, over the policy update's seconds
        "perf/update_tokens_per_second": cfg.ppo_epochs * (generated_tokens + sum(map(len, rollout.prompt_ids)))
                                         / max(timer.seconds.get("policy_update", 0.0), 1e-9),
        **timer.metrics(),
        **orchestration_metrics(rollout, org),  # the realised D_t (orchestrated organisations)
        **task_metrics(rollout, cfg, "charts"),  # the task's own (code: how the programs ended)
        **tool_metrics(rollout, org, "charts"),  # organisations with a tool: calls, errors, answers taken from it
    }
    if returns is not None:  # the critic's metrics
        metrics["losses/explained_variance"] = ppo.explained_variance(old.values, returns, old.mask)
        for n, role in enumerate(org.order):
            if samples := rollout.agent_samples(n):  # a tool has none
                metrics[f"charts/value_mean/{role}"] = ppo.masked_mean(old.values[samples], old.mask[samples]).item()
    for n, profile in enumerate(org.profile(role) for role in org.order):
        if profile.rewards:
            metrics[f"charts/role_reward/{profile.role}"] = sum(rollout.role_reward[s] for s in rollout.agent_samples(n)) / episodes
    return metrics


def log_and_checkpoint(job: Job, done_iterations: int, metrics: dict, progress) -> None:
    """Log the iteration's metrics (with the run's elapsed time) and write its atomic checkpoint."""
    metrics["time/elapsed"] = elapsed = job.run.elapsed()
    job.run.log(done_iterations, metrics)
    if job.run.writes:  # every rank holds the same weights and optimiser states
        save_checkpoint(job.run.dir, done_iterations, job.model, job.value_heads, job.optimisers, elapsed,
                        job.run.cfg.keep_checkpoints)
    accuracy = job.run.summary.get("final", job.run.summary.get("initial", {})).get("eval/accuracy", float("nan"))
    progress.set_postfix(reward=f"{metrics['charts/reward']:.2f}", acc=f"{accuracy:.2f}")


# ---- The run folder --------------------------------------------------------------------------

def sampler_record(cfg: Config) -> str:
    """What drew the rollouts and how they are weighed (config.json's rollout/sampler)."""
    sampler = generation.describe_sampler(cfg)
    if cfg.backend == "hf":
        return f"{sampler}: μ = π_old, no correction"
    return (f"{sampler}: μ ≠ π_old (another implementation or dtype), each decision weighed by "
            + {"tis": f"min(π_old/μ, {ppo.ROLLOUT_CORRECTION_CAP:g})", "mis": f"1[π_old/μ ≤ {ppo.ROLLOUT_CORRECTION_CAP:g}]",
               "none": "1 (uncorrected: --rollout_correction none)"}[cfg.rollout_correction])


class Run:
    """runs/<name>/ of one training run: `Run(cfg)` makes it and writes config.json (--resume: opens it);
    `restore` loads the last checkpoint and opens the metrics log; `log` appends an iteration; `finish`
    writes and prints the summary. Under torchrun every rank reads and rank 0 alone writes."""

    def __init__(self, cfg: Config):
        self.cfg, self.wall_start, self.writes = cfg, time.time(), distributed.is_main()
        if cfg.resume:
            self.dir = Path(cfg.resume)
        else:
            # Without --run_name the folder is named by rank 0's clock, which every rank must share.
            name = cfg.run_name or distributed.broadcast_object(f"{Path(cfg.agents).stem}-seed{cfg.seed}-{time.strftime('%Y%m%d-%H%M%S')}")
            self.dir = Path(cfg.output_dir) / name
            if (self.dir / "checkpoints").exists():
                raise SystemExit(f"run folder {self.dir} already has checkpoints: pass --resume {self.dir} or another --run_name")
            distributed.barrier()  # every rank has looked before rank 0 writes
            if self.writes:
                self.dir.mkdir(parents=True, exist_ok=True)
                recorded = sandbox.sandbox_record()  # isolation, syscall filter, limits: once a program has run
                if cfg.model.startswith(agents_lib.RANDOM_MODEL):
                    recorded["model/weights"] = "random: its accuracies mean nothing, its seconds and bytes do"
                recorded["rollout/sampler"] = sampler_record(cfg)
                if (cpu_paths := speed.cpu_paths_record()) is not None:
                    recorded["machine/cpu_paths"] = cpu_paths
                # options the user did not give, chosen to follow those they did (parse_args), and why
                recorded |= {f"chosen/{option}": why for option, why in getattr(cfg, "chosen", {}).items()}
                # the built-in tasks' options the run's task does not read are left out: read back, they take their defaults
                unread = tasks.unread_options(tasks.task_of(cfg), cfg)
                options = {option: value for option, value in dataclasses.asdict(cfg).items() if option not in unread}
                (self.dir / "config.json").write_text(json.dumps({**options, **recorded}, indent=2))
        if self.writes:
            print(f"run folder: {self.dir}", flush=True)
        self.start_iteration, self.elapsed_before, self.summary = 0, 0.0, {}
        self.summary_path = self.dir / "summary.json"

    def restore(self, model, value_heads, optimisers) -> int:
        """Load the last checkpoint when resuming; returns the iteration to start from."""
        if self.cfg.resume:
            state = load_checkpoint(self.dir, model, value_heads, optimisers)
            self.start_iteration, self.elapsed_before = state["iteration"], state["elapsed_seconds"]
            if self.writes:
                print(f"resumed from iteration {self.start_iteration}", flush=True)
            if self.summary_path.exists():
                self.summary = json.loads(self.summary_path.read_text())
        distributed.barrier()  # every rank has read the checkpoint before rank 0 writes again
        if self.writes:
            self.metrics = MetricsLog(self.dir, keep_before=self.start_iteration + 1 if self.start_iteration > 0 else 0)
        return self.start_iteration

    def elapsed(self) -> float:
        """Wall seconds of the run so far, across resumes."""
        return self.elapsed_before + time.time() - self.wall_start

    def log(self, iteration: int, metrics: dict) -> None:
        """One metrics.jsonl line; held-out results also go to summary.json (initial at 0, else final)."""
        if not self.writes:
            return
        self.metrics.write(iteration, metrics)
        if iteration == 0:
            self.summary["initial"] = metrics
        elif "eval/accuracy" in metrics:
            self.summary["final"] = {k: v for k, v in metrics.items() if k.startswith("eval/")}
            self.summary["final_iteration"] = iteration
        else:
            return
        write_json_atomically(self.summary_path, self.summary)

    def finish(self) -> dict:
        """Write and print the summary: held-out accuracy at iteration 0 and at the end (an orchestrated
    team's calls too), the critic's explained variance, wall time; every rank returns rank 0's."""
        if not self.writes:
            return distributed.broadcast_object(None)
        self.metrics.close()
        self.summary |= {"wall_seconds": self.elapsed(), "run_dir": str(self.dir)}
        rows = [json.loads(line) for line in self.metrics.path.read_text().splitlines() if line]
        if (explained := last_third_mean(rows, "losses/explained_variance")) is not None:
            self.summary["critic_explained_variance_last_third"] = explained
        write_json_atomically(self.summary_path, self.summary)
        first, last = self.summary.get("initial", {}), self.summary.get("final", {})
        print(f"\n=== MARFT summary ===\nrun folder            {self.dir}")
        labels = {"eval/accuracy": "held-out accuracy (pass@1, sampled)",
                  "eval/accuracy_greedy": "held-out accuracy (greedy)", "eval/unparseable_rate": "held-out unparseable rate"}
        if "eval/calls_per_episode" in first:  # an orchestrated team: its realised D_t on the greedy episodes
            labels["eval/calls_per_episode"] = "calls per episode (greedy)"
            labels |= {k: f"  calls of {k.removeprefix('eval/calls/')}" for k in first if k.startswith("eval/calls/")}
            labels |= {"eval/finish_rate": "steps ended by finish", "eval/orchestration_errors": "steps ended by an error"}
        for key, label in labels.items():
            print(f"{label:<38} iteration 0: {first.get(key, float('nan')):.3f}   end: {last.get(key, float('nan')):.3f}")
        if explained is not None:
            print(f"{'critic explained variance':<38} mean over the last third of the iterations: {explained:.3f}")
        print(f"wall time             {self.summary['wall_seconds'] / 60:.1f} min")
        return distributed.broadcast_object(self.summary)


def last_third_mean(rows: list[dict], key: str) -> float | None:
    """Mean of metric `key` over the rows of the last third of the iterations (at least the last
    row), NaN left out (explained variance with equal returns); None when no row has a value."""
    last_iteration = max((row["iteration"] for row in rows), default=0)
    values = [row[key] for row in rows if row["iteration"] > last_iteration * 2 // 3 and key in row and not math.isnan(row[key])]
    return sum(values) / len(values) if values else None


def write_json_atomically(path: Path, data: dict) -> None:
    """Write through a temporary file and a rename: a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False))
    os.replace(tmp, path)


class MetricsLog:
    """metrics.jsonl in the run folder (one line per iteration), mirrored to TensorBoard. On resume,
    the lines and events of iterations ≥ `keep_before` (written after the checkpoint) are dropped."""

    def __init__(self, run_dir: Path, keep_before: int):
        from torch.utils.tensorboard import SummaryWriter
        self.path = run_dir / "metrics.jsonl"
        if self.path.exists():  # drop lines written after the checkpoint we resume from
            kept = [l for l in self.path.read_text().splitlines() if l and json.loads(l)["iteration"] < keep_before]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(l + "\n" for l in kept))
            os.replace(tmp, self.path)
        # purge_step hides every event at a step ≥ keep_before written by an earlier process.
        self.tensorboard = SummaryWriter(str(run_dir / "tensorboard"), purge_step=keep_before if keep_before > 0 else None)

    def write(self, iteration: int, metrics: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"iteration": iteration, **metrics}) + "\n")
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.tensorboard.add_scalar(key, value, iteration)
        self.tensorboard.flush()

    def close(self) -> None:
        self.tensorboard.close()


# ---- Checkpoints: adapters, critic heads, optimisers, iteration — written atomically ---------

def save_checkpoint(run_dir: Path, iteration: int, model, value_heads, optimisers, elapsed: float, keep: int) -> None:
    """Write checkpoints/iter_<k> through a temporary folder + rename, then point `latest` at it."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final, staging = root / f"iter_{iteration:06d}", root / f".tmp_iter_{iteration:06d}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    model.save_pretrained(staging / "adapters", selected_adapters=list(model.peft_config))  # peft format, one folder each
    if len(value_heads):  # --advantage group has no critic
        torch.save(value_heads.state_dict(), staging / "value_heads.pt")
    torch.save({name: opt.state_dict() for name, opt in optimisers.items()}, staging / "optimizers.pt")
    (staging / "state.json").write_text(json.dumps({"iteration": iteration, "elapsed_seconds": elapsed}))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    pointer = root / ".latest.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, root / "latest")
    for old in sorted(p for p in root.glob("iter_*") if p != final)[:-keep + 1 or None]:
        shutil.rmtree(old, ignore_errors=True)


def checkpoint_folder(run_dir: Path, name: str | None, option: str) -> Path:
    """RUN/checkpoints/<name>, by default the one checkpoints/latest names (`option`: for errors)."""
    root = Path(run_dir) / "checkpoints"
    available = sorted(p.name for p in root.glob("iter_*") if p.is_dir()) if root.is_dir() else []
    listing = f"checkpoints there: {', '.join(available)}" if available else "the run has no checkpoints yet"
    if name is None:
        if not (root / "latest").is_file():
            raise SystemExit(f"{option} {run_dir}: checkpoints/latest is missing ({listing}); "
                             "train the run for at least one iteration, or name a checkpoint")
        name = (root / "latest").read_text().strip()
    folder = root / name
    if not (folder / "adapters").is_dir():
        raise SystemExit(f"{option} {run_dir}: checkpoint {name!r} not found ({listing})")
    return folder


def load_adapters(folder: Path, model, adapters: list[str]) -> None:
    """Load a checkpoint's adapter weights into the model's adapters of the same names (trainable)."""
    try:
        agents_lib.load_adapter_weights(model, folder / "adapters", adapters)
    except ValueError as err:
        raise SystemExit(f"checkpoint {folder}: {err}") from None


def init_policy_adapters(sources: str, model, adapters: list[str]) -> list[str]:
    """--init_from RUN[:CHECKPOINT][,…]: each checkpoint's weights into this run's policy `adapters` of the same
    name, the first source winning; returns the names loaded. A source that gives none stops the run."""
    loaded: list[str] = []
    for source in sources.split(","):
        run_dir, _, name = source.partition(":")
        folder = checkpoint_folder(Path(run_dir), name or None, "--init_from")
        saved = agents_lib.saved_adapter_names(folder / "adapters")
        shared = [adapter for adapter in adapters if adapter in saved and adapter not in loaded]
        if not shared:
            raise SystemExit(f"--init_from {source}: checkpoint {folder} holds {saved}, none of this run's policy adapters "
                             f"{[a for a in adapters if a not in loaded]} (not loaded from an earlier source); adapters are "
                             f"matched by role name (policy_<role>, or policy with --shared_adapter)")
        load_adapters(folder, model, shared)
        loaded += shared
    return loaded


def load_checkpoint(run_dir: Path, model, value_heads, optimisers) -> dict:
    """Restore the last checkpoint into freshly built adapters (they stay trainable)."""
    folder = checkpoint_folder(run_dir, None, "--resume")
    load_adapters(folder, model, list(model.peft_config))
    if len(value_heads):
        value_heads.load_state_dict(torch.load(folder / "value_heads.pt", map_location=model.device))
    saved_optimisers = torch.load(folder / "optimizers.pt", map_location=model.device)
    for name, opt in optimisers.items():
        opt.load_state_dict(saved_optimisers[name])
    return json.loads((folder / "state.json").read_text())
