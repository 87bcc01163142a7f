"""Matched and negative controls for the engine verdicts of docs/statistical-tests.md (issue 41, items 1 and 3).

A verdict on an engine is signed only beside its controls, all at one setting: the same sampling, prompts, ``n``,
batch size, positions, seed, alpha and ``min_count``; only what the row is about differs.

  ``shipped``  the engine as its users get it (vLLM: the project's plugin not loaded).
  ``fixes``    vLLM with the project's plugin loaded without a rule (its CPU fix of the per-token sampling
               parameters; docs/vllm.md limitation 1), vLLM's own rejection sampling otherwise.
  ``planted``  the negative control: the fixed engine (vLLM) or the engine as shipped (transformers) with a planted
               bug of a stated size, ``tests/planted.py``'s ``tempered_target``: the rejection step verifies against
               the verifier's rows at temperature ``T / c`` (``PLANT_C``); the bonus row and steps without drafts stay
               right. Its size: ``TV(q, q_c)`` at every prefix of the first position speculation can change that
               the check tested, computed here from the verifier itself (``planted_tv``); exact where the step
               drafts (EAGLE-3 and transformers always do; n-gram lookup only where the context has a match, so
               for n-gram it is an upper bound).

Each run writes ``benchmarks/results/check_engine/<engine>_<spec>_<role>_<sampling>.json`` in ``cactus-theory
check-engine --json``'s format plus ``control`` (setting, role, the planted bug) and, for ``planted``, ``planted_tv``.
The side without speculation is the same engine call in the ``fixes`` and ``planted`` rows (same seed, so its
decodes are cached once under ``--cache`` and reused: each row's test is valid on its own; the rows share that
side). ``benchmarks/check_engine_table.py`` pairs the rows by setting.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python benchmarks/engine_controls.py \\
        --setting vllm_ngram_temperature --role fixes       # then --role planted (reuses the plain side)
    PYTHONPATH=$PWD OMP_NUM_THREADS=1 .venv/bin/python benchmarks/engine_controls.py --setting transformers_paper \\
        --role shipped                                      # then --role planted

vLLM's CPU build spawns its engine processes (``VLLM_WORKER_MULTIPROC_METHOD=spawn``), and a spawned process
imports the parent's main script as ``__mp_main__``: the module-level ``_plant_here`` below installs the vLLM bug in
every such process when ``PLANT_ENV`` is set (by ``--role planted``), and the run is refused unless the process
that verifies drafts wrote its pid to the marker file.
"""

from __future__ import annotations

import os

PLANT_ENV, MARKER_ENV = "CACTUS_THEORY_PLANTED_C", "CACTUS_THEORY_PLANTED_MARKER"


def _plant_here() -> None:
    """In a process vLLM spawned from this script (``__mp_main__``), plant the bug when the parent asked for it."""
    if __name__ != "__mp_main__" or not os.environ.get(PLANT_ENV):
        return
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tests.planted import plant_vllm_tempered_target

    plant_vllm_tempered_target(float(os.environ[PLANT_ENV]), os.environ.get(MARKER_ENV))


_plant_here()

# the rest only in the process that runs the check
import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "check_engine"
STARVED_TIMEOUTS = ("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "VLLM_ENGINE_READY_TIMEOUT_S")  # vLLM's: 300 s, 600 s
PLANT_C = 2.0  # the planted target at temperature T / 2 (0.3 for the paper's 0.6)

_COMMON = ["--threads", "1", "--max-new-tokens", "16", "--seed", "0", "--alpha", "0.001", "--min-count", "20"]
_SAMPLING = {"temperature": ["--temperature", "0.6", "--top-k", "0", "--top-p", "1"],
             "paper": ["--temperature", "0.6", "--top-k", "20", "--top-p", "0.95"]}
# the committed verdicts' settings (n and batch as those runs used; the n of each from its power: docs)
SETTINGS = {
    "vllm_ngram_temperature": ["--engine", "vllm", "--spec", "ngram", "--n", "500", "--batch-size", "64"],
    "vllm_ngram_paper": ["--engine", "vllm", "--spec", "ngram", "--n", "500", "--batch-size", "64"],
    "vllm_eagle3_temperature": ["--engine", "vllm", "--spec", "eagle3", "--n", "300", "--batch-size", "64"],
    "vllm_eagle3_paper": ["--engine", "vllm", "--spec", "eagle3", "--n", "300", "--batch-size", "64"],
    "transformers_paper": ["--engine", "transformers", "--assistant-layers", "4", "--n", "500"],
}
ROLES = {"vllm": ("shipped", "fixes", "planted"), "transformers": ("shipped", "planted")}
FIRST_SPECULATIVE = {"vllm": 1, "transformers": 0, "loop": 1}  # docs/statistical-tests.md: why


def argv_of(setting: str, role: str, n: int | None = None, quick: bool = False) -> list[str]:
    """check-engine's arguments for ``setting`` in ``role`` (``n`` overrides the setting's decodes per prompt;
    ``quick``: check-engine's ``--quick`` smoke test of the wiring instead of the setting's n and length)."""
    if setting not in SETTINGS:
        raise ValueError(f"--setting must be one of {sorted(SETTINGS)}, got {setting!r}")
    base = list(SETTINGS[setting])
    engine = base[1]
    if role not in ROLES[engine]:
        raise ValueError(f"--role for {engine} must be one of {ROLES[engine]}, got {role!r}")
    if n is not None:
        base[base.index("--n") + 1] = str(n)
    plugin = ["--vllm-plugin", "none" if role == "shipped" else "fixes"] if engine == "vllm" else []
    argv = base + plugin + _SAMPLING[setting.rsplit("_", 1)[1]] + _COMMON
    if quick:
        i, j = argv.index("--n"), argv.index("--max-new-tokens")
        argv = [a for k, a in enumerate(argv) if k not in (i, i + 1, j, j + 1)] + ["--quick"]
    return argv


def out_name(setting: str, role: str) -> str:
    engine, *spec, sampling = setting.split("_")
    return "_".join([engine, *spec, role, sampling]) + ".json"


def _cached(generate, path: Path, key: dict):
    """``generate`` whose decodes are kept in ``path`` (gzip JSON) with ``key`` and reused when both match."""
    def wrapped(prompts, n, seed):
        want = key | {"n": n, "seed": seed}
        if path.exists():
            data = json.loads(gzip.decompress(path.read_bytes()))
            if data["key"] == want:
                print(f"reusing {path.name}", file=sys.stderr, flush=True)
                return data["decodes"]
        t0 = time.perf_counter()
        out = [[int(t) for t in d] for d in generate(prompts, n, seed)]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(gzip.compress(json.dumps({"key": want, "decodes": out,
                                                  "seconds": round(time.perf_counter() - t0, 1)}).encode()))
        tmp.replace(path)
        return out
    return wrapped


def _side_key(args, side: str, role: str) -> dict:
    keep = ("engine", "spec", "draft", "draft_sampling", "verifier", "dtype", "num_drafts", "max_new_tokens",
            "temperature", "top_k", "top_p", "batch_size", "no_chat", "assistant_layers", "threads", "prompts")
    key = {k: getattr(args, k, None) for k in keep} | {"side": side}
    if side == "spec":
        key |= {"vllm_plugin": args.vllm_plugin, "planted": PLANT_C if role == "planted" else None}
    return key


def tested_prefixes(decodes_a, decodes_b, prompts: int, n: int, t: int, min_count: int) -> list[tuple]:
    """(prompt index, the t generated tokens) of every prefix of position t seen min_count times on both sides."""
    def count(decodes):
        c: dict = {}
        for i, d in enumerate(decodes):
            if len(d) >= t:
                k = (i // n, tuple(d[:t]))
                c[k] = c.get(k, 0) + 1
        return c
    ca, cb = count(decodes_a), count(decodes_b)
    return sorted(k for k in ca if ca[k] >= min_count and cb.get(k, 0) >= min_count)


def planted_tv(args, prefixes: list[tuple], c: float) -> list[dict]:
    """``TV(q, q_c)`` at each prefix: ``q`` the verifier's next-token row after the run's sampling transforms
    (transformers, float32, the same chat template), ``q_c = tempered_law(q, c)``."""
    import torch

    from cactus_theory.core.transforms import sampling_probs
    from cactus_theory.lm.data import encode_prompts
    from cactus_theory.lm.pair import load_model
    from tests.planted import tempered_law

    model, tok = load_model(args.verifier, torch.float32)
    ids = encode_prompts(tok, list(args.prompts), chat=not args.no_chat)
    rows = []
    for i, toks in prefixes:
        with torch.inference_mode():
            logits = model(torch.tensor([ids[i] + list(toks)])).logits[0, -1].float()
        q = sampling_probs(logits[None], args.temperature, args.top_k, args.top_p)[0]
        tv = 0.5 * float((q - tempered_law(q[None], c)[0]).abs().sum())
        rows.append({"prompt": i, "tokens": list(toks), "tv": round(tv, 4)})
    return rows


def run(setting: str, role: str, cache: Path, n: int | None = None, out_dir: Path = OUT, quick: bool = False) -> dict:
    from cactus_theory.cli import check_engine as ce
    from cactus_theory.integrations.engines import ENGINES
    from cactus_theory.theory.check_generation import check_generation

    parser = argparse.ArgumentParser()
    ce.configure(parser)
    args = parser.parse_args(argv_of(setting, role, n, quick))
    ce.check(args)
    engine = args.engine
    for var in STARVED_TIMEOUTS:  # a run at low CPU priority on a shared machine: a step may take minutes
        os.environ.setdefault(var, "86400")
    marker = None
    if role == "planted" and engine == "vllm":  # read by _plant_here in the processes vLLM spawns
        marker = cache / f"{setting}{'_quick' if quick else ''}_planted.pids"
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.unlink(missing_ok=True)
        os.environ[PLANT_ENV], os.environ[MARKER_ENV] = str(PLANT_C), str(marker)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    models = ce._load(args)
    eng = ENGINES[engine](ce.options(args), **models)
    tag = f"{setting}{'_quick' if quick else ''}"
    gen_a = _cached(eng.generate_a, cache / f"{tag}_{role}_spec.json.gz", _side_key(args, "spec", role))
    gen_b = _cached(eng.generate_b, cache / f"{tag}_{'shipped' if role == 'shipped' else 'fixes'}_plain.json.gz",
                    _side_key(args, "plain", "fixes" if role != "shipped" else role))
    if role == "planted" and engine == "transformers":
        from tests.planted import transformers_tempered_target

        spec = gen_a

        def gen_a(prompts, n_, seed):
            with transformers_tempered_target(PLANT_C):
                return spec(prompts, n_, seed)
    decodes: dict = {}

    def keep(g, side):
        def f(prompts, n_, seed):
            decodes[side] = g(prompts, n_, seed)
            if side == "a" and marker is not None and not (marker.exists() and marker.read_text().strip()):
                raise RuntimeError(f"the planted bug did not reach the engine process that verifies drafts (no pid in "
                                   f"{marker}): not a negative control")
            return decodes[side]
        return f

    t0 = time.perf_counter()
    try:
        res = check_generation(keep(gen_a, "a"), keep(gen_b, "b"), args.prompts, n=args.n, positions=args.positions,
                               alpha=args.alpha, power=args.power, seed=args.seed, min_count=args.min_count,
                               names=(eng.label_a + (f", planted: target at T / {PLANT_C:g}" if role == "planted"
                                                     else ""), eng.label_b))
    finally:
        if eng.close is not None:
            eng.close()
    out = ce.result_json(args, eng, res, time.perf_counter() - t0)
    out["config"].pop("json", None)
    planted = None
    if role == "planted":
        planted = {"bug": "the rejection step verifies the drafts against the verifier's rows at temperature T / c "
                          "(its logits after the sampling transforms times c); the bonus row and steps without drafts "
                          "right (tests/planted.py: tempered_target)", "c": PLANT_C,
                   "temperature": round(args.temperature / PLANT_C, 4)}
    first = FIRST_SPECULATIVE[engine]
    out["control"] = {"setting": setting, "role": role, "planted": planted, "first_speculative_position": first,
                      "script": "benchmarks/engine_controls.py"}
    if role == "planted":
        pre = tested_prefixes(decodes["a"], decodes["b"], len(args.prompts), args.n, first, args.min_count)
        out["planted_tv"] = {"position": first, "prefixes": planted_tv(args, pre, PLANT_C),
                             "exact": args.spec != "ngram"}
        if marker is not None:
            out["control"]["planted_pids"] = marker.read_text().split()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / out_name(setting, role)
    path.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    print(res.table())
    print(f"wrote {path}", file=sys.stderr)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setting", required=True, choices=sorted(SETTINGS))
    ap.add_argument("--role", required=True, choices=("shipped", "fixes", "planted"))
    ap.add_argument("--n", type=int, default=None, help="decodes per prompt per side (default: the setting's)")
    ap.add_argument("--cache", default=str(ROOT / "build" / "engine_controls"), help="decodes kept here (gzip JSON)")
    ap.add_argument("--out", default=str(OUT), help="the result's folder (default: the committed results')")
    ap.add_argument("--quick", action="store_true", help="check-engine's --quick smoke test of the wiring (not a "
                                                         "verdict: write it elsewhere with --out)")
    a = ap.parse_args(argv)
    try:
        argv_of(a.setting, a.role, a.n, a.quick)
        if a.quick and Path(a.out).resolve() == OUT.resolve():
            raise ValueError("--quick is not a verdict: give --out outside benchmarks/results/check_engine")
    except ValueError as e:
        print(f"engine_controls: {e}", file=sys.stderr)
        return 2
    run(a.setting, a.role, Path(a.cache), a.n, Path(a.out), a.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
