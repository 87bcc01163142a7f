"""Figure c: acceptance rate vs KL divergence of the step's output law from ``q``, for rule sweeps.

For each (p, q) pair and rule, the exact one-step law ``h_alg = sum_n p_n [phi_n e_n + (1 - phi_n) g_n]``
(``exact.induced_distribution``) gives the cost ``KL(h_alg || q)`` and ``acceptance_rate = sum_n p_n phi_n``
the benefit; points are means over pairs. Sweeps: every lossy rule of ``registry.RULES`` along its
registered sweep (Cactus delta, TAS epsilon with alpha = sqrt(epsilon) as vLLM, interpolation alpha,
top-k k, EARS beta, the production servers' rules: SGLang threshold_acc, MAX / TRT-LLM relaxed
delta at top-10, Medusa epsilon, vLLM FLy entropy threshold at window_accept = 1, FLy's most
permissive case; and DropMatch's number of dropout paths at rate 0.1).

Families are grouped by the lossy-verification taxonomy (``registry.VERIFICATION``): collaborative
rules (the draft's probability enters the test) in solid lines, truncation rules (a set cut from ``q``,
``p`` never read) dashed. DropMatch reads the verifier's LM head, which random pairs do not have: each
random pair gets a synthetic head (``dropmatch.synthetic_head``, d = 64, undropped logits = the pair's
``log q`` exactly) whose dropout at rate 0.1 moves the logits by about 0.43 of their spread over the
vocabulary, as SmolLM2-135M's head does (0.42, table j's ``noise_ratio_at_0.1``); its path law is Monte
Carlo over ``DROPMATCH_MASKS`` masks. The LM rows
(``lm_pairs.npz``) carry no hidden states, so DropMatch is left out of that panel (its LM numbers: table j).

The paper's baselines are the references' variants: TAS with vLLM's entropy ``-sum q log(q + 1e-5)``
(``entropy_eps=1e-5``) and top-k with the authors' recovery ``(1[q >= q_(k)] - p)_+``
(``recovery="topk"``); top-k recovering from ``q`` (this library's default) is drawn beside it.
Pair sets: random correlated softmax pairs and, when available, rows of the embedded LM pair
(``lm_pairs``). Both panels use KL; on the LM rows (top-k 20 / top-p 0.95 truncated) several rules
emit tokens outside ``q``'s support, whose KL is infinite: drawn as triangles on the top edge.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
from tqdm import tqdm

from cactus_theory import TAS, SpS, acceptance_rate, induced_distribution, kl, registry
from cactus_theory.claims.ledger import bootstrap_interval, exact_verdict, interval_verdict

from .common import Claim, Ctx, StepResult, cached_step, file_digest, fmt, save_figure, standalone

NAME = "fig_c_tradeoff"
# every lossy rule of the registry with a one-step law (a stateful rule's law is a whole decode's), SpS as reference
FAMILIES = tuple(k for k, s in registry.RULES.items() if not s.lossless and not s.stateful)
# the reproduction runs the references' variants of the paper's baselines (see the module docstring)
REFERENCE_VARIANT = {"tas": {"entropy_eps": 1e-5}, "topk": {"recovery": "topk"}}
OURS_TOPK = "top-k, recovery from q (k)"  # our default top-k, drawn beside the authors'


def _sweeps() -> dict[str, list]:
    out = {}
    for key in FAMILIES:
        extra = REFERENCE_VARIANT.get(key, {})
        out[registry.spec(key).sweep_label] = [(v, dataclasses.replace(r, **extra)) for v, r in registry.sweep(key)]
    out[OURS_TOPK] = registry.sweep("topk")
    return out


SWEEPS = _sweeps()  # label -> [(value, rule)]
FAMILY_OF = {**{registry.spec(k).sweep_label: k for k in FAMILIES}, OURS_TOPK: "topk"}
CACTUS = registry.spec("cactus").sweep_label
TOL = 1e-9  # "at least as well": no baseline accepts more than Cactus at equal mean KL, up to float round-off
# (sums over V <= 256 entries: errors ~1e-14; a tolerance of 0 fails on exact ties, e.g. EARS beta = 0 = SpS)
DROPMATCH_HEAD = {"dim": 64, "noise": 0.35}  # synthetic head for random pairs (see the module docstring)
DROPMATCH_MASKS = 1024
SIG = 6  # significant digits kept of per-row values (keeps the committed JSON small)


def random_pairs(rng: np.random.Generator, R: int, V: int, sigma: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """``q = softmax(T z)``, ``p = softmax(T z + sigma eps)``: z, eps ~ N(0, 1), T ~ U[1, 4] per row
    (a draft that roughly tracks the verifier, with verifier entropies from high to low)."""
    z = rng.normal(size=(R, V)) * rng.uniform(1, 4, size=(R, 1))
    e = rng.normal(size=(R, V)) * sigma

    def sm(x):
        x = np.exp(x - x.max(-1, keepdims=True))
        return x / x.sum(-1, keepdims=True)

    return sm(z + e), sm(z)


def _round(x: np.ndarray) -> list:
    return [float(f"{v:.{SIG}g}") for v in np.asarray(x, dtype=np.float64)]


def path_hits(Q: np.ndarray, rule, seed: int = 0) -> np.ndarray:
    """DropMatch's ``hit`` on random pairs: the path law of each row's synthetic head (Monte Carlo over
    ``DROPMATCH_MASKS`` masks, no sampling transforms, as ``q`` has none here), then ``1 - (1 - r)^M``."""
    import torch

    from cactus_theory.dropmatch import path_law, synthetic_head

    x, W = synthetic_head(np.log(Q), seed=seed, **DROPMATCH_HEAD)
    g = torch.Generator().manual_seed(seed)
    r = np.stack([path_law(x[i], W[i], rule.rate, DROPMATCH_MASKS, generator=g).r for i in range(len(Q))])
    return rule.hit_from_law(r)


def sweep(P: np.ndarray, Q: np.ndarray, label: str = "", heads: bool = False) -> dict:
    """Per family: mean acceptance and mean ``KL(h_alg || q)`` of each swept rule over the rows of (P, Q),
    and the per-row values (``rows``) the intervals are bootstrapped from. Rules that read the verifier's
    head (DropMatch) run only with ``heads`` (synthetic heads, ``path_hits``)."""
    out = {}
    jobs = [(fam, v, rule) for fam, pts in SWEEPS.items() for v, rule in pts
            if heads or not registry.spec(rule).reads_head]
    for fam, v, rule in tqdm(jobs, desc=f"fig c: rule sweep {label}", leave=False):
        if registry.spec(rule).reads_head:
            rule = rule.at(path_hits(Q, rule))
        H = induced_distribution(rule, P, Q)
        k, a = kl(H, Q), acceptance_rate(rule, P, Q)
        fin = np.isfinite(k)
        out.setdefault(fam, []).append({
            "param": v, "rule": repr(rule), "accept": float(np.mean(a)), "kl": float(np.mean(k)),
            "kl_inf_frac": float(np.mean(~fin)), "rows": {"accept": _round(a), "kl": _round(k)}})
    out["_kl_pq"] = float(np.mean(kl(P, Q)))
    out["_sps_accept"] = float(np.mean(acceptance_rate(SpS(), P, Q)))
    out["_rows"] = int(P.shape[0])
    out["_V"] = int(P.shape[1])
    return out


def load_lm_pairs(path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """LM rows saved by the LM steps (``lm_pairs.npz``: arrays ``p``, ``q`` of shape (R, K)), if any."""
    if not path.exists():
        return None
    z = np.load(path)
    return z["p"], z["q"]


def config(ctx: Ctx) -> dict:
    lm = ctx.results / "lm_pairs.npz"
    return {"R": 12 if ctx.fast else 48, "V": 64 if ctx.fast else 256, "sigma": 1.0, "seed": ctx.seed,
            "sweeps": {k: [repr(r) for _, r in v] for k, v in SWEEPS.items()},
            "tas_full_V": 2048 if ctx.fast else 151_936, "tas_full_R": 4 if ctx.fast else 16,
            "lm_pairs": file_digest(lm), "dropmatch": [DROPMATCH_HEAD, DROPMATCH_MASKS],
            "version": 4}


def tas_entropy_effect(rng: np.random.Generator, R: int, V: int) -> dict:
    """Mean TAS acceptance with the exact entropy vs vLLM's ``-sum q log(q + 1e-5)`` on random pairs at
    vocabulary ``V`` (the two differ most at full vocabulary, where many tiny ``q_i`` sit below 1e-5)."""
    P, Q = random_pairs(rng, R, V)
    a0, a5 = (acceptance_rate(TAS(entropy_eps=e), P, Q) for e in (0.0, 1e-5))
    return {"V": V, "R": R, "accept_exact": float(np.mean(a0)), "accept_vllm": float(np.mean(a5))}


def compute(ctx: Ctx, cfg: dict) -> dict:
    rng = np.random.default_rng(cfg["seed"])
    P, Q = random_pairs(rng, cfg["R"], cfg["V"], cfg["sigma"])
    out = {"random": sweep(P, Q, "random", heads=True),
           "tas_entropy": tas_entropy_effect(rng, cfg["tas_full_R"], cfg["tas_full_V"])}
    lm = load_lm_pairs(ctx.results / "lm_pairs.npz")
    if lm is not None:
        out["lm"] = sweep(*lm, label="LM")
    return out


def plot(d: dict, ctx: Ctx) -> list:
    import matplotlib.pyplot as plt

    sets = [k for k in ("random", "lm") if k in d]
    fig, axes = plt.subplots(1, len(sets), figsize=(7.4 * len(sets), 5.4), squeeze=False)
    titles = {"random": "random correlated pairs", "lm": "LM-derived pairs (embedded SmolLM2 pair)"}
    for ax, key in zip(axes[0], sets, strict=True):
        s = d[key]
        finite = [pt["kl"] for fam, pts in s.items() if not fam.startswith("_") for pt in pts if math.isfinite(pt["kl"])]
        top = 1.25 * max([x for x in finite + [s["_kl_pq"]] if math.isfinite(x)] + [1e-3])  # where KL = inf is drawn
        order = list(registry.RULES)  # legend in registry order: a fresh result and its cached JSON (keys
        fams = sorted((f for f in s if not f.startswith("_")),  # sorted) draw the same bytes
                      key=lambda f: (order.index(FAMILY_OF[f]), f))
        for group in registry.VERIFICATION:  # the taxonomy: one legend block per class
            members = [f for f in fams if registry.verification(FAMILY_OF[f]) == group]
            if members:
                ax.plot([], [], ls="none", label=f"{group}:")
            for fam in members:
                _draw_family(ax, fam, s[fam], group, top)
        if math.isfinite(s["_kl_pq"]):  # infinite on truncated LM rows (p puts mass outside q's support)
            ax.axvline(s["_kl_pq"], color="gray", ls=":", lw=1, label="KL(p || q) (mean)")
        ax.axhline(s["_sps_accept"], color=registry.colour("sps"), ls="--", lw=0.8, label="SpS acceptance")
        if any(not math.isfinite(pt["kl"]) for fam, pts in s.items() if not fam.startswith("_") for pt in pts):
            ax.axvline(top, color="k", lw=0.6)
            ax.text(top, 0.02, "KL = inf ", rotation=90, fontsize=7, va="bottom", ha="right",
                    transform=ax.get_xaxis_transform())
            ax.set_xlim(0, top * 1.03)
        else:
            ax.set_xlim(0, None)
        ax.set_xlabel("mean KL(h_alg || q) of the step's output law (nats)")
        ax.set_ylabel("mean acceptance rate (probability)")
        ax.set_title(f"{titles[key]}: {s['_rows']} rows, V={s['_V']}", fontsize=10)
        ax.legend(fontsize=7, loc="upper right")
        ax.grid(alpha=0.3)
    fig.suptitle("acceptance vs KL of one step's output law, grouped by the lossy-verification taxonomy (solid: "
                 "collaborative, dashed: truncation); numbers: the swept parameter", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, ctx, "fig_c_tradeoff")


def _draw_family(ax, fam: str, pts: list, group: str, top: float) -> None:
    """One family's sweep: solid for collaborative rules, dashed for truncation rules (dotted: our top-k
    recovery from q); infinite-KL points as triangles on the top edge; a few parameter labels."""
    fin = [pt for pt in pts if math.isfinite(pt["kl"])]
    inf = [pt for pt in pts if not math.isfinite(pt["kl"])]
    c, m = registry.colour(FAMILY_OF[fam]), registry.marker(FAMILY_OF[fam])
    ls = ":" if fam == OURS_TOPK else ("-" if group == "collaborative" else "--")
    name = fam if fam != registry.spec("topk").sweep_label else f"{fam}, authors' recovery"
    if registry.spec(FAMILY_OF[fam]).reads_head:
        name += ", rate 0.1, synthetic head"
    ax.plot([pt["kl"] for pt in fin], [pt["accept"] for pt in fin], marker=m, color=c, ls=ls, lw=1.2, ms=4,
            label=name)
    ax.scatter([top] * len(inf), [pt["accept"] for pt in inf], marker="^", color=c, s=30, clip_on=False)
    # a few labels only (every value is in the JSON); none in the crowded corner near (KL(p||q), 1),
    # where every family ends once it accepts everything and emits p
    for pt in (fin[::3] if fam == CACTUS else fin[:1] + fin[-1:]):
        if pt["accept"] < 0.97:
            ax.annotate(f"{pt['param']:g}", (pt["kl"], pt["accept"]), fontsize=7, xytext=(4, -9),
                        textcoords="offset points", color=c)


def _rows(pts: list, what: str) -> np.ndarray:
    return np.array([pt["rows"][what] for pt in pts], dtype=np.float64)  # (points, rows)


def max_gain(s: dict, idx: np.ndarray | None = None, comparable: list | None = None) -> tuple[float, list]:
    """Largest ``acceptance(baseline) - acceptance(Cactus at the baseline's mean KL)`` over the comparable
    baseline points (finite mean KL inside the Cactus curve's KL range, or infinite KL at an acceptance
    Cactus reaches: Cactus wins those), on the rows ``idx`` (all rows by default)."""
    cac = s[CACTUS]
    take = (lambda a: a) if idx is None else (lambda a: a[:, idx])
    cx, cy = take(_rows(cac, "kl")).mean(1), take(_rows(cac, "accept")).mean(1)
    order = np.argsort(cx)
    cx, cy = cx[order], cy[order]
    found, gains = [], []
    for fam, pts in s.items():
        if fam.startswith("_") or fam in (CACTUS, OURS_TOPK):
            continue
        ks, accs = take(_rows(pts, "kl")).mean(1), take(_rows(pts, "accept")).mean(1)
        for i, pt in enumerate(pts):
            name = (fam, pt["param"])
            if comparable is not None and name not in comparable:
                continue
            if math.isfinite(ks[i]) and (comparable is not None or cx[0] < ks[i] <= cx[-1]):
                gains.append(accs[i] - np.interp(ks[i], cx, cy))
            elif not math.isfinite(ks[i]) and (comparable is not None or cy.min() <= accs[i] <= cy.max()):
                gains.append(-np.inf)
            else:
                continue
            found.append(name)
    return (max(gains) if gains else -np.inf), found


def _frontier_claim(s: dict, label: str, scope: str = "", key: str = "frontier-per-step") -> Claim:
    """Does Cactus buy acceptance at least as cheaply as the baselines? At each comparable baseline point,
    the baseline's acceptance minus Cactus's (interpolated at the same mean KL); 95% percentile-bootstrap
    interval over pairs of the largest such gain, compared with the tolerance ``TOL``."""
    gain, comparable = max_gain(s)
    comparable = sorted(comparable)  # independent of the order the JSON cache keeps the families in
    R = s["_rows"]
    how = (f"exact one-step laws on {R} {label}; at each baseline point with a mean KL inside Cactus's range (or "
           f"infinite KL at an acceptance Cactus reaches), baseline acceptance minus Cactus's at equal mean KL; "
           f"95% bootstrap interval over pairs of the largest gain")
    decision = (f"holds if the whole interval of the largest gain lies below {100 * TOL:g} points (float round-off): no "
                "baseline accepts more at equal KL; differs if it lies above")
    if len(comparable) < 5:
        return Claim(key, _FRONTIER + f" ({label})", "our per-step proxy of the paper's accuracy-vs-acceptance "
                     "comparison", "derived", how, f"{len(comparable)} comparable baseline points (< 5)", "out of reach")
    iv = bootstrap_interval(np.arange(R), lambda idx: TOL - max_gain(s, idx.astype(int), comparable)[0], n_boot=2000)
    worst = max(((f, p) for f, p in comparable), key=lambda fp: _gain_of(s, fp))
    verdict = interval_verdict(iv, scope=scope)
    return Claim(
        key, _FRONTIER + f" ({label})", "our per-step proxy of the paper's accuracy-vs-acceptance comparison",
        "derived", how,
        (f"{len(comparable)} comparable baseline points; largest gain over Cactus {fmt(100 * gain, 2)} points of "
         f"acceptance ({worst[0]} = {worst[1]:g}); 95% interval of the gain [{fmt(100 * (TOL - iv.hi), 2)}, "
         f"{fmt(100 * (TOL - iv.lo), 2)}] points"),
        verdict, scope=scope if verdict in ("consistent", "inconclusive", "differs") else "",
        detail="quality here is the divergence of one step's output law, not task accuracy", units=f"{R} pairs",
        decision=decision)


_FRONTIER = ("Cactus trades acceptance for per-step KL(h_alg || q) at least as well as every other lossy rule: TAS "
             "(vLLM's), top-k (the authors' recovery), interpolation, EARS and the production servers' rules")


def _gain_of(s: dict, name: tuple) -> float:
    return max_gain(s, None, [name])[0]


def _topk_claim(s: dict) -> Claim:
    authors = {pt["param"]: pt["kl"] for pt in s[registry.spec("topk").sweep_label]}
    ours = {pt["param"]: pt["kl"] for pt in s[OURS_TOPK]}
    ks = [k for k in (1, 3, 20) if k in authors]
    ok = all(authors[k] > ours[k] for k in ks)
    return Claim(
        "topk-recovery", "the authors' top-k recovery (1[q >= q_(k)] - p)_+ costs more KL(h_alg || q) than recovering "
        "from q (same acceptance: the rule's acceptance test is the same)", "rules.TopK(recovery=...); the authors' "
        "reference code", "derived", f"exact one-step laws, mean over {s['_rows']} random pairs (V = {s['_V']})",
        "KL(h_alg || q) at k = " + ", ".join(f"{k}: {fmt(authors[k], 2)} (authors') vs {fmt(ours[k], 2)} (from q)"
                                              for k in ks),
        exact_verdict(ok), scope=f"random pairs, V = {s['_V']}")


def claims(d: dict) -> list[Claim]:
    out = [_frontier_claim(d["random"], "random correlated pairs"), _topk_claim(d["random"])]
    if "lm" in d:
        out.append(_frontier_claim(d["lm"], "LM-derived pairs", scope=f"{d['lm']['_rows']} rows of the decoding steps' LM pair",
                                   key="frontier-per-step-lm"))
    return out


def run(ctx: Ctx) -> StepResult:
    cfg = config(ctx)
    return cached_step(ctx, NAME, cfg, lambda: compute(ctx, cfg), plot, claims)


if __name__ == "__main__":
    standalone(run)
