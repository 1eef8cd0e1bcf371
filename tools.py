"""Tools: agents with a fixed policy, here the calculator and the python runner.

Paper: MARFT (Liao et al., arXiv 2504.16129), the Flex-POMDP: a tool is an agent whose π^j in a^j_t ~ π^j(· | ô^j_t)
is fixed and deterministic: no adapter, no update, no PPO sample, no place in the step's tables (advantages, GAE
chain, credit and M run over the learning agents alone); its action reaches the learners and the critic only through
their observations. A profile names it: `{"role": "calculator", "tool": "calculator"}` (rollout.play_tool plays it).
The calculator evaluates an `ast` parse of arithmetic itself (no `eval`) within the MAX_* bounds, so a policy under
RL pressure cannot make it hang or exhaust memory; the python runner runs a program in envs/sandbox.py. Neither
raises on what a policy writes: an error is its action.
"""
from __future__ import annotations

import ast
import re
from fractions import Fraction

from envs import sandbox

CALL = re.compile(r"\\calc\{([^{}]*)\}")  # \calc{EXPR}: EXPR has no braces
MAX_EXPRESSION_CHARS = 200  # longer input is refused before parsing
MAX_NODES = 100  # parse-tree nodes of one expression
MAX_EXPONENT = 64  # |b| in a ** b
MAX_DIGITS = 200  # numerator and denominator of every intermediate value
MAX_CALLS = 4  # expressions evaluated per action (the rest are reported as not evaluated)
SIGNS = {"\\times": "*", "\\cdot": "*", "\\div": "/", "×": "*", "÷": "/", "^": "**"}  # as Python writes them
SIGN = re.compile(r"\\(?:times|cdot|div)(?![a-zA-Z])|[×÷^]")  # \calc{613\times47}: a model trained on LaTeX writes it
_OPERATORS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
              ast.Div: lambda a, b: a / b, ast.FloorDiv: lambda a, b: Fraction(a // b), ast.Mod: lambda a, b: a % b}
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
PYTHON_LIMITS = sandbox.Limits(seconds_per_test=2.0, seconds_per_program=5.0)
MAX_OUTPUT_CHARS = 1000  # printed output kept in the action (what later agents read)
NO_OUTPUT = "(the program printed nothing)"


class CalculatorError(ValueError):
    """An expression the calculator will not evaluate; its message is the tool's output."""


def calculate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression: integers, decimals, + − × ÷ (also LaTeX's \\times,
    \\cdot, \\div), //, %, ** with an integer exponent, parentheses, unary ±; else CalculatorError."""
    text = SIGN.sub(lambda m: SIGNS[m.group(0)], expression).strip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalculatorError(f"not an arithmetic expression: {text!r}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError(f"expression of more than {MAX_NODES} parts")
    return _value(tree.body, text)


def _value(node: ast.AST, source: str) -> Fraction:
    """Evaluate one node of the parse tree of `source` (recursive; the node count bounds the depth)."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if isinstance(node.value, int):
            return _bounded(Fraction(node.value))
        # a decimal from its text (0.1 is 1/10, not the float nearest it; 1e-400 is not 0), its exponent bounded first
        written = (ast.get_source_segment(source, node) or "").replace("_", "").lower()
        exponent = written.partition("e")[2]
        if exponent and (not exponent.lstrip("+-").isdigit() or abs(int(exponent)) > MAX_DIGITS):
            raise CalculatorError(f"result of more than {MAX_DIGITS} digits")
        try:
            value = Fraction(written)
        except ValueError:
            raise CalculatorError(f"not a number: {written!r}") from None
        return _bounded(value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        return _value(node.operand, source) * (1 if isinstance(node.op, ast.UAdd) else -1)
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left, source), _value(node.right, source)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise CalculatorError("division by zero")
        if type(node.op) in _OPERATORS:
            return _bounded(_OPERATORS[type(node.op)](left, right))
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(right) > MAX_EXPONENT:
                raise CalculatorError(f"exponents must be whole numbers up to {MAX_EXPONENT}")
            if left == 0 and right < 0:
                raise CalculatorError("division by zero")
            if max(left.numerator.bit_length(), left.denominator.bit_length()) * abs(int(right)) > 4 * MAX_DIGITS:
                raise CalculatorError(f"result of more than {MAX_DIGITS} digits")
            return _bounded(left ** int(right))
    raise CalculatorError(f"only numbers and + - * / // % ** ( ) are allowed, not {type(node).__name__}")


def _bounded(value: Fraction) -> Fraction:
    if max(len(str(abs(value.numerator))), len(str(value.denominator))) > MAX_DIGITS:
        raise CalculatorError(f"result of more than {MAX_DIGITS} digits")
    return value


def format_value(value: Fraction) -> str:
    """56876, -3, or 1/2: a whole number without a denominator, else the reduced fraction."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def calculator_action(text: str) -> str:
    """The calculator's action on what it reads: one line per `\\calc{EXPR}` ("EXPR = VALUE", or
    "EXPR: error: WHY"), at most MAX_CALLS; a text without a call gets an error line. Never raises."""
    calls = CALL.findall(text)
    if not calls:
        return "error: no \\calc{...} expression to evaluate"
    lines = []
    for expression in calls[:MAX_CALLS]:
        shown = expression.strip()[:MAX_EXPRESSION_CHARS]
        try:
            lines.append(f"{shown} = {format_value(calculate(expression))}")
        except CalculatorError as error:
            lines.append(f"{shown}: error: {error}")
    if len(calls) > MAX_CALLS:
        lines.append(f"error: only the first {MAX_CALLS} \\calc{{...}} expressions are evaluated")
    return "\n".join(lines)


def python_action(text: str) -> str:
    """The python runner's action on what it reads: what its last ```python block prints in the code sandbox, cut at
    MAX_OUTPUT_CHARS, and "error: <outcome>: <why>" if it fails. Raises only sandbox.SandboxError (no sandbox here)."""
    blocks = PYTHON_BLOCK.findall(text)
    if not blocks:
        return "error: no ```python block to run"
    report = sandbox.run_tests(blocks[-1], [], PYTHON_LIMITS)
    output = report.output[:MAX_OUTPUT_CHARS].rstrip("\n")
    if len(report.output) > MAX_OUTPUT_CHARS:
        output += f"\n[output cut at {MAX_OUTPUT_CHARS} characters]"
    if report.outcome != sandbox.PASSED:
        output = (output + "\n" if output else "") + f"error: {report.outcome}: {report.detail[:200]}"
    return output or NO_OUTPUT


TOOLS = {"calculator": calculator_action, "python": python_action}  # name → policy: the text read → its action


def tool_value(tool: str, action: str) -> str | None:
    """The last value a tool's action gave (what a graded answer may take from it), or None: the
    calculator's last "EXPR = VALUE"; the last line a program printed that ran without error."""
    lines = [line.strip() for line in action.splitlines() if line.strip() and "error:" not in line]
    if tool == "calculator":
        lines = [line.rpartition(" = ")[2] for line in lines if " = " in line]
    elif "error:" in action or action == NO_OUTPUT:
        return None
    return lines[-1] if lines else None


def tool_action(tool: str, text: str) -> str:
    return TOOLS[tool](text)
