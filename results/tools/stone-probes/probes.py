"""The untrained calculator team on rewordings of the two-step stories (docs/tools.md, "Stepping
stones"): which wording gives RL a solved episode to start from. Two tasks, one per probe:

    python evaluate.py --task results/tools/stone-probes/probes.py:HINTS1 --samples 4 --temperature 0.7
    python evaluate.py --task results/tools/stone-probes/probes.py:HINTS2 --samples 4 --temperature 0.7

Each variant is a story of envs/word_problems.py reworded; 8 problems per variant, every variant's
numbers drawn from its own seed, held out and trained alike (a probe, not a training set).
"""
import dataclasses
import random

from envs.word_problems import TEMPLATES, word_problem
from tasks import BUILTIN_ORGANISATIONS, WORD, Task

STORIES = {t.name: t for t in TEMPLATES}
PER_VARIANT = 8


def probe_task(name: str, variants: dict[str, str]) -> Task:
    """A task whose problems are PER_VARIANT of each variant, interleaved; variant names start with the story's."""
    def load(cfg):
        rows = []
        for variant, text in variants.items():
            story = STORIES[variant.split("_")[0]]
            template, rng, drawn = dataclasses.replace(story, name=variant, text=text), random.Random(f"probe-{variant}"), 0
            while drawn < PER_VARIANT:
                operands = tuple(rng.choice(where) for where in story.operands)
                if story.answer(*operands) >= 0:
                    rows.append(word_problem(template, operands))
                    drawn += 1
        rows = [row for turn in range(PER_VARIANT) for row in rows[turn::PER_VARIANT]]
        return rows, rows
    return Task(name, load, WORD.make_env, organisations={"calculator_team": BUILTIN_ORGANISATIONS["calculator_team"]},
                options=dict(WORD.options))


HINTS1 = probe_task("probe_hints", {  # the first step written out, three ways
    "stamps_paren": "Tom had {a} stamps and bought {b} packs of {c} stamps ({b}*{c} stamps). How many stamps does he have now?",
    "stamps_thatis": "Tom had {a} stamps and bought {b} packs of {c} stamps, that is {b}*{c} new stamps. How many stamps does "
                     "he have now?",
    "stamps_plus": "Tom had {a} stamps and then got {b}*{c} more stamps. How many stamps does he have now?",
    "crates_paren": "A shop receives {b} crates of {a} apples ({a}*{b} apples) and sells {c} apples. How many apples are left?",
    "crates_thatis": "A shop receives {b} crates of {a} apples, that is {a}*{b} apples, and sells {c} apples. How many apples "
                     "are left?",
})
HINTS2 = probe_task("probe_hints2", {  # rewordings without the step, and the minus shape with it
    "stamps_already": "Tom bought {b} packs of {c} stamps. He already had {a} stamps. How many stamps does he have now?",
    "stamps_each": "Tom had {a} stamps. Then he bought {b} packs with {c} stamps in each pack. How many stamps does he have now?",
    "stamps_times": "Tom had {a} stamps and got {b} times {c} more stamps. How many stamps does he have now?",
    "stamps_plusx": "Tom had {a} stamps and got {b}x{c} more stamps. How many stamps does he have now?",
    "crates_had": "A shop had {b} crates of {a} apples. It sold {c} apples. How many apples are left?",
    "crates_minus": "A shop had {a}*{b} apples and sold {c} apples. How many apples are left?",
})
