"""A MARFT run as a process and on disk: its set-up, the plumbing around each iteration (seed, problems,
phase timer, metrics, checkpoint), its folder and checkpoints; no equation of the paper (marft.train).
Resuming needs no random-generator state: iteration k is seeded from (seed, k) (`seed_iteration`).

    runs/<name>/config.json, metrics.jsonl (+ tensorboard/), summary.json     `Run`, `MetricsLog`
    checkpoints/iter_<k>/   adapters/<adapter>/ (peft format), value_heads.pt (the critic's Linear(H, 1) heads; none
                            with --advantage group), optimizers.pt (Adam states by adapter), state.json (k, seconds)
    checkpoints/latest      the name of the newest complete checkpoint, replaced atomically
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
    """This rank's device, problems, run folder, model, critic, optimisers (--resume: restored) and generator."""
    device = set_up_process(cfg)
    train_problems, held_out = load_task(cfg)
    check_environment(cfg, tasks.organisation_of(cfg), {"training": (0, train_problems[0]), "held-out": (0, held_out[0])})
    run = Run(cfg)
    org, model, tokenizer, value_heads, optimisers = build(cfg)
    if cfg.model.startswith(agents_lib.RANDOM_MODEL):  # (vLLM draws its own: rollout/logprob_abs_diff is large)
        print_main(f"[model] {cfg.model}: RANDOM weights on {device}: only its seconds and bytes mean anything", flush=True)
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
    policy, spin, busy = (os.environ.get(name) for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MARFT_SHARED_CPU"))
    why = f" (other processes kept {busy} cores busy at start)" if busy else "" if spin else " (libgomp's default)"
    wait = f"OMP_WAIT_POLICY={policy}" if policy else f"spin {spin or '300,000'} rounds, then sleep{why}"
    return f"[threads] {threads} torch threads; OpenMP's idle threads {wait}"


def build(cfg: Config):
    """Organisation, base model with every policy and critic adapter, value heads, one optimiser per adapter."""
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
    return None if isinstance(config, dict) and "model_type" in config else f"{path!r} has no model_type: not a model config"


def model_error(name: str) -> str | None:
    """Why --model `name` cannot be loaded, with the fix (None when it can), reading no weights."""
    if name.startswith(agents_lib.RANDOM_MODEL):
        why = random_config_error(name.removeprefix(agents_lib.RANDOM_MODEL))
        return why and f"{why}: give random:<a transformers config.json>, e.g. random:models/qwen2.5-0.5b.json"
    if name == agents_lib.EMBEDDED_MODEL:
        return None
    import huggingface_hub as hf
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, HFValidationError, RepositoryNotFoundError
    path, hub = Path(name), hf.constants.ENDPOINT
    choices = ('give "smollm2" (the embedded SmolLM2-135M-Instruct), a local HF folder holding config.json, a hub id '
               '(owner/name) or random:<config.json>')
    try:  # a path, unless it names nothing here and has a hub id's shape (owner/name)
        local = path.exists() or hf.utils.validate_repo_id(name)  # ./x, ../x, ~/x, /x, a/b/c have no hub id's shape
    except HFValidationError:
        local = True
    if local:  # a folder holding config.json
        why = ("no such folder" if not path.exists() else "a file, not a model folder" if not path.is_dir() else None
               if (path / "config.json").is_file() else "the folder holds no config.json: not a transformers model")
        return why and f"{why}; {choices}"
    if isinstance(hf.try_to_load_from_cache(name, "config.json"), str):  # a hub id's config.json: in the cache or on the hub
        return None
    absent = f"neither a local folder nor a hub id in the local Hugging Face cache ({hf.constants.HF_HUB_CACHE})"
    if hf.constants.HF_HUB_OFFLINE:
        return f"{absent} and HF_HUB_OFFLINE is set: download it once online (hf download {name}); {choices}"
    try:
        hf.get_hf_file_metadata(hf.hf_hub_url(name, "config.json"), timeout=5)
        return None
    except GatedRepoError:
        why = f"a gated model on the hub: accept its terms on {hub}/{name} and log in (hf auth login)"
    except RepositoryNotFoundError:
        why = f"{absent}, and {hub} has no such model (a private one needs hf auth login)"
    except EntryNotFoundError:
        why = f"{hub}/{name} has no config.json: not a transformers model"
    except Exception as error:  # no network, no name service, a proxy: the hub cannot be asked
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        why = f"{absent}, and {hub} cannot be reached ({reason}): download it where it can (hf download {name})"
    return f"{why}; {choices}"


# ---- Around each iteration: its seed, its problems, its timer, its metrics, its checkpoint ----

def seed_iteration(seed: int, iteration: int) -> torch.Generator:
    """Re-seed every generator from (seed, iteration): resumed runs replay the same randomness."""
    stream = seed * 1_000_003 + iteration
    random.seed(stream)
    torch.manual_seed(stream)
    return torch.Generator().manual_seed(stream)


def load_task(cfg: Config) -> tuple[list[Problem], list[Problem]]:
    """(train problems, held-out problems cut to eval_problems); overlapping data stops (tasks.check_disjoint)."""
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
    """Wall seconds of each phase: `with timer("rollout"): …` gives time/rollout (GPU kernels awaited, memory freed)."""

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
    last = job.run.summary.get("final", job.run.summary.get("initial", {}))
    accuracy = last.get("eval/accuracy", last.get("eval/accuracy_greedy", float("nan")))  # greedy with --eval_samples 0
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
    """runs/<name>/: `Run(cfg)` writes config.json (--resume: opens it), `restore` the last checkpoint, `log` an
    iteration, `finish` the summary. Under torchrun every rank reads and rank 0 alone writes."""

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
                recorded |= {f"chosen/{option}": why for option, why in getattr(cfg, "chosen", {}).items()}
                # the built-in tasks' options the run's task does not read are left out: read back, they take their defaults
                unread = tasks.unread_options(tasks.task_of(cfg), cfg)
                options = {option: value for option, value in dataclasses.asdict(cfg).items() if option not in unread}
                write_json_atomically(self.dir / "config.json", {**options, **recorded})
        print_main(f"run folder: {self.dir}", flush=True)
        self.start_iteration, self.elapsed_before, self.summary = 0, 0.0, {}
        self.summary_path = self.dir / "summary.json"

    def restore(self, model, value_heads, optimisers) -> int:
        """Load the last checkpoint when resuming; returns the iteration to start from."""
        if self.cfg.resume:
            state = load_checkpoint(self.dir, model, value_heads, optimisers)
            self.start_iteration, self.elapsed_before = state["iteration"], state["elapsed_seconds"]
            print_main(f"resumed from iteration {self.start_iteration}", flush=True)
            if self.summary_path.exists():
                self.summary = json.loads(self.summary_path.read_text())
        distributed.barrier()  # every rank has read the checkpoint before rank 0 writes again
        if self.writes:
            self.metrics = MetricsLog(self.dir, keep_before=self.start_iteration + 1 if self.start_iteration > 0 else 0)
        return self.start_iteration

    def elapsed(self) -> float:  # wall seconds of the run so far, across resumes
        return self.elapsed_before + time.time() - self.wall_start

    def log(self, iteration: int, metrics: dict) -> None:
        """One metrics.jsonl line; held-out results also go to summary.json (initial at 0, else final)."""
        if not self.writes:
            return
        self.metrics.write(iteration, metrics)
        if iteration == 0:
            self.summary["initial"] = metrics
        elif "eval/accuracy" in metrics or (not self.cfg.eval_samples and "eval/accuracy_greedy" in metrics):
            self.summary["final"] = {k: v for k, v in metrics.items() if k.startswith("eval/")}
            self.summary["final_iteration"] = iteration
        else:
            return
        write_json_atomically(self.summary_path, self.summary)

    def finish(self) -> dict:
        """Write and print the summary (held-out results at iteration 0 and at the end); every rank returns rank 0's."""
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
    """Mean of `key` over the last third of the iterations (at least the last row), NaN left out; None: no value."""
    last_iteration = max((row["iteration"] for row in rows), default=0)
    values = [row[key] for row in rows if row["iteration"] > last_iteration * 2 // 3 and key in row and not math.isnan(row[key])]
    return sum(values) / len(values) if values else None


def write_json_atomically(path: Path, data: dict) -> None:
    """Write through a temporary file and a rename: a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


class MetricsLog:
    """metrics.jsonl (a line per iteration), mirrored to TensorBoard; lines and events at ≥ `keep_before` are dropped."""

    def __init__(self, run_dir: Path, keep_before: int):
        from torch.utils.tensorboard import SummaryWriter
        self.path = run_dir / "metrics.jsonl"
        if self.path.exists():  # a resumed run: drop the lines written after its checkpoint
            kept = [l for l in self.path.read_text().splitlines() if l and json.loads(l)["iteration"] < keep_before]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(l + "\n" for l in kept))
            os.replace(tmp, self.path)
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
    final, staging = root / f"iter_{iteration:06d}", root / f".tmp_iter_{iteration:06d}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
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
            raise SystemExit(f"{option} {run_dir}: checkpoints/latest is missing ({listing}); name a checkpoint")
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
    """--init_from RUN[:CHECKPOINT][,…] into the policy `adapters` of the same name, the first source winning."""
    loaded: list[str] = []
    for source in sources.split(","):
        run_dir, _, name = source.partition(":")
        folder = checkpoint_folder(Path(run_dir), name or None, "--init_from")
        saved = agents_lib.saved_adapter_names(folder / "adapters")
        shared = [adapter for adapter in adapters if adapter in saved and adapter not in loaded]
        if not shared:
            raise SystemExit(f"--init_from {source}: checkpoint {folder} holds {saved}, none of this run's policy adapters "
                             f"{[a for a in adapters if a not in loaded]} (not loaded from an earlier source)")
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
