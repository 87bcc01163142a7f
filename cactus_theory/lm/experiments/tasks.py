"""Offline, seeded reasoning tasks with exact-match scoring, for ``cactus-theory eval``.

GSM8K and GPQA are not available offline; these generators make small arithmetic word problems in
the same shape (a question in words, some reasoning, one integer answer) at a difficulty where the
embedded verifier (SmolLM2-135M-Instruct) is right often enough, and wrong often enough, for a rule's
gain or loss in accuracy to show. Each problem is a user turn (the chat template is applied by the
decoding loop) ending with ``INSTRUCTION``, which asks for a short explanation first so that the
answer comes after ~20 or more generated tokens and the acceptance rule shapes it ("think step by
step" made this verifier ramble past the answer: it scored lower on every task measured).

Scoring (``extract_answer``, ``score``): the integer after the last "answer" in the response
("Answer: 12", "The answer is 12.", "the final answer is $12"), else the integer after the last
"=" ("5 + 4 = 9."), else the response's last integer (GSM8K's "flexible extract"); exact match with
the problem's integer answer. ``strict_answer`` (the "answer" form only) is reported beside it.

Task names (``TASKS``): ``add`` (one addition in words, operands 2-30), ``add_wide`` (the same,
operands 2-40: 1,521 operand pairs, enough for 1,000 distinct questions), ``add1`` (the same with
one-digit operands), ``arith`` (``a + b`` or ``a - b`` written as an expression, one-digit operands), ``lookup`` (three people's counts given, one asked for), ``sub`` (one subtraction in words), ``add_sub``
(two steps: add then take away), ``sum3`` (three small quantities added), ``compare`` (the larger
of two numbers), ``count`` (items in a written list). ``DEFAULT_TASK`` is the one chosen by measured
verifier accuracy (see the module docstring of ``eval.py``).

Distinct questions (``distinct_problems``): the replicated eval's unit is a question, so its problems are
drawn without repeats: generator draws whose content (``content_key``: the numbers of an arithmetic
question, else the question text) was already drawn are skipped. ``DISTINCT`` states how many distinct
contents each task can yield (``arith`` has 100: too few for a 1,000-question eval).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Problem", "TASKS", "DEFAULT_TASK", "INSTRUCTION", "DISTINCT", "make_problems", "distinct_problems",
           "content_key", "extract_answer", "strict_answer", "score"]

INSTRUCTION = "Explain briefly, then give the final answer as a number."


@dataclass(frozen=True)
class Problem:
    """One problem: ``id`` (task, seed, index), ``question`` (the user turn, instruction included),
    ``answer`` (the exact integer answer)."""

    id: str
    question: str
    answer: int


_NAMES = ["Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jack", "Kira", "Liam",
          "Maya", "Noah", "Olga", "Pablo", "Rosa", "Sam", "Tara", "Victor"]
_ITEMS = ["apples", "stickers", "books", "marbles", "cookies", "pencils", "stamps", "shells", "cards", "balloons",
          "coins", "flowers"]
_WORDS = ["cat", "dog", "tree", "house", "river", "chair", "lamp", "cloud", "apple", "stone", "bird", "boat",
          "door", "cup", "star", "shoe"]


def _add(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 30), rng.randint(2, 30)
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    return f"{name} has {a} {item}. {name} gets {b} more {item}. How many {item} does {name} have now?", a + b


def _add1(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    return f"{name} has {a} {item}. {name} gets {b} more {item}. How many {item} does {name} have now?", a + b


def _add_wide(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    return f"{name} has {a} {item}. {name} gets {b} more {item}. How many {item} does {name} have now?", a + b


def _lookup(rng: random.Random) -> tuple[str, int]:
    n1, n2, n3 = rng.sample(_NAMES, 3)
    a, b, c = rng.sample(range(3, 60), 3)
    item = rng.choice(_ITEMS)
    who, ans = rng.choice([(n1, a), (n2, b), (n3, c)])
    return (f"{n1} has {a} {item}, {n2} has {b} {item} and {n3} has {c} {item}. "
            f"How many {item} does {who} have?", ans)


def _arith(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    if rng.random() < 0.5:
        return f"What is {a} + {b}?", a + b
    a, b = max(a, b), min(a, b)
    return f"What is {a} - {b}?", a - b


def _sub(rng: random.Random) -> tuple[str, int]:
    a = rng.randint(10, 40)
    b = rng.randint(2, a - 2)
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    return f"{name} has {a} {item}. {name} gives away {b} {item}. How many {item} does {name} have left?", a - b


def _add_sub(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(5, 20), rng.randint(2, 15)
    c = rng.randint(1, a + b - 1)
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    return (f"{name} has {a} {item}. {name} buys {b} more {item} and then gives {c} {item} to a friend. "
            f"How many {item} does {name} have now?", a + b - c)


def _sum3(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(1, 9), rng.randint(1, 9), rng.randint(1, 9)
    n1, n2, n3 = rng.sample(_NAMES, 3)
    item = rng.choice(_ITEMS)
    return (f"{n1} has {a} {item}, {n2} has {b} {item} and {n3} has {c} {item}. "
            f"How many {item} do they have together?", a + b + c)


def _compare(rng: random.Random) -> tuple[str, int]:
    a, b = rng.sample(range(10, 100), 2)
    return f"Which number is larger, {a} or {b}?", max(a, b)


def _count(rng: random.Random) -> tuple[str, int]:
    n = rng.randint(3, 9)
    words = [rng.choice(_WORDS) for _ in range(n)]
    return f"How many words are in this list: {', '.join(words)}?", n


TASKS: dict[str, Callable[[random.Random], tuple[str, int]]] = {
    "add": _add, "add_wide": _add_wide, "add1": _add1, "arith": _arith, "lookup": _lookup, "sub": _sub, "add_sub": _add_sub, "sum3": _sum3, "compare": _compare, "count": _count,
}
DEFAULT_TASK = "arith"
# tasks whose question is defined by its numbers alone (the names and items are decoration): their distinct
# questions are distinct operand tuples (``content_key``)
_NUMERIC_CONTENT = {"add", "add_wide", "add1", "arith", "sub", "add_sub", "sum3", "compare"}
# how many distinct contents each task can yield (operand tuples, or texts; lookup / count: more than any eval asks)
DISTINCT = {"add": 29 * 29, "add_wide": 39 * 39, "add1": 8 * 8, "arith": 100, "sub": sum(a - 3 for a in range(10, 41)),
            "add_sub": None, "sum3": 9 ** 3, "compare": 90 * 89, "lookup": None, "count": None}


def make_problems(task: str = DEFAULT_TASK, n: int = 300, seed: int = 0) -> list[Problem]:
    """``n`` problems of ``task``, the same for the same ``(task, n, seed)``; the first ``m`` of a
    longer list are the ``m`` of a shorter one (problem ``i`` depends only on ``(task, seed, i)``)."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {sorted(TASKS)}, got {task!r}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be an integer >= 1 (problems), got {n!r}")
    out = []
    for i in range(n):
        text, answer = TASKS[task](random.Random(f"{task}/{seed}/{i}"))
        out.append(Problem(f"{task}/{seed}/{i}", f"{text} {INSTRUCTION}", int(answer)))
    return out


def content_key(task: str, question: str) -> str:
    """What makes two questions of ``task`` the same question: the numbers it states, in order (plus the
    operator for ``arith``), for the arithmetic tasks whose names and items are decoration; else the text."""
    if task in _NUMERIC_CONTENT:
        body = question.split("?")[0]
        ops = re.findall(r"[+-] ", body) if task == "arith" else []
        return " ".join(re.findall(r"\d+", body) + ops)
    return question


def distinct_problems(task: str, n: int, seed: int = 0) -> list[Problem]:
    """``n`` problems of ``task`` with ``n`` distinct contents (``content_key``): generator draws ``i = 0, 1,
    ...`` (problem ``i`` as in ``make_problems``), a draw whose content came earlier skipped. Prefix-stable
    (the first ``m`` of a longer list are the shorter list); ids keep the draw index. ``ValueError`` when the
    task cannot yield ``n`` distinct questions (``DISTINCT``), before any draw."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {sorted(TASKS)}, got {task!r}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be an integer >= 1 (problems), got {n!r}")
    cap = DISTINCT.get(task)
    if cap is not None and n > cap:
        raise ValueError(f"task {task!r} has only {cap} distinct questions, asked for n = {n}")
    out, seen, i = [], set(), 0
    limit = 50 * n + 10_000
    while len(out) < n:
        if i >= limit:
            raise ValueError(f"task {task!r}: only {len(out)} distinct questions in {limit} draws, asked for n = {n}")
        text, answer = TASKS[task](random.Random(f"{task}/{seed}/{i}"))
        key = content_key(task, text)
        if key not in seen:
            seen.add(key)
            out.append(Problem(f"{task}/{seed}/{i}", f"{text} {INSTRUCTION}", int(answer)))
        i += 1
    return out


_INT = r"-?\d[\d,]*"
_AFTER_ANSWER = re.compile(rf"answer[\s:*]*(?:is|=)?[\s:*$]*({_INT})", re.IGNORECASE)
_AFTER_EQUALS = re.compile(rf"=\s*\$?\s*({_INT})")


def _int(s: str) -> int | None:
    s = s.replace(",", "")
    try:
        return int(s)
    except ValueError:
        return None


def strict_answer(text: str) -> int | None:
    """The integer right after the last "answer" in ``text`` ("Answer: 12", "The answer is 12.",
    "the final answer is $12"), or None: GSM8K's "strict match" in spirit."""
    found = _AFTER_ANSWER.findall(text)
    return _int(found[-1]) if found else None


def extract_answer(text: str) -> int | None:
    """``strict_answer(text)`` if there is one; else the integer after the last "=" ("5 + 4 = 9.");
    else the last integer in ``text`` (GSM8K's "flexible extract"); None if ``text`` has no integer."""
    for pattern in (_AFTER_ANSWER, _AFTER_EQUALS):
        found = pattern.findall(text)
        if found:
            return _int(found[-1])
    ints = re.findall(_INT, text)
    return _int(ints[-1]) if ints else None


def score(text: str, problem: Problem) -> bool:
    """Exact match of ``extract_answer(text)`` with ``problem.answer``."""
    return extract_answer(text) == problem.answer
