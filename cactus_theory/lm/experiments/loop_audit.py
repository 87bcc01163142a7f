"""Deterministic audit of whole decodes: is the loop exactly ``verify`` applied to the models' true laws?

A speculative loop is lossless when, at every step, (1) the ``q`` it hands to ``verify`` / ``verify_tree``
is the verifier's law given the tokens emitted so far (and the drafts before each position), (2) the ``p``
is the draft's law given the same, (3) every drafted token was drawn from exactly that ``p``, and (4) what
it emits is what ``verify`` returned, cut at EOS and at the token budget. The one-step law of ``verify``
is proven elsewhere (``core.exact``, the conformance harness); this module checks (1)-(4) over whole
decodes of a ragged batch, in the setting the eval uses (chat template, EOS, long outputs, float32 or
bfloat16), against references the loop does not share:

* ``q``: a fresh forward of the Hugging Face verifier over the whole prefix (and the drafts), no cache,
  not the compact Llama the loop runs; the same sampling transforms.
* ``p``: for a causal-LM draft a fresh forward over the same sequence; for the EAGLE-3-style head, the
  verifier's features from that fresh forward and the head unrolled from the block start
  (``FeatureDraft.unrolled``: the training-time path, not the decode cache).
* draws: the decode runs with per-row seeds (``seeds=``), so each row's uniforms are a stream the audit
  replays with a generator of its own: the first token, each drafted token (inverse CDF of the ``p``
  handed over; the head draws over its shortlist, ``d2t`` order), every ``verify`` / ``verify_tree`` call
  (re-run on the recorded laws with the replayed uniforms: the same tokens and accepted counts), each
  verifier-alone draw; then the emitted sequences are rebuilt from the replay and compared with the output.
  Deterministic tree candidates are checked against the tree grown from the reference laws
  (``theory``-free: ranks of ``p`` at the parent; EAGLE-2's budget tree via ``theory.tree.budget_tree``).

``audit_decode`` returns an ``AuditReport`` (numbers per check; ``ok`` when every exact check holds and
the law differences stay under the stated tolerance); ``paper_repro``'s loop-audit step runs it on the
real pair and commits the report.
"""

from __future__ import annotations

import copy
import inspect
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ...core.draws import RowGenerators
from ...core.sampler import sample_rows, verify
from ...core.transforms import sampling_probs
from ...core.tree import as_tree, verify_tree
from ..loop import autoregressive_generate, speculative_generate, tree_generate

__all__ = ["Recorder", "AuditReport", "audit_decode"]


def _sparse(row: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """A probability row (V,) as (ids, values) of its support, values in the row's own dtype."""
    r = row.detach().cpu()
    ids = torch.nonzero(r > 0).squeeze(-1)
    return ids.numpy().astype(np.int64), r[ids].numpy()


def _dense(sp: tuple[np.ndarray, np.ndarray], V: int) -> torch.Tensor:
    ids, vals = sp
    out = torch.zeros(V, dtype=torch.from_numpy(vals).dtype)
    out[torch.from_numpy(ids)] = torch.from_numpy(vals)
    return out


class Recorder:
    """The loop's observer (``speculative_generate(..., observer=)``): keeps, per prompt, every law and draw
    the loop handed to its samplers, rows cut to their support (after top-k / top-p a few entries each)."""

    def __init__(self):
        self.events: dict[int, list] = {}
        self._start = 0

    def batch(self, start, prompts):
        self._start = start
        for i in range(len(prompts)):
            self.events.setdefault(start + i, [])

    def _add(self, rows, i, event):
        self.events[self._start + rows[i]].append(event)

    def first(self, rows, q, tokens):
        for i in range(len(rows)):
            self._add(rows, i, ("first", _sparse(q[i]), int(tokens[i])))

    def plain(self, rows, q, tokens):
        for i in range(len(rows)):
            self._add(rows, i, ("plain", _sparse(q[i]), int(tokens[i])))

    def chain(self, rows, drafts, p, q, tokens, a, lengths=None):
        for i in range(len(rows)):  # an adaptive draft length: the row's own drafts, laws and bonus row only
            n = drafts.shape[1] if lengths is None else int(lengths[i])
            self._add(rows, i, ("chain", drafts[i, :n].tolist(), [_sparse(r) for r in p[i, :n]],
                                [_sparse(r) for r in q[i, :n + 1]], tokens[i, :n + 1].tolist(), int(a[i])))

    def tree(self, rows, tokens, parents, p, q, res):
        for i in range(len(rows)):
            self._add(rows, i, ("tree", tokens[i].tolist(), parents[i].tolist(), [_sparse(r) for r in p[i]],
                                [_sparse(r) for r in q[i]], res.tokens[i].tolist(), int(res.num_accepted[i]),
                                res.accepted_nodes[i].tolist()))


class _Diff:
    """Largest differences between the laws handed over and the reference: max |difference| of any entry,
    max TV of a row, and rows whose supports differ (a token in one and not the other). A reference row
    (V, 2) carries a baseline too (``audit_decode(baseline_dtype=)``): then the same numbers of the laws
    handed over against the baseline, and of the reference against the baseline (the rounding scale)."""

    def __init__(self):
        self.stats = {name: {"rows": 0, "max_abs": 0.0, "support_mismatch": 0, "tvs": []}
                      for name in ("reference", "baseline", "reference_vs_baseline")}

    def _one(self, name: str, got: np.ndarray, ref: np.ndarray) -> None:
        st = self.stats[name]
        d = np.abs(got - ref)
        st["rows"] += 1
        st["max_abs"] = max(st["max_abs"], float(d.max()))
        st["tvs"].append(0.5 * float(d.sum()))
        st["support_mismatch"] += int(not np.array_equal(got > 0, ref > 0))

    def add(self, got: tuple[np.ndarray, np.ndarray], ref: np.ndarray) -> None:
        ids, vals = got
        main = ref if ref.ndim == 1 else ref[:, 0]
        g = np.zeros_like(main)
        g[ids] = vals
        self._one("reference", g, main)
        if ref.ndim == 2:
            self._one("baseline", g, ref[:, 1])
            self._one("reference_vs_baseline", main, ref[:, 1])

    @property
    def rows(self) -> int:
        return self.stats["reference"]["rows"]

    def summary(self) -> dict:
        out = {}
        for name, st in self.stats.items():
            if not st["rows"] and name != "reference":
                continue
            tv = np.asarray(st["tvs"]) if st["tvs"] else np.zeros(1)
            row = {"rows": st["rows"], "max_abs": st["max_abs"], "max_tv": float(tv.max()),
                   "median_tv": float(np.median(tv)), "p99_tv": float(np.quantile(tv, 0.99)),
                   "support_mismatch": st["support_mismatch"]}
            if name == "reference":
                out.update(row)
            else:
                out[name] = row
        return out


@dataclass
class AuditReport:
    """What ``audit_decode`` checked and found. ``q`` / ``p``: law differences (``_Diff.summary``);
    ``draws``: exact replays (count checked, mismatches); ``tolerance``: the TV a row may differ by (float
    rounding); ``ok``: no replay mismatch, supports differing on at most ``support_slack`` of the rows, every
    row's TV within ``tolerance``."""

    setting: dict
    q: dict
    p: dict
    draws: dict
    outputs: dict
    tolerance: float
    ok: bool
    seconds: float = 0.0
    reference_dtype: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


class _Reference:
    """Fresh laws of the pair's own (Hugging Face) models in ``dtype`` (default their own), with the loop's
    transforms; never the compact Llama the loop runs, nor the head's decode cache.

    Per row, one forward of the verifier over the row's whole decoded sequence (no cache: ``row``) gives
    the law at every final position; the laws after drafts that were not kept come from that forward's
    own Hugging Face cache cut at the block start with the drafts appended (``block``). The head's laws come
    from ``FeatureDraft.unrolled`` over the block's sequence, fed the verifier's features of the final tokens
    (entries past them are never attended by the block's chain, so zeros stand there)."""

    def __init__(self, pair, sampling, dtype=None):
        self.sampling = sampling
        self.verifier = pair.verifier if dtype is None else copy.deepcopy(pair.verifier).to(dtype)
        self.draft = pair.draft if dtype is None else copy.deepcopy(pair.draft).to(dtype)
        self.feature = bool(getattr(self.draft, "needs_features", False))
        self.dev = next(self.verifier.parameters()).device
        self.kw = "cache" if "cache" in inspect.signature(self.verifier.forward).parameters else "past_key_values"

    def _soft(self, logits: torch.Tensor) -> np.ndarray:
        return sampling_probs(logits.float(), *self.sampling).double().cpu().numpy()

    @torch.inference_mode()
    def row(self, seq: list[int]) -> None:
        """Read a row's whole sequence (prompt and every token the loop read or emitted)."""
        x = torch.tensor([seq], device=self.dev)
        out = self.verifier(input_ids=x, use_cache=True, output_hidden_states=self.feature)
        self.seq, self.logits, self.cache = list(seq), out.logits[0], out.past_key_values
        self.hidden = out.hidden_states if self.feature else None

    def _after(self, L: int, drafts: list[list[int]]) -> torch.Tensor:
        """Verifier logits (P, W, V) after ``seq[:L]`` followed by each of the P equally long ``drafts``."""
        c = copy.deepcopy(self.cache)
        c.crop(L - len(self.seq)) if L < len(self.seq) else None
        if len(drafts) > 1:
            c.batch_repeat_interleave(len(drafts))
        return self.verifier(input_ids=torch.tensor(drafts, device=self.dev), **{self.kw: c}).logits

    @torch.inference_mode()
    def block(self, L: int, drafts: list[list[int]], draft: bool = True) -> tuple[list[np.ndarray], list | None]:
        """For a block read after the row's first ``L`` tokens (``seq[L - 1]`` pending) and each draft path in
        ``drafts`` (P lists of equal length W >= 0): ``q`` (P arrays (W + 1, V)), the verifier's law after
        the block start and after each draft, and ``p`` (P arrays (W + 1, V)), the draft's law of block
        positions 1 .. W + 1 given the drafts before them (``draft``; else None)."""
        q0 = self._soft(self.logits[L - 1])[None]
        W = len(drafts[0])
        qs = [q0] * len(drafts)
        if W:
            lg = self._after(L, drafts)
            qs = [np.concatenate([q0, self._soft(lg[i])]) for i in range(len(drafts))]
        if not draft:
            return qs, None
        x = torch.tensor([self.seq[:L] + d for d in drafts], device=self.dev)
        return qs, self._draft(x, L)

    def _draft(self, x: torch.Tensor, L: int) -> list[np.ndarray]:
        """The draft's laws of block positions 1 .. W + 1 for each row of ``x`` (P, L + W)."""
        W1 = x.shape[1] - L + 1
        if not self.feature:
            lg = self.draft(input_ids=x).logits[:, L - 1:]
            return [self._soft(lg[i]) for i in range(x.shape[0])]
        d = self.draft
        P, T = x.shape
        hid = [torch.cat([h[:, :L - 1].expand(P, -1, -1), h.new_zeros((P, T - L + 1, h.shape[-1]))], 1)
               for h in (self.hidden[i] for i in d.args.aux_layers)]
        feats = d.fuse([h.to(d.dtype) for h in hid])  # (P, T, dim)
        g = d.unrolled(feats[:, :-1], x[:, 1:], W1)  # step s at entry j reads feature j and token j + 1
        at = torch.stack([g[s][:, L - 2 + s] for s in range(W1)], 1)  # (P, W + 1, dim)
        return [self._soft(d.full_logits(at[i])) for i in range(P)]

    @torch.inference_mode()
    def draft_after(self, L: int, path: list[int]) -> np.ndarray:
        """The draft's law after ``seq[:L] + path`` in a block started at ``L`` (``budget_tree``'s reference)."""
        return self._draft(torch.tensor([self.seq[:L] + list(path)], device=self.dev), L)[0][-1]


class _Both:
    """The reference and a baseline in another dtype side by side: ``block`` returns rows (W + 1, V, 2)."""

    def __init__(self, ref: _Reference, base: _Reference):
        self.ref, self.base = ref, base

    def row(self, seq):
        self.ref.row(seq)
        self.base.row(seq)

    def block(self, L, drafts, draft=True):
        q1, p1 = self.ref.block(L, drafts, draft)
        q2, p2 = self.base.block(L, drafts, draft)
        q = [np.stack([a, b], -1) for a, b in zip(q1, q2, strict=True)]
        return q, (None if p1 is None else [np.stack([a, b], -1) for a, b in zip(p1, p2, strict=True)])

    def draft_after(self, L, path):
        return self.ref.draft_after(L, path)


def _order(pair) -> torch.Tensor | None:
    """The order the drafter draws its law in: the head's shortlist (``d2t``), or the vocabulary."""
    d2t = getattr(pair.draft, "d2t", None)
    return d2t.detach().cpu().long() if getattr(pair.draft, "needs_features", False) and d2t is not None else None


def _draw_like_drafter(p: torch.Tensor, u: float, order) -> int:
    if order is None:
        return int(sample_rows(p[None], torch.tensor([u], dtype=torch.float64))[0])
    return int(order[sample_rows(p[order][None], torch.tensor([u], dtype=torch.float64))[0]])


def _emitted(events) -> list[int]:
    """Every token a row's events emitted, in order (past EOS and the budget too: the loop read them)."""
    out: list[int] = []
    for ev in events:
        if ev[0] in ("first", "plain"):
            out.append(ev[2])
        elif ev[0] == "chain":
            out += ev[4][:ev[5] + 1]
        else:
            out += ev[5][:ev[6] + 1]
    return out


def _paths(parents: list[int], tokens: list[int]) -> list[list[int]]:
    """Root-to-leaf paths of the present nodes (``tokens >= 0``) of a tree (``parents`` topological, -1: a
    child of the root)."""
    kids: dict[int, list[int]] = {-1: []}
    for j, a in enumerate(parents):
        if tokens[j] >= 0:
            kids.setdefault(j, [])
            kids.setdefault(a, []).append(j)
    out, stack = [], [[]]
    while stack:
        path = stack.pop()
        last = path[-1] if path else -1
        if kids[last]:
            stack.extend(path + [c] for c in reversed(kids[last]))
        elif path:
            out.append(path)
    return out


def audit_decode(pair, prompts, *, method: str = "chain", rule=None, k: int = 4, tree=None, scheme="deterministic",
                 mode: str = "rounds", max_new_tokens: int = 128, batch_size: int = 32, seed: int = 0,
                 sampling=(0.6, 20, 0.95), chat: bool = True, tolerance: float = 1e-4, support_slack: float = 0.0,
                 reference_dtype=None, baseline_dtype=None, progress=None) -> AuditReport:
    """Decode ``prompts`` with per-row seeds, recording every law and draw, then check (1)-(4) of the module
    docstring. ``method``: ``"chain"`` (``speculative_generate`` with ``rule``, default SpS, ``k`` drafts),
    ``"tree"`` (``tree_generate`` with ``tree`` / ``scheme`` / ``mode``) or ``"plain"`` (the verifier
    alone). ``tolerance``: the largest TV a row handed over may differ from the reference by;
    ``support_slack``: the share of rows whose support (after top-k / top-p) may differ (a token at the
    top-p boundary flipping under rounding; 0 in float32). ``reference_dtype``: the dtype of the fresh
    forwards (default the models' own); ``baseline_dtype``: also compare with fresh forwards in this dtype
    (e.g. float32 for a bfloat16 decode: the rounding scale, the reference's own distance to it beside the
    loop's); EAGLE-2 trees grown from the baseline's laws are compared with the reference's."""
    import time

    from ...core.rules import SpS
    from ...theory.tree import budget_tree

    t0 = time.perf_counter()
    rule = SpS() if rule is None else rule
    if rule.reads_head:
        raise ValueError(f"rule: the audit replays verify from (p, q) alone; {rule!r} reads the verifier's head")
    if rule.stateful:
        raise ValueError(f"rule: the audit replays each verify call alone; {rule!r} is stateful per sequence")
    if method not in ("chain", "tree", "plain"):
        raise ValueError(f"method must be 'chain', 'tree' or 'plain', got {method!r}")
    seeds = [(seed * 1_000_003 + i) % 2**62 for i in range(len(prompts))]
    rec = Recorder()
    T, K, P = sampling
    kw = dict(max_new_tokens=max_new_tokens, temperature=T, top_k=K, top_p=P, batch_size=batch_size, chat=chat,
              seeds=seeds, observer=rec)
    if method == "chain":
        res = speculative_generate(pair, prompts, rule, k=k, track_kl=False, **kw)
    elif method == "tree":
        res = tree_generate(pair, prompts, rule, tree, scheme=scheme, mode=mode, **kw)
    else:
        res = autoregressive_generate(pair, prompts, **kw)
    decode_seconds = time.perf_counter() - t0
    ref = _Reference(pair, sampling, reference_dtype)
    base = _Reference(pair, sampling, baseline_dtype) if baseline_dtype is not None else None
    if base is not None:
        ref = _Both(ref, base)
    order = _order(pair)
    V = pair.vocab_size
    qd, pd = _Diff(), _Diff()
    draws = {name: {"checked": 0, "mismatched": 0} for name in
             ("first", "drafted", "verify", "plain", "tree_candidates", "tree_reference_vs_baseline")}
    outputs = {"rows": 0, "mismatched": 0, "steps": 0, "rejections": 0, "rejection_positions": [],
               "eos_stops": 0, "budget_stops": 0}
    eos = pair.eos_token_id

    def check(name, ok):
        draws[name]["checked"] += 1
        draws[name]["mismatched"] += 0 if ok else 1

    def rand(g, n):
        return torch.rand(n, generator=g, dtype=torch.float64)

    for b, events in sorted(rec.events.items()):
        g = torch.Generator().manual_seed(seeds[b])
        seq = list(res.prompts[b])
        n_prompt = len(seq)
        ref.row(seq + _emitted(events))
        for ev in events:
            kind = ev[0]
            if kind in ("first", "plain"):
                _, qs, t = ev
                qr, _ = ref.block(len(seq), [[]], draft=False)
                qd.add(qs, qr[0][0])
                check(kind, t == int(sample_rows(_dense(qs, V)[None], rand(g, 1))[0]))
                seq.append(t)
            elif kind == "chain":
                _, drafts, ps, qs, toks, a = ev
                L = len(seq)
                (qr,), (pr,) = ref.block(L, [drafts])
                for j in range(k + 1):
                    qd.add(qs[j], qr[j])
                for j in range(k):
                    pd.add(ps[j], pr[j])
                    check("drafted", drafts[j] == _draw_like_drafter(_dense(ps[j], V), float(rand(g, 1)[0]), order))
                pt = torch.stack([_dense(x, V) for x in ps])[None]
                qt = torch.stack([_dense(x, V) for x in qs])[None]
                t2, a2 = verify(torch.tensor([drafts]), pt, qt, rule, generator=RowGenerators([g]))
                check("verify", t2[0].tolist() == toks and int(a2[0]) == a)
                outputs["steps"] += 1
                if a < k:
                    outputs["rejections"] += 1
                    outputs["rejection_positions"].append(len(seq) - n_prompt + a)
                seq += toks[:a + 1]
            else:  # tree
                _, toks, par, ps, qs, rtoks, a, path = ev
                L = len(seq)
                paths = _paths(par, toks)
                W = max(len(x) for x in paths)
                # paths padded at their end to one length (a later token never changes an earlier law)
                qr, pr = ref.block(L, [[toks[j] for j in x] + [toks[x[-1]]] * (W - len(x)) for x in paths])
                qd.add(qs[0], qr[0][0])
                seen: set = set()
                for x, qx, px in zip(paths, qr, pr, strict=True):
                    for i, j in enumerate(x):
                        if j not in seen:
                            qd.add(qs[j + 1], qx[i + 1])
                            pd.add(ps[j], px[i])
                            seen.add(j)
                if scheme in ("iid", "without_replacement"):  # one uniform per node, in node order
                    removed: dict[int, set] = {}
                    for j, pa in enumerate(par):
                        src = _dense(ps[j], V).clone()
                        gone = removed.setdefault(pa, set())
                        if scheme == "without_replacement" and gone:
                            src[list(gone)] = 0
                            if float(src.sum()) <= 0:  # support exhausted: the placeholder is drawn from p
                                src = _dense(ps[j], V)
                        x = int(sample_rows(src[None], rand(g, 1))[0])
                        check("drafted", x == toks[j])
                        gone.add(x)
                elif as_tree(tree).reranks:  # EAGLE-2's re-ranked tree from the reference laws, plain sorting
                    def grown(src, L=L, seq=tuple(seq)):
                        memo: dict = {}

                        def cond(c):
                            c = tuple(c)
                            if c not in memo:
                                memo[c] = src.draft_after(L, list(c[L:]))
                            return memo[c]

                        wp, wt = budget_tree(cond, tree, seq)
                        return list(wp), list(wt)

                    want = grown(ref)
                    check("tree_candidates", want == (par, toks))
                    if base is not None:  # the same tree grown from the baseline's laws
                        check("tree_reference_vs_baseline", grown(base) == want)
                else:  # a deterministic static / dynamic tree: the rank-th most likely token at the parent
                    ok = True
                    for j, pa in enumerate(par):
                        if toks[j] >= 0:
                            rank = sum(1 for i in range(j) if par[i] == pa and toks[i] >= 0)
                            pj = _dense(ps[j], V).double().numpy()
                            ok &= toks[j] == sorted(range(V), key=lambda t, pj=pj: (-pj[t], t))[rank]
                    check("tree_candidates", ok)
                pt = torch.stack([_dense(x, V) for x in ps])[None]
                qt = torch.stack([_dense(x, V) for x in qs])[None]
                r2 = verify_tree(torch.tensor([toks]), torch.tensor([par]), pt, qt, rule, scheme,
                                 generator=RowGenerators([g]), mode=mode)
                check("verify", r2.tokens[0].tolist() == rtoks and int(r2.num_accepted[0]) == a)
                outputs["steps"] += 1
                seq += rtoks[:a + 1]
        # the output: the replayed emissions, cut after EOS and at the budget
        em = seq[n_prompt:]
        if eos is not None and eos in em:
            em = em[:em.index(eos) + 1]
            outputs["eos_stops"] += 1
        elif len(em) >= max_new_tokens:
            outputs["budget_stops"] += 1
        em = em[:max_new_tokens]
        outputs["rows"] += 1
        outputs["mismatched"] += int(em != res.tokens[b])
        if progress is not None:
            progress(b + 1, len(rec.events))
    pos = outputs.pop("rejection_positions")
    outputs["deepest_rejection"] = int(max(pos)) if pos else -1
    outputs["rejections_past_64"] = int(sum(x >= 64 for x in pos))
    outputs["new_tokens"] = int(sum(len(t) for t in res.tokens))
    q_sum, p_sum = qd.summary(), pd.summary()
    exact = (all(d["mismatched"] == 0 for name, d in draws.items() if name != "tree_reference_vs_baseline")
             and outputs["mismatched"] == 0)  # the baseline's own tree is a rounding scale, not a check
    slack = math.floor(support_slack * max(1, q_sum["rows"] + p_sum["rows"]))
    within = (q_sum["max_tv"] <= tolerance and p_sum["max_tv"] <= tolerance
              and q_sum["support_mismatch"] + p_sum["support_mismatch"] <= slack)
    setting = {"method": method, "rule": repr(rule), "k": k if method == "chain" else None,
               "tree": repr(tree) if method == "tree" else None, "scheme": scheme if method == "tree" else None,
               "mode": mode if method == "tree" else None, "prompts": len(prompts), "batch_size": batch_size,
               "max_new_tokens": max_new_tokens, "sampling": list(sampling), "chat": chat,
               "dtype": str(next(pair.verifier.parameters()).dtype).replace("torch.", ""),
               "decode_seconds": round(decode_seconds, 2)}
    return AuditReport(setting, q_sum, p_sum, draws, outputs, tolerance, bool(exact and within),
                       round(time.perf_counter() - t0, 2), str(reference_dtype or setting["dtype"]).replace("torch.", ""))
