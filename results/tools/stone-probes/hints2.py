"""Probe: hinted two-step stories for the untrained calculator team."""
import dataclasses, random
from envs.word_problems import TEMPLATES, Template, word_problem, held_out
from tasks import Task, WORD, BUILTIN_ORGANISATIONS
import tasks

T = {t.name: t for t in TEMPLATES}
VARIANTS = {
  "stamps_already": "Tom bought {b} packs of {c} stamps. He already had {a} stamps. How many stamps does he have now?",
  "stamps_each": "Tom had {a} stamps. Then he bought {b} packs with {c} stamps in each pack. How many stamps does he have now?",
  "stamps_times": "Tom had {a} stamps and got {b} times {c} more stamps. How many stamps does he have now?",
  "stamps_plusx": "Tom had {a} stamps and got {b}x{c} more stamps. How many stamps does he have now?",
  "crates_had": "A shop had {b} crates of {a} apples. It sold {c} apples. How many apples are left?",
  "crates_minus": "A shop had {a}*{b} apples and sold {c} apples. How many apples are left?",
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

PROBE = Task("probe_hints2", load, WORD.make_env, organisations={"calculator_team": BUILTIN_ORGANISATIONS["calculator_team"]},
             options=dict(WORD.options))
