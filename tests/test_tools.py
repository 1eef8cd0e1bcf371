"""tools.py: the calculator, a fixed policy. Values worked by hand; every input a policy could
write that is not arithmetic, or is arithmetic too large, is an error text, never an exception."""
from fractions import Fraction

import pytest

import tools


@pytest.mark.parametrize("expression, value", [
    ("964*59", "56876"),  # 964·59 = 964·60 − 964 = 57840 − 964
    ("361 + 25 * 12", "661"),  # 25·12 = 300
    ("237 * 82", "19434"),  # 237·80 + 237·2 = 18960 + 474
    ("1/3 + 1/6", "1/2"),  # 2/6 + 1/6 = 3/6
    ("2*(3+4) - -5", "19"),
    ("7/2", "7/2"),
    ("0.1 + 0.2", "3/10"),  # exact: decimals are read as written, not as binary floats
    ("2**10", "1024"),
    ("2^-2", "1/4"),  # ^ is read as a power
    ("17 // 5", "3"),
    ("-17 % 5", "3"),  # Python's sign convention: −17 = 5·(−4) + 3
    ("6 × 7 ÷ 3", "14"),
    ("  +42 ", "42"),
    ("1e3 + .5", "2001/2"),
    ("0x10 + 1_000", "1016"),
])
def test_the_calculator_is_exact_on_integers_and_fractions(expression, value):
    assert tools.format_value(tools.calculate(expression)) == value


@pytest.mark.parametrize("expression, words", [
    ("", "empty expression"),
    ("3 +", "not an arithmetic expression"),
    ("7 / (3 - 3)", "division by zero"),
    ("5 % 0", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("__import__('os').system('id')", "not Call"),
    ("x + 1", "not Name"),
    ("(1).real", "not Attribute"),
    ("[1, 2]", "not List"),
    ("True + 1", "not Constant"),
    ("'a' * 3", "not Constant"),
    ("2 ** 0.5", "whole numbers"),
    ("2 ** 65", "whole numbers up to 64"),
    ("10 ** 64 * 10 ** 64 * 10 ** 64 * 10 ** 64", "more than 200 digits"),
    ("9" * 201, "longer than 200 characters"),
    ("+".join(["1"] * 99), "more than 100 parts"),
    ("(" * 150 + "1" + ")" * 150, "longer than 200 characters"),
    ("-" * 190 + "1", "more than 100 parts"),
    ("lambda: 1", "not Lambda"),
    ("1j", "not Constant"),
    ("1e999999999", "more than 200 digits"),  # refused from its exponent, before 10^999999999 is built
    ("1e-400", "more than 200 digits"),  # not rounded to 0 as a float would be
    ("1e200 * 1e200", "more than 200 digits"),
    ("2 ** -64 ** 64", "whole numbers up to 64"),  # ** is right-associative: the exponent is −64^64
])
def test_what_is_not_bounded_arithmetic_is_refused_with_a_reason(expression, words):
    with pytest.raises(tools.CalculatorError, match=words):
        tools.calculate(expression)


def test_the_tools_action_evaluates_every_call_it_reads_and_never_raises():
    text = "Multiply first: \\calc{964*59}. Then \\calc{1/0} and \\calc{open('x')}."
    assert tools.calculator_action(text) == ("964*59 = 56876\n1/0: error: division by zero\n"
                                             "open('x'): error: only numbers and + - * / // % ** ( ) are allowed, not Call")
    assert tools.calculator_action("I will just answer 5.") == "error: no \\calc{...} expression to evaluate"
    many = " ".join(f"\\calc{{{k}+1}}" for k in range(6))
    assert tools.calculator_action(many).splitlines() == ["0+1 = 1", "1+1 = 2", "2+1 = 3", "3+1 = 4",
                                                          "error: only the first 4 \\calc{...} expressions are evaluated"]
    assert tools.calculate("1/3") == Fraction(1, 3)


def test_random_text_in_a_call_always_gives_text():
    """Whatever a policy writes between the braces (2,000 random strings of the characters of
    arithmetic and of Python literals), the tool's action is a string: no exception escapes."""
    import random
    rng = random.Random(0)
    pieces = list("0123456789") + ["+", "-", "*", "/", "//", "%", "**", "(", ")", ".", "e", "_", "j", "x", " ", "^", "1e50"]
    for _ in range(2000):
        expression = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40)))
        assert isinstance(tools.calculator_action(f"\\calc{{{expression}}}"), str)
