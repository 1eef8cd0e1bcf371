"""Tools: agents with a fixed policy. This file holds two: the calculator and the python runner.

Paper: MARFT (Liao et al., arXiv 2504.16129), the Flex-POMDP: every agent j acts on what the
dependency function D gives it, a^j_t ~ π^j(· | ô^j_t). A tool is an agent whose π^j is fixed and
deterministic: its action is a function of what it reads, it has no adapter, takes no update and
produces no PPO sample; what it says reaches the learning agents (and the critic) only through
their observations. In a profile a tool is an agent entry that names its tool instead of a prompt,
`{"role": "calculator", "tool": "calculator"}`: it acts in σ order on the actions D gives it
(rollout.py; under an orchestrator, when called, on every earlier action of the step), takes no
position in the step's tables (the advantages, GAE chain, credit and M run over the learning
agents alone) and no adapter.

    calculator      a^j_t = the value of every `\\calc{EXPR}` in the actions it reads, exact on
                    integers and fractions ("964*59 = 56876"); an expression it cannot evaluate
                    gives an error text as its output, never an exception
    python          a^j_t = what the last ```python block in the actions it reads prints, run in
                    the code sandbox (envs/sandbox.py), cut at MAX_OUTPUT_CHARS; a program that
                    crashes, times out or does not parse adds an error line, never an exception

The calculator parses with Python's `ast` and evaluates the few node types of arithmetic itself:
no `eval`, no names, no calls, no attributes; bounded input length, expression size, exponent and
result size, so a policy under RL pressure cannot make it hang or exhaust memory.
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
LATEX_OPERATOR_SIGNS = {"times": "*", "cdot": "*", "div": "/"}  # \calc{613\times47}: a model trained on LaTeX writes it
LATEX_OPERATORS = re.compile(r"\\(times|cdot|div)(?![a-zA-Z])")


class CalculatorError(ValueError):
    """An expression the calculator will not evaluate; its message is the tool's output."""


def calculate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression: integers, decimals, + − × ÷ (also LaTeX's
    \\times, \\cdot, \\div), //, %, ** with an integer exponent, parentheses, unary ±. Raises
    CalculatorError naming what is wrong."""
    text = LATEX_OPERATORS.sub(lambda m: LATEX_OPERATOR_SIGNS[m.group(1)], expression).strip()
    text = text.replace("×", "*").replace("÷", "/").replace("^", "**")
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


_OPERATORS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}


def _value(node: ast.AST, source: str) -> Fraction:
    """Evaluate one node of the parse tree of `source` (recursive; the node count bounds the depth)."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _literal(node, source)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        operand = _value(node.operand, source)
        return operand if isinstance(node.op, ast.UAdd) else -operand
    if isinstance(node, ast.BinOp):
        left, right = _value(node.left, source), _value(node.right, source)
        if type(node.op) in _OPERATORS:
            return _bounded(_OPERATORS[type(node.op)](left, right))
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            if right == 0:
                raise CalculatorError("division by zero")
            if isinstance(node.op, ast.Div):
                return _bounded(left / right)
            return _bounded(Fraction(left // right) if isinstance(node.op, ast.FloorDiv) else left % right)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(right) > MAX_EXPONENT:
                raise CalculatorError(f"exponents must be whole numbers up to {MAX_EXPONENT}")
            if left == 0 and right < 0:
                raise CalculatorError("division by zero")
            if left.numerator.bit_length() * abs(int(right)) > 4 * MAX_DIGITS or \
                    left.denominator.bit_length() * abs(int(right)) > 4 * MAX_DIGITS:
                raise CalculatorError(f"result of more than {MAX_DIGITS} digits")
            return _bounded(left ** int(right))
    raise CalculatorError(f"only numbers and + - * / // % ** ( ) are allowed, not {type(node).__name__}")


def _literal(node: ast.Constant, source: str) -> Fraction:
    """A number as written: an integer exactly, a decimal from its text (0.1 is 1/10, not the float
    nearest it; 1e-400 is not 0), its exponent bounded before the value is built."""
    if isinstance(node.value, int):
        return _bounded(Fraction(node.value))
    written = (ast.get_source_segment(source, node) or "").replace("_", "").lower()
    exponent = written.partition("e")[2]
    if exponent and (not exponent.lstrip("+-").isdigit() or int(exponent) > MAX_DIGITS or int(exponent) < -MAX_DIGITS):
        raise CalculatorError(f"result of more than {MAX_DIGITS} digits")
    try:
        value = Fraction(written)
    except ValueError:
        raise CalculatorError(f"not a number: {written!r}") from None
    return _bounded(value)


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


# ---------------------------------------------------------------------------------------------
# The python runner: a program block run in the code sandbox, its printed output as the action
# ---------------------------------------------------------------------------------------------

PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)
PYTHON_LIMITS = sandbox.Limits(seconds_per_test=2.0, seconds_per_program=5.0)
MAX_OUTPUT_CHARS = 1000  # printed output kept in the action (what later agents read)
NO_OUTPUT = "(the program printed nothing)"


def python_action(text: str) -> str:
    """The python runner's action on what it reads: the last ```python block run in the code sandbox
    (envs/sandbox.py: no network, no files outside its own, bounded time and memory), its printed
    output cut at MAX_OUTPUT_CHARS; a program that fails adds "error: <outcome>: <why>". A text
    without a block gets an error line. Raises only sandbox.SandboxError, when the machine cannot
    run the sandbox at all (the run checks that at its start)."""
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


TOOLS = {"calculator": calculator_action, "python": python_action}  # tool name → its policy: the text it reads → its action


def tool_value(tool: str, action: str) -> str | None:
    """The last value a tool's action gave (what a graded answer may take from it), None when it
    gave none: the calculator's last "EXPR = VALUE"; the python runner's last printed line of a
    program that ran without error."""
    lines = [line.strip() for line in action.splitlines() if line.strip() and "error:" not in line]
    if tool == "calculator":
        values = [line.rpartition(" = ")[2] for line in lines if " = " in line]
        return values[-1] if values else None
    if "error:" in action or action == NO_OUTPUT or not lines:
        return None
    return lines[-1]


def tool_action(tool: str, text: str) -> str:
    """The action of the tool named `tool` (a key of TOOLS) on the text it reads."""
    return TOOLS[tool](text)
