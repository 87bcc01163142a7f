"""Real decoding runs shared by figure e and table f (and the LM-derived pairs of figure c).

Every run is one (method, prompt style): ``lm.speculative_generate`` with the rule (or
``lm.autoregressive_generate`` for the verifier alone) on the style's prompts, sampling as in the
paper (temperature 0.6, top-k 20, top-p 0.95). Each prompt is decoded alone (batch 1), so every
counter (accepted drafts, steps, tokens, seconds, KL, NLL) is stored per prompt and the report's
intervals can bootstrap over prompts. The baselines are the references' variants: TAS with vLLM's
entropy (``entropy_eps=1e-5``), top-k with the authors' recovery (``recovery="topk"``). Each run is
cached as its own piece, so an interrupted job resumes where it stopped. Defaults: the embedded pair (SmolLM2-135M-Instruct and
the project's draft, ``cactus-theory build-draft``); ``--verifier`` / ``--draft`` take any pair.
"""

from __future__ import annotations

import math
import os

import numpy as np
from tqdm import tqdm

from cactus_theory.core.sampling import SAMPLING
from cactus_theory.lm.metrics import al_of
from cactus_theory.util.atomic import atomic_path

from .common import Ctx, Parts

NAME = "lm_runs"
STYLES = ("math", "code", "prose")
PAIR_SUPPORT = 40  # union support of two top-20 laws


def methods(fast: bool) -> dict[str, dict]:
    """Method name -> {rule, params, k}; ``rule=None`` is the verifier alone."""
    m = {"verifier alone": {"rule": None, "params": {}, "k": 0},
         "SpS": {"rule": "sps", "params": {}, "k": 4},
         "TAS": {"rule": "tas", "params": {"entropy_eps": 1e-5}, "k": 4}}  # vLLM's entropy, as the paper ran it
    for d in ([1.0, 0.75] if fast else [0.1, 0.25, 0.5, 0.75, 1.0, 2.0]):
        m[f"Cactus delta={d:g}"] = {"rule": "cactus", "params": {"delta": d}, "k": 4}
    m["top-k k=3"] = {"rule": "topk", "params": {"k": 3, "recovery": "topk"}, "k": 4}  # the authors' recovery
    m["interpolation alpha=0.5"] = {"rule": "interpolation", "params": {"alpha": 0.5}, "k": 4}
    if not fast:
        m["interpolation alpha=0.9"] = {"rule": "interpolation", "params": {"alpha": 0.9}, "k": 4}
        m["EARS beta=0.5"] = {"rule": "ears", "params": {"beta": 0.5}, "k": 4}
        for k in (2, 8):
            m[f"SpS k={k}"] = {"rule": "sps", "params": {}, "k": k}
            m[f"Cactus delta=1 k={k}"] = {"rule": "cactus", "params": {"delta": 1.0}, "k": k}
    return m


def _draft_id(draft: str) -> str:
    """The embedded draft's cache file name (it encodes the draft's build config), else the spec."""
    if draft != "embedded":
        return draft
    from cactus_theory.lm.draft import DraftConfig, draft_path

    return os.path.basename(draft_path(DraftConfig()))


def lm_config(ctx: Ctx) -> dict:
    o = ctx.lm
    return {"verifier": o.get("verifier", "smollm2"), "draft": o.get("draft", "embedded"),
            "draft_id": None if o.get("pair") is not None else _draft_id(o.get("draft", "embedded")),
            "per_style": o.get("per_style", 1 if ctx.fast else 3),
            "max_new_tokens": o.get("max_new_tokens", 8 if ctx.fast else 32),
            "sampling": SAMPLING.as_dict(), "seed": ctx.seed, "methods": methods(ctx.fast),
            "injected": o.get("pair") is not None}


def scope(cfg: dict) -> str:
    """Where the LM evidence comes from, for "consistent: ..." verdicts (from ``lm_config``)."""
    pair = "an injected pair" if cfg["injected"] else f"{cfg['verifier']} verifier + {cfg['draft']} draft"
    return f"{pair}, k = 4, {cfg['per_style']} prompts x {len(STYLES)} styles"


_PAIRS: dict = {}


def set_threads(ctx: Ctx) -> int:
    """torch CPU threads: ``ctx.lm['threads']`` if given; else 1 when the machine is already busy
    (load average >= cores: two threads then contend and run several times slower), else torch's
    default. Speedups are ratios measured under one setting, so they stay comparable."""
    import torch

    n = ctx.lm.get("threads")
    if n is None and hasattr(os, "getloadavg") and os.getloadavg()[0] >= (os.cpu_count() or 1):
        n = 1
    if n:
        torch.set_num_threads(int(n))
    return torch.get_num_threads()


def get_pair(ctx: Ctx):
    """The (draft, verifier) pair: injected (``ctx.lm['pair']``, tests), else loaded once per process.

    In fast mode with the embedded pair and no cached draft, the draft is the verifier's untrained
    early exit (no build: CI and notebooks stay short); the full run builds the real draft first."""
    if ctx.lm.get("pair") is not None:
        return ctx.lm["pair"]
    set_threads(ctx)
    cfg = lm_config(ctx)
    key = (cfg["verifier"], cfg["draft"], ctx.fast)
    if key not in _PAIRS:
        import torch

        from cactus_theory.lm import load_pair

        if cfg["draft"] == "embedded" and ctx.fast:
            from cactus_theory.lm.draft import DraftConfig, FeatureDraft, draft_path, head_args
            if not os.path.exists(draft_path(DraftConfig())):
                from cactus_theory.lm.pair import ModelPair, load_model
                from cactus_theory.lm.train.draft_build import init_head

                v, tok = load_model(cfg["verifier"])
                d = FeatureDraft(head_args(v.config, DraftConfig(shortlist=4096)), v.get_input_embeddings())
                init_head(d, v, torch.arange(4096))
                _PAIRS[key] = ModelPair(d.eval(), v, tok, name="smollm2+untrained-head")
                return _PAIRS[key]
        embedded = cfg["draft"] == "embedded" and not ctx.fast
        if embedded:
            build_embedded_draft_if_missing()
        pair = load_pair(cfg["draft"], cfg["verifier"])
        if embedded:
            record_draft_build(ctx, pair)
        dev = ctx.lm.get("device")
        if dev:
            pair.draft.to(dev)
            pair.verifier.to(dev)
        _PAIRS[key] = pair
    return _PAIRS[key]


def build_embedded_draft_if_missing() -> None:
    """Build the embedded draft when a step has to decode with it and it is not cached (steps whose
    results are cached never load it, so a rerun of the committed results needs no build)."""
    from cactus_theory.lm.draft import BUILD_TIME, DraftConfig, draft_path

    if not os.path.exists(draft_path(DraftConfig())):
        from cactus_theory.lm.train.draft_build import build_draft

        print(f"building the embedded draft (cached afterwards; the committed build took {BUILD_TIME}) ...", flush=True)
        build_draft(DraftConfig())


def record_draft_build(ctx: Ctx, pair) -> None:
    """``results/draft_build.json``: the loaded draft's own build report (file, phase times, held-out
    acceptance), so the report's compute times name the draft the LM results come from."""
    from cactus_theory.util.atomic import atomic_write_json

    info = getattr(pair.draft, "info", None) or {}
    phases = info.get("phase_seconds", {})
    rec = {"draft": lm_config(ctx)["draft_id"], "seconds": round(sum(phases.values()), 1),
           "phase_seconds": {k: round(v, 1) for k, v in phases.items()}, "threads": info.get("threads"),
           "heldout_acceptance_by_depth": info.get("heldout_acceptance_by_depth")}
    atomic_write_json(ctx.results / "draft_build.json", rec)


def prompts_for(pair, style: str, n: int, seed: int) -> list:
    """The first ``n`` prompts of ``style``; token-id prompts when the pair has no tokenizer."""
    from cactus_theory.lm.data import CODE_PROMPTS, MATH_PROMPTS, PROSE_PROMPTS

    texts = {"math": MATH_PROMPTS, "code": CODE_PROMPTS, "prose": PROSE_PROMPTS}[style][:n]
    if pair.tokenizer is not None:
        return texts
    rng = np.random.default_rng([seed, STYLES.index(style)])
    return [rng.integers(0, pair.vocab_size, size=6).tolist() for _ in texts]


COUNTERS = ("sequences", "new_tokens", "steps", "accepted", "drafted", "verifier_calls", "seconds",
            "kl_sum", "kl_count", "kl_skipped", "nll_sum", "nll_count")
_WARM: set = set()


def decode(ctx: Ctx, cfg: dict, name: str, style: str) -> dict:
    """One method on one style's prompts, each prompt decoded alone (batch 1, seed ``seed + i``), so
    every counter exists per prompt: the report's intervals are bootstraps over prompts. The first
    call of each method in a process is preceded by an untimed two-token warm-up."""
    from cactus_theory import make_rule
    from cactus_theory.lm import autoregressive_generate, speculative_generate

    pair = get_pair(ctx)
    spec = cfg["methods"][name]
    prompts = prompts_for(pair, style, cfg["per_style"], cfg["seed"])

    def gen(batch, seed, max_new):
        kw = dict(max_new_tokens=max_new, batch_size=len(batch), seed=seed, **SAMPLING)
        if spec["rule"] is None:
            return autoregressive_generate(pair, batch, **kw)
        return speculative_generate(pair, batch, make_rule(spec["rule"], **spec["params"]), k=spec["k"], **kw)

    if name not in _WARM:
        gen(prompts[:1], cfg["seed"], 2)
        _WARM.add(name)
    per, texts, tokens, ids = [], [], [], []
    for i, prompt in enumerate(prompts):
        res = gen([prompt], cfg["seed"] + i, cfg["max_new_tokens"])
        per.append({k: v for k, v in res.stats.as_dict().items() if k in COUNTERS})
        texts += res.texts or []
        tokens += res.tokens
        ids += res.prompts
    out = {"stats": {k: sum(p[k] for p in per) for k in COUNTERS}, "per_prompt": per, "texts": texts}
    if name == "SpS":
        out["prompts"], out["tokens"] = ids, tokens
    return out


def run_all(ctx: Ctx) -> dict:
    """All runs ``{method: {style: {"stats": ..., ...}}}``, each cached as a piece."""
    cfg = lm_config(ctx)
    parts = Parts(ctx, NAME, cfg)
    jobs = [(m, s) for m in cfg["methods"] for s in STYLES]
    out: dict = {}
    for m, s in tqdm(jobs, desc="LM decoding runs"):
        out.setdefault(m, {})[s] = parts.get(f"{m}__{s}".replace(" ", "_").replace("=", ""),
                                              lambda m=m, s=s: decode(ctx, cfg, m, s))
    return out


def derived(t: dict) -> dict:
    """Counters (``COUNTERS``) plus the figures derived from them. Units (DESIGN.md): ``al`` is the
    paper's AL, tokens per verifier call with the bonus included, ``(accepted + steps) / steps``;
    ``acceptance_rate`` is per-token acceptance, accepted drafts / drafted tokens."""
    t = dict(t)
    div = lambda a, b: a / b if b else math.nan  # noqa: E731
    t.update(al=al_of(t["accepted"], t["steps"]), acceptance_rate=div(t["accepted"], t["drafted"]),
             tokens_per_s=div(t["new_tokens"], t["seconds"]), mean_step_kl=div(t["kl_sum"], t["kl_count"]),
             nll=div(t["nll_sum"], t["nll_count"]), rejected_per_token=div(t["drafted"] - t["accepted"], t["new_tokens"]))
    return t


def pooled(runs: dict, method: str, styles=STYLES) -> dict:
    """Counters summed over styles, with the derived figures recomputed (see ``derived``)."""
    return derived({k: sum(runs[method][s]["stats"][k] for s in styles) for k in COUNTERS})


def per_prompt(runs: dict, method: str, styles=STYLES) -> list[dict]:
    """Each prompt's counters, styles in order, prompts in order (the same order for every method, so
    two methods pair up prompt by prompt). Empty when the cached runs predate per-prompt counters."""
    out = []
    for s in styles:
        out += runs[method][s].get("per_prompt", [])
    return out


def save_lm_pairs(ctx: Ctx, runs: dict, max_rows: int = 256) -> int:
    """(p, q) rows of the pair along the SpS continuations (teacher-forced, sampling transforms applied),
    cut to their union support and zero-padded to ``PAIR_SUPPORT``; saved to ``results/lm_pairs.npz``.
    These feed figure c's LM panel. Returns the number of rows."""
    import torch

    from cactus_theory.lm.loop import first_step_laws

    path = ctx.results / "lm_pairs.npz"
    if path.exists() and not ctx.force:
        return int(np.load(path)["p"].shape[0])
    if ctx.cache_only:
        return 0
    pair = get_pair(ctx)
    P, Q = [], []
    with torch.inference_mode():
        for s in STYLES:
            r = runs["SpS"][s]
            for prompt, gen in zip(r["prompts"], r["tokens"], strict=True):
                if len(gen) < 2:
                    continue
                ids = prompt + gen
                p, q = first_step_laws(pair, ids, len(prompt), len(ids) - 1, **SAMPLING)
                for a, b in zip(p, q, strict=True):
                    sup = np.flatnonzero((a > 0) | (b > 0))[:PAIR_SUPPORT]
                    if a[sup].sum() < 1 - 1e-6 or b[sup].sum() < 1 - 1e-6:
                        continue  # support larger than PAIR_SUPPORT (cannot happen with top-k 20)
                    pa, pb = np.zeros(PAIR_SUPPORT), np.zeros(PAIR_SUPPORT)
                    pa[:sup.size], pb[:sup.size] = a[sup] / a[sup].sum(), b[sup] / b[sup].sum()
                    P.append(pa)
                    Q.append(pb)
    P, Q = np.array(P[:max_rows]), np.array(Q[:max_rows])
    with atomic_path(path) as tmp:
        np.savez_compressed(tmp, p=P, q=Q)
    return int(P.shape[0])
