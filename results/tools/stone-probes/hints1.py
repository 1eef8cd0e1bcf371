"""Probe: hinted two-step stories for the untrained calculator team."""
import dataclasses, random
from envs.word_problems import TEMPLATES, Template, word_problem, held_out
from tasks import Task, WORD, BUILTIN_ORGANISATIONS
import tasks

T = {t.name: t for t in TEMPLATES}
VARIANTS = {
  "stamps_paren": "Tom had {a} stamps and bought {b} packs of {c} stamps ({b}*{c} stamps). How many stamps does he have now?",
  "stamps_thatis": "Tom had {a} stamps and bought {b} packs of {c} stamps, that is {b}*{c} new stamps. How many stamps does he have now?",
  "stamps_plus": "Tom had {a} stamps and then got {b}*{c} more stamps. How many stamps does he have now?",
  "crates_paren": "A shop receives {b} crates of {a} apples ({a}*{b} apples) and sells {c} apples. How many apples are left?",
  "crates_thatis": "A shop receives {b} crates of {a} apples, that is {a}*{b} apples, and sells {c} apples. How many apples are left?",
}
def load(cfg):
    rows = []
    for name, text in VARIANTS.items():
        base = T[name.split("_")[0]]
        tmpl = dataclasses.replace(base, name=name, text=text)
        rng = random.Random(f"probe-{name}")
        n = 0
        while n < 8:
            ops = tuple(rng.choice(w) for w in base.operands)
            if base.answer(*ops) < 0: continue
            rows.append(word_problem(tmpl, ops)); n += 1
    inter = [rows[i::8] for i in range(8)]
    rows = [r for group in inter for r in group]
    return rows, rows

PROBE = Task("probe_hints", load, WORD.make_env, organisations={"calculator_team": BUILTIN_ORGANISATIONS["calculator_team"]},
             options=dict(WORD.options))
