"""Throughput and memory of ``sampler.verify`` against a straightforward reference.

The reference materialises the target ``h`` and the recovery law ``(h - p)_+`` at every one of the
B*k positions and samples a recovery token at each (as the authors' PyTorch path and vLLM's
rejection sampler do); ``verify`` reads one probability per position and builds B recovery rows.
Both run in the same process, on the same inputs, float32 on CPU, with the rule's own code.

The default call ``verify(...)`` validates its inputs (``check=True``); ``check=False`` skips that
for trusted callers. Both are timed beside the reference, alternately in one run, and the headline
configuration (B = 32, k = 8, V = 151,936, one thread) prints the target of the checked call:
at least ``TARGET_CHECKED`` times faster than the reference.

Peak extra memory is explicit accounting of tensor bytes: a TorchDispatchMode records every
tensor the call allocates (inputs excluded) and frees it when its last tracked tensor dies.

    .venv/bin/python benchmarks/bench_sampler.py                # full grid (a few minutes)
    .venv/bin/python benchmarks/bench_sampler.py --quick        # B=32, k=8, V=151936 only
"""

from __future__ import annotations

import argparse
import statistics
import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from tqdm import tqdm

from cactus_theory.rules import Cactus, Rule, SpS, TargetRule
from cactus_theory.sampler import verify
from cactus_theory.util.atomic import atomic_write_json

HEADLINE = (32, 8, 151936)  # B, k, V of the stated target
TARGET_CHECKED = 6.0  # the default (checked) verify must be at least this much faster than the reference


def reference_verify(n: torch.Tensor, P: torch.Tensor, Q: torch.Tensor, rule: TargetRule,
                     generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Materialise ``h`` (B, k, V) and ``(h - p)_+`` at every position, sample at every position."""
    B, k, V = P.shape
    h = rule.target(P, Q[:, :k], n, check=False)  # [B, k, V]
    idx = n.unsqueeze(-1)
    p_n, h_n = P.gather(-1, idx).squeeze(-1), h.gather(-1, idx).squeeze(-1)
    phi = torch.where(p_n > 0, (h_n / p_n.clamp_min(1e-30)).clamp(max=1.0), torch.zeros_like(p_n))
    resid = (h - P).clamp_min(0)
    z = resid.sum(-1, keepdim=True)
    resid = torch.where(z > 0, resid / z.clamp_min(1e-30), h)
    u = torch.rand((B, k), generator=generator)
    accepted = u < phi
    recovered = torch.multinomial(resid.reshape(-1, V), 1, generator=generator).reshape(B, k)
    bonus = torch.multinomial(Q[:, k], 1, generator=generator).squeeze(-1)
    na = accepted.long().cumprod(-1).sum(-1)
    last = torch.where(na == k, bonus, recovered.gather(1, na.clamp_max(k - 1).unsqueeze(-1)).squeeze(-1))
    pos = torch.arange(k + 1)
    tokens = torch.where(pos < na.unsqueeze(-1), torch.cat([n, n.new_full((B, 1), -1)], 1), -1)
    tokens.scatter_(1, na.unsqueeze(-1), last.unsqueeze(-1))
    return tokens, na


class PeakTensorBytes(TorchDispatchMode):
    """Live bytes of storages allocated by ops inside the mode (inputs given to ``external``)."""

    def __init__(self, *external: torch.Tensor):
        super().__init__()
        self.external = {t.untyped_storage().data_ptr() for t in external}
        self.refs: dict[int, list] = {}  # data_ptr -> [live tracked tensors, nbytes]
        self.live = self.peak = 0

    def _drop(self, key: int) -> None:
        entry = self.refs.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            key = st.data_ptr()
            if key in self.external or st.nbytes() == 0:
                continue
            if key not in self.refs:
                self.refs[key] = [0, st.nbytes()]
                self.live += st.nbytes()
                self.peak = max(self.peak, self.live)
            self.refs[key][0] += 1
            weakref.finalize(t, self._drop, key)
        return out


def make_inputs(B: int, k: int, V: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    P = torch.softmax(2 * torch.randn(B, k, V, generator=g), -1)
    Q = torch.softmax(2 * torch.randn(B, k + 1, V, generator=g), -1)
    n = torch.multinomial(P.reshape(-1, V), 1, generator=g).reshape(B, k)
    return n, P, Q


def time_alternating(*fns, min_reps: int = 5, min_seconds: float = 2.0) -> list[float]:
    """Median seconds of each function, timed in turns so that load changes hit all alike."""
    for fn in fns:
        fn()  # warm-up
    times: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    while len(times[0]) < min_reps or time.perf_counter() - start < min_seconds:
        for fn, acc in zip(fns, times, strict=True):
            t0 = time.perf_counter()
            fn()
            acc.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def peak_bytes(fn, *inputs: torch.Tensor) -> int:
    with PeakTensorBytes(*inputs) as m:
        out = fn()
    del out
    return m.peak


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the headline B=32, k=8, V=151936")
    ap.add_argument("--only", type=int, nargs=3, metavar=("B", "K", "V"), help="only this configuration")
    ap.add_argument("--mem-budget-gib", type=float, default=6.0,
                    help="skip configurations whose reference would need more (estimated 10 B*k*V*4 bytes)")
    ap.add_argument("--rule", default="cactus", choices=["cactus", "sps"])
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1, as the target states)")
    ap.add_argument("--out", default=None, help="also write the figures as JSON here (atomically)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rule: Rule = Cactus(1.0) if args.rule == "cactus" else SpS()
    grid = [tuple(args.only)] if args.only else [HEADLINE] if args.quick else [(B, k, V) for V in (32000, 151936) for k in (4, 8) for B in (1, 32, 128)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32 CPU, rule {rule!r}")
    print("checked = the default verify(...); unchecked = check=False; speed-ups are over the reference")
    print(f"{'B':>4} {'k':>2} {'V':>7} | {'checked ms':>10} {'unchkd ms':>10} {'ref ms':>10} | {'checked':>8} {'unchkd':>9} "
          f"| {'verify MiB':>10} {'ref MiB':>10} {'B*V*4 MiB':>9} {'B*k*V*4 MiB':>11}")
    rows = []
    for B, k, V in tqdm(grid, desc="configs", leave=False):
        need = 10 * B * k * V * 4 + 2 * B * (k + 1) * V * 4
        if need > args.mem_budget_gib * 2**30:
            print(f"{B:>4} {k:>2} {V:>7} | skipped: the reference needs ~{need / 2**30:.1f} GiB "
                  f"(> --mem-budget-gib {args.mem_budget_gib})")
            continue
        n, P, Q = make_inputs(B, k, V, seed=B + k + V)
        g = torch.Generator()

        def checked(n=n, P=P, Q=Q, g=g):
            return verify(n, P, Q, rule, generator=g.manual_seed(0))

        def unchecked(n=n, P=P, Q=Q, g=g):
            return verify(n, P, Q, rule, generator=g.manual_seed(0), check=False)

        def ref(n=n, P=P, Q=Q, g=g):
            return reference_verify(n, P, Q, rule, g.manual_seed(0))

        t_check, t_ours, t_ref = time_alternating(checked, unchecked, ref)
        m_ours, m_ref = peak_bytes(checked, n, P, Q), peak_bytes(ref, n, P, Q)
        r = dict(B=B, k=k, V=V, verify_checked_ms=1e3 * t_check, verify_ms=1e3 * t_ours, reference_ms=1e3 * t_ref,
                 speedup_checked=t_ref / t_check, speedup=t_ref / t_ours,
                 verify_peak_mib=m_ours / 2**20, reference_peak_mib=m_ref / 2**20)
        rows.append(r)
        tqdm.write(f"{B:>4} {k:>2} {V:>7} | {r['verify_checked_ms']:>10.2f} {r['verify_ms']:>10.2f} {r['reference_ms']:>10.2f} | "
                   f"{r['speedup_checked']:>7.1f}x {r['speedup']:>8.1f}x | "
                   f"{r['verify_peak_mib']:>10.1f} {r['reference_peak_mib']:>10.1f} {B * V * 4 / 2**20:>9.1f} "
                   f"{B * k * V * 4 / 2**20:>11.1f}")
        del n, P, Q
    head = [r for r in rows if (r["B"], r["k"], r["V"]) == HEADLINE]
    if head and args.threads == 1:
        r = head[0]
        ok = r["speedup_checked"] >= TARGET_CHECKED
        print(f"\ntarget (B={HEADLINE[0]}, k={HEADLINE[1]}, V={HEADLINE[2]:,}, one thread): the default checked verify is "
              f"{r['speedup_checked']:.1f}x the materialising reference (>= {TARGET_CHECKED:g}x: {'met' if ok else 'NOT met'}); "
              f"validation takes {1 - r['verify_ms'] / r['verify_checked_ms']:.0%} of the checked call")
    if args.out:
        atomic_write_json(args.out, {"rule": repr(rule), "threads": torch.get_num_threads(), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
