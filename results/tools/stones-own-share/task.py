"""Probe: the word task with stepping stones for the two-step training story (stamps)."""
import dataclasses
from envs.word_problems import TEMPLATES, make_word_problems
import envs.word_problems as wp
from tasks import Task, WORD, BUILTIN_ORGANISATIONS, word_metrics

STONES = {
  "stamps_given": "Tom had {a} stamps and then got {b}*{c} more stamps. How many stamps does he have now?",
  "stamps_thatis": "Tom had {a} stamps and bought {b} packs of {c} stamps, that is {b}*{c} new stamps. How many stamps does he have now?",
}
def load(cfg):
    train, test = WORD.load(cfg)
    base = {t.name: t for t in TEMPLATES}["stamps"]
    stones = [dataclasses.replace(base, name=n, text=t) for n, t in STONES.items()]
    saved = wp.TEMPLATES
    try:
        wp.TEMPLATES = tuple(stones)
        extra = make_word_problems("train", cfg.seed, 200)
    finally:
        wp.TEMPLATES = saved
    # interleave: 4 word rows then 2 stones
    out, e = [], iter(extra)
    for i, row in enumerate(train):
        out.append(row)
        if i % 2 == 1:
            out.append(next(e))
    return out, test

STEPS = Task("word_steps_probe", load, WORD.make_env, metrics=word_metrics, options=dict(WORD.options),
             organisations={"calculator_team": BUILTIN_ORGANISATIONS["calculator_team"]})
