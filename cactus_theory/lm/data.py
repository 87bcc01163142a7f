"""Offline text: Python's standard library source (training text for the draft) and a fixed,
hand-written prompt set in three styles (GSM8K-style arithmetic word problems, HumanEval-style
Python function stubs, short prose requests) used for held-out evaluation and the benchmark.
"""

from __future__ import annotations

import os
import random
import sysconfig
from collections.abc import Iterator

__all__ = ["MATH_PROMPTS", "CODE_PROMPTS", "PROSE_PROMPTS", "prompt_set", "stdlib_files", "stdlib_texts",
           "encode_prompts"]

MATH_PROMPTS = [
    "A baker makes 24 muffins each morning and sells them in boxes of 6. On Saturday she makes twice as many. How many boxes does she fill on Saturday?",
    "Tom has 3 times as many marbles as Lisa. Together they have 48 marbles. How many marbles does Tom have?",
    "A train travels 180 km in 2 hours and then 150 km in 3 hours. What is its average speed for the whole trip?",
    "A school buys 15 packs of pencils with 12 pencils in each pack. It gives 4 pencils to each of 40 students. How many pencils are left?",
    "Maria earns $18 per hour and works 7 hours a day for 5 days. She spends a quarter of her earnings on rent. How much does she keep?",
    "A garden is 12 meters long and 8 meters wide. A path 1 meter wide runs around the outside. What is the area of the path?",
    "Sam reads 25 pages a day. His book has 410 pages and he has already read 135. How many more days does he need to finish it?",
    "A shop sells apples at 3 for $2. How much do 27 apples cost, and how much change is left from $20?",
]

CODE_PROMPTS = [
    'def is_palindrome(text: str) -> bool:\n    """Return True if text reads the same forwards and backwards, ignoring case and spaces."""\n',
    'def running_max(numbers: list[int]) -> list[int]:\n    """Return the list of maxima seen so far at each position of numbers."""\n',
    'def count_vowels(word: str) -> int:\n    """Count the vowels (a, e, i, o, u) in word."""\n',
    'def flatten(nested: list) -> list:\n    """Flatten an arbitrarily nested list of lists into one flat list."""\n',
    'def fizzbuzz(n: int) -> list[str]:\n    """Return the FizzBuzz strings for the numbers 1 to n."""\n',
    'def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n    """Merge two sorted lists into one sorted list in linear time."""\n',
    'def word_frequencies(text: str) -> dict[str, int]:\n    """Return how often each lower-cased word occurs in text."""\n',
    'def gcd(a: int, b: int) -> int:\n    """Return the greatest common divisor of a and b using Euclid\'s algorithm."""\n',
]

PROSE_PROMPTS = [
    "Write a short paragraph describing a quiet morning in a small fishing village.",
    "Explain in simple words why the sky is blue.",
    "Give three tips for someone who is learning to cook at home.",
    "Describe the water cycle for a ten-year-old.",
    "Write a polite email asking a colleague to review a report by Friday.",
    "Summarise the main causes of the French Revolution in a few sentences.",
    "What are the benefits of regular exercise? Answer in a short paragraph.",
    "Tell a short story about a robot who learns to paint.",
]


def prompt_set(per_style: int | None = None) -> list[str]:
    """The fixed evaluation prompts, interleaved by style (math, code, prose, math, ...)."""
    n = len(MATH_PROMPTS) if per_style is None else per_style
    if not 1 <= n <= len(MATH_PROMPTS):
        raise ValueError(f"per_style must be in [1, {len(MATH_PROMPTS)}], got {per_style!r}")
    out = []
    for i in range(n):
        out += [MATH_PROMPTS[i], CODE_PROMPTS[i], PROSE_PROMPTS[i]]
    return out


def stdlib_files() -> list[str]:
    """Sorted paths of the ``.py`` files of this interpreter's standard library (no tests, no site-packages)."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "test", "tests", "idle_test", "__pycache__"))
        out += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    if not out:
        raise ValueError(f"no Python source found under {root}")
    return out


def stdlib_texts(seed: int = 0, max_chars: int = 20_000) -> Iterator[str]:
    """Standard-library source files in a seeded random order, each cut to ``max_chars``."""
    files = stdlib_files()
    random.Random(seed).shuffle(files)
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(max_chars)
        if len(text) > 200:
            yield text


def encode_prompts(tokenizer, prompts: list[str], chat: bool = True) -> list[list[int]]:
    """Token ids of each prompt; ``chat=True`` wraps it as a user turn with the tokenizer's chat template."""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError(f"prompts must be a non-empty list of strings, got {prompts!r}")
    out = []
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p.strip():
            raise ValueError(f"prompts[{i}] must be a non-empty string, got {p!r}")
        if chat and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
        else:
            ids = tokenizer(p)["input_ids"]
        out.append([int(t) for t in ids])
    return out


_TOPICS = ["the moon", "volcanoes", "bees", "the printing press", "rainforests", "electricity", "the Roman Empire",
           "chess", "coffee", "earthquakes", "the internet", "penguins", "solar panels", "the human heart",
           "glaciers", "jazz music", "bread baking", "the ocean tides", "airplanes", "vaccines", "recycling",
           "the Great Wall of China", "photosynthesis", "black holes", "democracy", "honey", "trains", "deserts",
           "friendship", "libraries", "batteries", "mountains"]
_TASKS = ["Explain {t} to a curious child.", "Write a short paragraph about {t}.", "Give three facts about {t}.",
          "Why is {t} important?", "Write a short poem about {t}.", "Describe the history of {t} briefly."]
_CODE_TASKS = ["Write a Python function that {f}.", "How do I {f} in Python? Show code.",
               "Write a Python function that {f}, with a docstring and an example."]
_FUNCS = ["sorts a list of words by length", "counts the lines in a file", "checks whether a year is a leap year",
          "returns the n-th Fibonacci number", "removes duplicates from a list while keeping order",
          "converts Celsius to Fahrenheit", "finds the largest element of a list", "reverses the words in a sentence",
          "computes the average of a list of numbers", "checks whether a string is a valid email address",
          "reads a CSV file into a list of dictionaries", "computes the factorial of n"]
_NAMES = ["Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hugo"]
_ITEMS = ["apples", "stickers", "books", "marbles", "cookies", "pencils"]


def training_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` seeded, templated user requests (prose, code, and GSM8K-style arithmetic word problems)
    for the draft's training transcripts; disjoint from the evaluation ``prompt_set``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            out.append(rng.choice(_TASKS).format(t=rng.choice(_TOPICS)))
        elif kind == 1:
            out.append(rng.choice(_CODE_TASKS).format(f=rng.choice(_FUNCS)))
        else:
            a, b, c = rng.randint(3, 40), rng.randint(2, 9), rng.randint(2, 12)
            name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
            out.append(f"{name} has {a} {item}. {name} buys {b} packs with {c} {item} in each pack and then gives "
                       f"away {rng.randint(1, a)} {item}. How many {item} does {name} have now? Explain step by step.")
    return out
