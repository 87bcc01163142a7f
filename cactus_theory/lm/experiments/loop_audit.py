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
import math
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ...core.draws import RowGenerators
from ...core.sampler import sample_rows, verify
from ...core.transforms import sampling_probs
from ...core.tree import BudgetTree, verify_tree
from ..loop import autoregressive_generate, speculative_generate, tree_generate

__all__ = ["Recorder", "AuditReport", "audit_decode", "reference_laws"]


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

    def chain(self, rows, drafts, p, q, tokens, a):
        for i in range(len(rows)):
            self._add(rows, i, ("chain", drafts[i].tolist(), [_sparse(r) for r in p[i]], [_sparse(r) for r in q[i]],
                                tokens[i].tolist(), int(a[i])))

    def tree(self, rows, tokens, parents, p, q, res):
        for i in range(len(rows)):
            self._add(rows, i, ("tree", tokens[i].tolist(), parents[i].tolist(), [_sparse(r) for r in p[i]],
                                [_sparse(r) for r in q[i]], res.tokens[i].tolist(), int(res.num_accepted[i]),
                                res.accepted_nodes[i].tolist()))


@dataclass
class _Diff:
    """Largest differences between the laws handed over and the reference: max |difference| of any entry,
    max TV of a row, and rows whose supports differ (a token in one and not the other)."""

    rows: int = 0
    max_abs: float = 0.0
    max_tv: float = 0.0
    support_mismatch: int = 0
    tvs: list = field(default_factory=list)

    def add(self, got: tuple[np.ndarray, np.ndarray], ref: np.ndarray) -> None:
        ids, vals = got
        g = np.zeros_like(ref)
        g[ids] = vals
        d = np.abs(g - ref)
        self.rows += 1
        self.max_abs = max(self.max_abs, float(d.max()))
        tv = 0.5 * float(d.sum())
        self.max_tv = max(self.max_tv, tv)
        self.tvs.append(tv)
        if not np.array_equal(np.flatnonzero(ref > 0), np.sort(ids)):
            self.support_mismatch += 1

    def summary(self) -> dict:
        tv = np.asarray(self.tvs) if self.tvs else np.zeros(1)
        return {"rows": self.rows, "max_abs": self.max_abs, "max_tv": self.max_tv,
                "median_tv": float(np.median(tv)), "p99_tv": float(np.quantile(tv, 0.99)),
                "support_mismatch": self.support_mismatch}


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
    transforms: no cache, not the compact Llama, not the head's decode cache."""

    def __init__(self, pair, sampling, dtype=None):
        self.sampling = sampling
        self.verifier = pair.verifier if dtype is None else copy.deepcopy(pair.verifier).to(dtype)
        self.draft = pair.draft if dtype is None else copy.deepcopy(pair.draft).to(dtype)
        self.feature = bool(getattr(self.draft, "needs_features", False))
        self.dev = next(self.verifier.parameters()).device

    def _soft(self, logits: torch.Tensor) -> np.ndarray:
        return sampling_probs(logits.float(), *self.sampling).double().cpu().numpy()

    @torch.inference_mode()
    def block(self, seq: list[int], L: int, draft: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
        """One fresh forward over ``seq`` whose first ``L`` tokens are final (``seq[L - 1]`` the pending token)
        and the rest a block of drafts. Returns ``q`` (len(seq) - L + 1, V): the verifier's law after
        ``seq[:L + j]``, and (``draft``) ``p`` (len(seq) - L + 1, V): the draft's law of block position
        ``j + 1`` after ``seq[:L + j]``, else None."""
        x = torch.tensor([seq], device=self.dev)
        out = self.verifier(input_ids=x, output_hidden_states=self.feature and draft)
        q = self._soft(out.logits[0, L - 1:])
        return q, (self._draft(x, L, out.hidden_states if self.feature else None) if draft else None)

    def _draft(self, x: torch.Tensor, L: int, hidden) -> np.ndarray:
        W = x.shape[1] - L + 1  # block positions 1 .. W
        if not self.feature:
            return self._soft(self.draft(input_ids=x).logits[0, L - 1:])
        d = self.draft
        feats = d.fuse([hidden[i].to(d.dtype) for i in d.args.aux_layers])
        g = d.unrolled(feats[:, :-1], x[:, 1:], W)  # step s at entry j reads feature j, token j + 1
        return np.stack([self._soft(d.full_logits(g[s][0, L - 2 + s])) for s in range(W)])

    @torch.inference_mode()
    def draft_after(self, seq: list[int], L: int, hidden_prefix=None) -> np.ndarray:
        """The draft's law after ``seq`` for a block that started at ``L`` (the tree reference): for the head,
        the verifier's features of the final tokens only (``hidden_prefix``, from a forward over
        ``seq[:L]``; entries past them are never attended by the block's chain, so zeros stand there)."""
        x = torch.tensor([seq], device=self.dev)
        if not self.feature:
            return self._soft(self.draft(input_ids=x).logits[0, -1])
        T = x.shape[1]
        hid = [torch.cat([h, h.new_zeros((1, T - L, h.shape[-1]))], 1) for h in hidden_prefix]
        return self._draft(x, L, hid)[-1]

    @torch.inference_mode()
    def prefix_hidden(self, seq: list[int]):
        x = torch.tensor([seq], device=self.dev)
        return self.verifier(input_ids=x, output_hidden_states=True).hidden_states if self.feature else None


def reference_laws(pair, seq: list[int], L: int, sampling, dtype=None):
    """The audit's reference for one block (see ``_Reference.block``): ``(q, p)`` numpy float64."""
    return _Reference(pair, sampling, dtype).block(seq, L)


def _order(pair) -> torch.Tensor | None:
    """The order the drafter draws its law in: the head's shortlist (``d2t``), or the vocabulary."""
    d2t = getattr(pair.draft, "d2t", None)
    return d2t.detach().cpu().long() if getattr(pair.draft, "needs_features", False) and d2t is not None else None


def _draw_like_drafter(p: torch.Tensor, u: float, order) -> int:
    if order is None:
        return int(sample_rows(p[None], torch.tensor([u], dtype=torch.float64))[0])
    return int(order[sample_rows(p[order][None], torch.tensor([u], dtype=torch.float64))[0]])


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
                 reference_dtype=None, progress=None) -> AuditReport:
    """Decode ``prompts`` with per-row seeds, recording every law and draw, then check (1)-(4) of the module
    docstring. ``method``: ``"chain"`` (``speculative_generate`` with ``rule``, default SpS, ``k`` drafts),
    ``"tree"`` (``tree_generate`` with ``tree`` / ``scheme`` / ``mode``) or ``"plain"`` (the verifier
    alone). ``tolerance``: the largest TV a row handed over may differ from the reference by;
    ``support_slack``: the share of rows whose support (after top-k / top-p) may differ (a token at the
    top-p boundary flipping under rounding; 0 in float32). ``reference_dtype``: the dtype of the fresh
    forwards (default the models' own)."""
    import time

    from ...core.rules import SpS
    from ...theory.tree import budget_tree

    t0 = time.perf_counter()
    rule = SpS() if rule is None else rule
    if rule.reads_head:
        raise ValueError(f"rule: the audit replays verify from (p, q) alone; {rule!r} reads the verifier's head")
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
    order = _order(pair)
    V = pair.vocab_size
    qd, pd = _Diff(), _Diff()
    draws = {name: {"checked": 0, "mismatched": 0} for name in
             ("first", "drafted", "verify", "plain", "tree_candidates")}
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
        for ev in events:
            kind = ev[0]
            if kind in ("first", "plain"):
                _, qs, t = ev
                qr, _ = ref.block(seq, len(seq), draft=False)
                qd.add(qs, qr[0])
                check(kind, t == int(sample_rows(_dense(qs, V)[None], rand(g, 1))[0]))
                seq.append(t)
            elif kind == "chain":
                _, drafts, ps, qs, toks, a = ev
                L = len(seq)
                qr, pr = ref.block(seq + drafts, L)
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
                seen_q, seen_p = set(), set()
                for nodes in _paths(par, toks):
                    qr, pr = ref.block(seq + [toks[j] for j in nodes], L)
                    if "root" not in seen_q:
                        qd.add(qs[0], qr[0])
                        seen_q.add("root")
                    for i, j in enumerate(nodes):
                        if j not in seen_q:
                            qd.add(qs[j + 1], qr[i + 1])
                            seen_q.add(j)
                        if j not in seen_p:
                            pd.add(ps[j], pr[i])
                            seen_p.add(j)
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
                elif scheme in ("deterministic", "eagle"):  # candidates are a function of the draft's laws
                    if isinstance(tree, BudgetTree):
                        hp = ref.prefix_hidden(seq)
                        memo: dict = {}

                        def cond(c, hp=hp, L=L, memo=memo):
                            c = tuple(c)
                            if c not in memo:
                                memo[c] = ref.draft_after(list(c), L, hp)
                            return memo[c]

                        want_par, want_tok = budget_tree(cond, tree, tuple(seq))
                        check("tree_candidates", list(want_par) == par and list(want_tok) == toks)
                    else:
                        ok = True
                        for j, pa in enumerate(par):
                            if toks[j] < 0:
                                continue
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
    exact = all(d["mismatched"] == 0 for d in draws.values()) and outputs["mismatched"] == 0
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
