"""envs/word_problems.py: the tool task's data. Answers worked by hand; the held-out split
disjoint from training by operands (across templates) and by the held-out templates."""
import re

import pytest

from envs import word_problems as wp
from envs.problems import extract_boxed


def test_answers_are_the_stories_arithmetic_worked_by_hand():
    by_name = {t.name: t for t in wp.TEMPLATES}
    cases = [("boxes", (237, 82), "19434"),  # 237·80 + 237·2 = 18960 + 474
             ("stamps", (361, 25, 12), "661"),  # 361 + 300
             ("floors", (412, 305, 199), "916"),
             ("crates", (250, 12, 999), "2001"),  # 3000 − 999
             ("tickets", (100, 999), "1099"),
             ("rows", (120, 11), "1320")]
    for name, operands, answer in cases:
        problem = wp.word_problem(by_name[name], operands)
        assert problem.answer == answer and extract_boxed(problem.solution) == answer
        assert all(str(x) in problem.problem for x in operands)


def numbers(problem):
    return tuple(sorted(int(x) for x in re.findall(r"\d+", problem.problem)))


def test_no_held_out_problem_shares_its_numbers_with_a_training_problem():
    train, test = wp.make_word_problems("train", seed=3), wp.make_word_problems("test", seed=3)
    assert len(train) == 50 * 7 and len(test) == 50 * 6  # 4 training templates and 3 stones; 6 held out
    assert not {numbers(p) for p in train} & {numbers(p) for p in test}  # nor the same numbers in another order
    assert wp.held_out((412, 305, 199)) == wp.held_out((199, 412, 305))
    assert {p.level for p in test} - {p.level for p in train} == set(wp.HELD_OUT_TEMPLATES)
    assert {p.level for p in train} - {p.level for p in test} == set(wp.STONE_NAMES)  # stones only in training
    assert all(int(p.answer) >= 0 for p in train + test)
    assert len({p.problem for p in train}) == len(train)  # no problem twice


def test_the_stepping_stones_are_the_two_step_story_in_smaller_steps():
    by_name = {stone.name: stone for stone in wp.STEPPING_STONES}
    story = lambda name: wp.word_problem(by_name[name], (361, 25, 12))
    assert story("stamps_packs").answer == "300" and "361" not in story("stamps_packs").problem  # the first step alone
    for name in ("stamps_given", "stamps_spelled"):  # the whole story, its first step written out
        assert "25*12" in story(name).problem and "361" in story(name).problem
        assert story(name).answer == "661" and extract_boxed(story(name).solution) == "661"  # 361 + 300, as stamps
    assert story("stamps_spelled").problem.startswith("Tom had 361 stamps and bought 25 packs of 12 stamps, that is")
    levels = [p.level for p in wp.make_word_problems("train", seed=3, count=30)]
    assert levels[:7] == ["boxes", "floors", "stamps", "tickets", "stamps_packs", "stamps_given", "stamps_spelled"]
    assert all(levels.count(name) == 30 for name in set(levels))  # a stone is drawn as often as a story


def test_the_split_is_a_function_of_the_operands_and_the_seed_picks_the_rows():
    assert wp.make_word_problems("train", seed=1, count=5) == wp.make_word_problems("train", seed=1, count=5)
    assert wp.make_word_problems("train", seed=1, count=5) != wp.make_word_problems("train", seed=2, count=5)
    share = sum(wp.held_out((a, b)) for a in range(100, 140) for b in range(11, 51)) / 1600
    assert abs(share - wp.TEST_FRACTION) < 0.03  # 1,600 tuples: the hash sends about a quarter to "test"
    first_round = [p.level for p in wp.make_word_problems("test", count=2)][:6]
    assert first_round == [t.name for t in wp.TEMPLATES]  # interleaved: every template in the first rows
    with pytest.raises(ValueError, match="split"):
        wp.make_word_problems("validation")
