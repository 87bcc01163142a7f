"""Rooflines of the decoding loop's phases: what each phase must move and compute, and this machine's roofs.

The loop's profile (``DecodeStats``: draft / verifier forward / verify / bookkeeping per verifier call) says
where the time goes; a roofline says how far each phase is from what the machine allows. Two roofs are
measured in the same run as the timings:

* ``measure_bandwidth``: a STREAM-like copy of ``nbytes`` (``dst.copy_(src)``), read + written bytes per
  second, the best of ``repeats`` (on CPU with the torch threads the caller set; on CUDA a device copy,
  synchronised);
* ``measure_matmul``: the FLOP/s of ``torch.nn.functional.linear`` on an (m, k) input and an (n, k) weight in
  the model's dtype (a GEMM shaped like the model's widest layer), the best of ``repeats``. The compute roof
  is its rate at ``m = PEAK_ROWS`` rows (256 on CPU, 8,192 on CUDA: compute-bound); the rate at ``m = W``,
  the rows a phase multiplies, is reported beside it (at a few rows a GEMM streams its weight and runs far below the roof).

The costs are pure functions of the model objects (``Cost``: bytes of weights, of KV cache, of the rest,
and GEMM FLOPs; parameter bytes are ``numel * element_size`` of the tensors the phase reads, each tensor
once, so tied embeddings count once):

* ``verifier_forward_cost(llama, width=W, context=L)``: every layer's weights, the final norm and the LM
  head once (plus the W embedding rows), the KV cache of ``L + W`` slots per layer (read; the block's W
  written), the activations of every linear map, the float32 logits written and the sampling transform's
  read of them and write of ``q``; FLOPs ``2 * (linear parameters) * W`` plus attention
  ``4 * layers * heads * head_dim * W * (L + W)``;
* ``draft_step_cost(draft, width=W, context=L, head_rows=R)``: one step of the EAGLE-3-style head
  (``FeatureDraft``: its decoder layer(s), norms, shortlist head and ``d2t``; W embedding rows of the
  shared embedding; its own KV cache of ``L + W`` slots; the law written over the whole vocabulary, R rows)
  or of a token-level compact Llama draft (as ``verifier_forward_cost`` with the LM head on R rows);
* ``verify_cost(vocab, drafted=N)``: the float32 laws ``verify`` reads, ``p`` (N, V) and ``q`` (N + 1, V);
  no GEMM;
* ``bookkeeping_cost(draft, width=W, kept=K)``: the feature draft's ``fc`` fusing the verifier's features
  at the W scored positions (``FeatureDrafter.advance``) and, on trees, the cache entries of the K kept
  nodes moved into place (``KVCache.keep_path``, read + written, verifier and draft caches).

``step_costs`` composes them for one verifier call of a chain (k drafts) or a tree, and ``roofline``
turns a cost into seconds, ``max(bytes / bandwidth, flops / flop_rate)``; the ratio measured / roofline
is 1 at the roof and grows with everything the phase does besides moving its bytes and doing its GEMMs
(Python, kernel launches, sorting, small-matrix inefficiency). Batch ``B`` rows share one read of the
weights; the KV cache, activations and FLOPs scale with B. Everything here is the minimum traffic: a
phase whose bytes stay in cache between calls (a draft head of a few MB in a large L3) can beat its
DRAM roof (ratio < 1).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch
from torch import nn

from ..core.tree_shapes import as_tree
from .cache import tree_sizes
from .draft import FeatureDraft
from .llama import Llama

__all__ = ["Cost", "measure_bandwidth", "measure_matmul", "verifier_forward_cost", "draft_step_cost",
           "verify_cost", "bookkeeping_cost", "phase_cost", "step_costs", "roofline", "gemm_shape", "PHASES",
           "phase_rows", "format_table", "cpu_model", "device_name", "nominal_bandwidth", "PEAK_ROWS",
           "measure_roofs"]

PHASES = ("draft", "verifier", "verify", "bookkeeping")
PEAK_ROWS = {"cpu": 256, "cuda": 8192}  # rows of the GEMM whose rate is the compute roof (a GPU needs more)
LAW_BYTES = 4  # the loop's laws and logits are float32


@dataclass(frozen=True)
class Cost:
    """What a phase must move and compute: bytes of ``weights`` read, of ``kv`` cache read and written,
    of everything ``other`` (activations, logits, laws), and GEMM ``flops``."""

    weights: float = 0.0
    kv: float = 0.0
    other: float = 0.0
    flops: float = 0.0

    @property
    def bytes(self) -> float:
        return self.weights + self.kv + self.other

    def __add__(self, o: Cost) -> Cost:
        return Cost(self.weights + o.weights, self.kv + o.kv, self.other + o.other, self.flops + o.flops)

    def times(self, n: float) -> Cost:
        return Cost(n * self.weights, n * self.kv, n * self.other, n * self.flops)

    def as_dict(self) -> dict:
        return {**asdict(self), "bytes": self.bytes}


# -- measuring the roofs ------------------------------------------------------------------------

def _positive_int(name: str, v) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
    return v


def _device(device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must name a torch device, got {device!r}") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: CUDA is not available here")
    return dev


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _best_seconds(fn, dev: torch.device, repeats: int, min_seconds: float) -> float:
    """Best time of one call of ``fn`` over ``repeats`` timed batches, each of enough calls to last
    about ``min_seconds`` (after one warm-up call)."""
    fn()
    _sync(dev)
    t0 = time.perf_counter()
    fn()
    _sync(dev)
    one = max(time.perf_counter() - t0, 1e-9)
    number = max(1, min(10_000, math.ceil(min_seconds / one)))
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        _sync(dev)
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def measure_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 10, device="cpu") -> float:
    """Memory bandwidth in bytes per second: a STREAM-like copy of an ``nbytes`` buffer into another
    (``2 * nbytes`` moved per copy: read + written, STREAM's convention), the best of ``repeats``. Use a
    buffer well past the last-level cache (the default 256 MiB). Threads: whatever the caller set
    (``torch.set_num_threads``)."""
    nbytes = _positive_int("nbytes", nbytes)
    if nbytes < 4096:
        raise ValueError(f"nbytes must be >= 4096 (a copy that measures memory, not a call), got {nbytes}")
    repeats = _positive_int("repeats", repeats)
    dev = _device(device)
    n = nbytes // 4
    src = torch.ones(n, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    s = _best_seconds(lambda: dst.copy_(src), dev, repeats, min_seconds=0.02)
    return 2 * 4 * n / s


def measure_matmul(dtype: torch.dtype, m: int, n: int, k: int, repeats: int = 10, device="cpu") -> float:
    """GEMM throughput in FLOP/s (``2 m n k`` per call): ``torch.nn.functional.linear`` of an (m, k) input
    and an (n, k) weight in ``dtype`` (a layer of the model at ``m = W`` rows), the best of ``repeats``."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch dtype, got {dtype!r}")
    m, n, k = (_positive_int(name, v) for name, v in (("m", m), ("n", n), ("k", k)))
    repeats = _positive_int("repeats", repeats)
    dev = _device(device)
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn((m, k), generator=gen, device=dev).to(dtype)
    w = torch.randn((n, k), generator=gen, device=dev).to(dtype)
    with torch.inference_mode():
        s = _best_seconds(lambda: nn.functional.linear(x, w), dev, repeats, min_seconds=0.01)
    return 2.0 * m * n * k / s


def gemm_shape(model: nn.Module) -> tuple[int, int]:
    """``(n, k)`` of the largest linear map inside the model's decoder layers (the verifier's SwiGLU
    ``w13``: 2 x hidden by dim), the shape ``measure_matmul`` times."""
    layers = model.layers if isinstance(model, Llama) else model
    best = max((mod.weight for mod in layers.modules() if isinstance(mod, nn.Linear) and mod is not
                getattr(model, "head", None)), key=lambda w: w.numel(), default=None)
    if best is None:
        raise ValueError(f"model has no linear layers: {type(model).__name__}")
    return tuple(best.shape)


def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def device_name(device) -> str:
    """The CPU model for a CPU device, the GPU's name for a CUDA one."""
    dev = _device(device)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_model()


def nominal_bandwidth(device) -> float | None:
    """A CUDA device's nominal memory (HBM) bandwidth in bytes per second from its properties
    (``2 * memory clock * bus width``, where torch reports them), else None (CPUs: not known to torch)."""
    dev = _device(device)
    if dev.type != "cuda":
        return None
    p = torch.cuda.get_device_properties(dev)
    clock, width = getattr(p, "memory_clock_rate", None), getattr(p, "memory_bus_width", None)
    if not clock or not width:
        return None
    return 2.0 * clock * 1e3 * width / 8  # kHz, bits; double data rate


def measure_roofs(model: nn.Module, widths=(1,), nbytes: int = 256 * 2**20, repeats: int = 10,
                  device="cpu") -> dict:
    """This machine's roofs for ``model`` (a compact Llama) in its dtype on ``device``: ``bandwidth``
    (``measure_bandwidth``), ``flop_rate`` (``measure_matmul`` on ``gemm_shape(model)`` at ``PEAK_ROWS``
    rows), ``flop_rates_by_rows`` (the same at each of ``widths`` rows, keyed by the width as a string),
    with the device's name, the dtype, torch's thread count and, on CUDA, the nominal bandwidth. Each
    phase row goes into the dict's ``phases`` list (``phase_rows``)."""
    n, k = gemm_shape(model)
    dtype = next(model.parameters()).dtype
    widths = sorted({_positive_int("widths", int(w)) for w in widths})
    peak = PEAK_ROWS.get(_device(device).type, PEAK_ROWS["cpu"])
    return {"device": str(_device(device)), "device_name": device_name(device), "dtype": str(dtype).replace("torch.", ""),
            "threads": torch.get_num_threads(), "bandwidth": measure_bandwidth(nbytes, repeats, device),
            "bandwidth_nbytes": nbytes, "nominal_bandwidth": nominal_bandwidth(device), "gemm_shape": [n, k],
            "peak_rows": peak, "flop_rate": measure_matmul(dtype, peak, n, k, repeats, device),
            "flop_rates_by_rows": {str(w): measure_matmul(dtype, w, n, k, repeats, device) for w in widths},
            "phases": []}


# -- what each phase moves and computes ---------------------------------------------------------

def _check_real(name: str, v, low: float, strict: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < low or (strict and v == low):
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {low}, got {v!r}")
    return float(v)


def _bytes(*mods, seen: set | None = None) -> int:
    """Bytes of the parameters and buffers of ``mods`` (tensors or modules), each tensor once."""
    seen = set() if seen is None else seen
    total = 0
    for mod in mods:
        tensors = [mod] if isinstance(mod, torch.Tensor) else [*mod.parameters(), *mod.buffers()]
        for t in tensors:
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
    return total


def _linears(*mods) -> list[nn.Linear]:
    out, seen = [], set()
    for mod in mods:
        for m in mod.modules():
            if isinstance(m, nn.Linear) and id(m) not in seen:
                seen.add(id(m))
                out.append(m)
    return out


def _linear_params(*mods) -> int:
    return sum(m.weight.numel() for m in _linears(*mods))


def _activations(mods, rows: float, itemsize: int) -> float:
    """Bytes in and out of every linear map of ``mods`` for ``rows`` rows."""
    return sum((m.in_features + m.out_features) * rows * itemsize for m in _linears(*mods))


def _kv(n_layers: int, n_kv_heads: int, head_dim: int, slots: float, itemsize: int) -> float:
    return 2.0 * n_layers * n_kv_heads * head_dim * slots * itemsize


def _attention_flops(n_layers: int, n_heads: int, head_dim: int, queries: float, keys: float) -> float:
    return 4.0 * n_layers * n_heads * head_dim * queries * keys  # q k^T and (softmax) v


def _shape_args(width, context, batch):
    return (_check_real("width", width, 1), _check_real("context", context, 0), _check_real("batch", batch, 0, True))


def verifier_forward_cost(model: Llama, width: float, context: float, batch: float = 1,
                          head_rows: float | None = None, sampled: bool = True) -> Cost:
    """One forward of the compact Llama ``model`` over ``width`` positions of ``batch`` rows after
    ``context`` cached ones, its LM head on ``head_rows`` positions per row (default all ``width``), the
    logits then transformed into ``q`` (``sampled``, as the loop does; False: the bare forward)."""
    if not isinstance(model, Llama):
        raise ValueError(f"model must be a compact Llama (lm.llama.Llama), got {type(model).__name__}")
    W, L, B = _shape_args(width, context, batch)
    R = W if head_rows is None else _check_real("head_rows", head_rows, 0)
    a, es = model.args, model.dtype.itemsize
    weights = _bytes(model.layers, model.norm, model.head.weight) + B * W * a.dim * es  # + the embedding rows read
    kv = B * _kv(a.n_layers, a.n_kv_heads, a.head_dim, L + W, es)
    other = _activations([model.layers], B * W, es) + B * R * (a.dim + a.vocab) * es  # the head's in and out
    other += (3 if sampled else 1) * B * R * a.vocab * LAW_BYTES  # float32 logits written (read, q written)
    flops = 2.0 * _linear_params(model.layers) * B * W + 2.0 * model.head.weight.numel() * B * R
    flops += _attention_flops(a.n_layers, a.n_heads, a.head_dim, B * W, L + W)
    return Cost(weights, kv, other, flops)


def draft_step_cost(draft: nn.Module, width: float, context: float, batch: float = 1, head_rows: float = 1) -> Cost:
    """One draft step over ``width`` entries per row after ``context`` cached ones, its head (and the law
    over the whole vocabulary it writes) on ``head_rows`` entries: the EAGLE-3-style ``FeatureDraft``
    (``FeatureDraft.step`` / ``tree_step`` and ``FeatureDrafter._law``; ``fc`` is bookkeeping) or a
    token-level compact Llama draft."""
    W, L, B = _shape_args(width, context, batch)
    R = _check_real("head_rows", head_rows, 0)
    if isinstance(draft, Llama):
        c = verifier_forward_cost(draft, W, L, B, head_rows=R)
        return c + Cost(other=B * R * draft.args.vocab * LAW_BYTES)
    if not isinstance(draft, FeatureDraft):
        raise ValueError(f"draft must be a FeatureDraft or a compact Llama, got {type(draft).__name__}")
    a, es = draft.args, draft.dtype.itemsize
    layer = [draft.embed_norm, draft.feat_norm, draft.attn, draft.mlp_norm, draft.mlp, draft.blocks]
    emb = draft.embed.weight
    weights = _bytes(*layer, draft.norm, draft.head.weight, draft.d2t) + B * W * a.dim * emb.element_size()
    kv = B * _kv(a.n_layers, a.n_kv_heads, a.head_dim, L + W, es)
    other = _activations(layer, B * W, es) + B * R * (a.dim + a.shortlist) * es
    other += B * R * (2 * a.shortlist + a.vocab) * LAW_BYTES  # shortlist logits and law, the full-vocabulary law
    flops = 2.0 * _linear_params(*layer) * B * W + 2.0 * draft.head.weight.numel() * B * R
    flops += _attention_flops(a.n_layers, a.n_heads, a.head_dim, B * W, L + W)
    return Cost(weights, kv, other, flops)


def verify_cost(vocab: int, drafted: float, batch: float = 1) -> Cost:
    """``verify`` / ``verify_tree`` of ``drafted`` tokens or nodes per row: it reads the float32 laws
    ``p`` (drafted, V) and ``q`` (drafted + 1, V); no GEMM."""
    V = _positive_int("vocab", vocab)
    N, B = _check_real("drafted", drafted, 1), _check_real("batch", batch, 0, True)
    return Cost(other=B * (2 * N + 1) * V * LAW_BYTES)


def bookkeeping_cost(draft: nn.Module, verifier: Llama, width: float, batch: float = 1, kept: float = 0) -> Cost:
    """What the loop does after ``verify``: a feature draft fuses the verifier's features at the ``width``
    scored positions (``fc``; a token-level draft reads nothing here) and, on a tree (``kept > 0``), the
    ``kept`` entries of the accepted path are moved into consecutive slots of both caches (read and
    written)."""
    if not isinstance(verifier, Llama):
        raise ValueError(f"verifier must be a compact Llama (lm.llama.Llama), got {type(verifier).__name__}")
    W, B = _check_real("width", width, 1), _check_real("batch", batch, 0, True)
    K = _check_real("kept", kept, 0)
    a = verifier.args
    kv = 2 * B * _kv(a.n_layers, a.n_kv_heads, a.head_dim, K, verifier.dtype.itemsize)
    c = Cost(kv=kv)
    if isinstance(draft, FeatureDraft):
        d, es = draft.args, draft.dtype.itemsize
        c += Cost(kv=2 * B * _kv(d.n_layers, d.n_kv_heads, d.head_dim, K, es))
        c += Cost(weights=_bytes(draft.fc), other=_activations([draft.fc], B * W, es),
                  flops=2.0 * draft.fc.weight.numel() * B * W)
    elif not isinstance(draft, Llama):
        raise ValueError(f"draft must be a FeatureDraft or a compact Llama, got {type(draft).__name__}")
    else:
        c += Cost(kv=2 * B * _kv(draft.args.n_layers, draft.args.n_kv_heads, draft.args.head_dim, K,
                                 draft.dtype.itemsize))
    return c


def phase_cost(phase: str, **kw) -> Cost:
    """The cost of one ``phase``: ``"draft"`` (``draft_step_cost``), ``"verifier"``
    (``verifier_forward_cost``), ``"verify"`` (``verify_cost``) or ``"bookkeeping"`` (``bookkeeping_cost``),
    called with the keyword arguments ``kw``."""
    fns = {"draft": draft_step_cost, "verifier": verifier_forward_cost, "verify": verify_cost,
           "bookkeeping": bookkeeping_cost}
    if phase not in fns:
        raise ValueError(f"phase must be one of {sorted(fns)}, got {phase!r}")
    return fns[phase](**kw)


def step_costs(draft: nn.Module, verifier: Llama, context: float, batch: float = 1, k: int | None = None,
               tree=None, al: float = 1.0) -> dict[str, Cost]:
    """Each phase's cost for one verifier call (``PHASES``), a chain of ``k`` drafts or a ``tree`` (a
    ``core.tree.DynamicTree`` / ``BudgetTree`` or a static parents tuple), at mean ``context`` tokens
    and ``batch`` rows, with ``al`` tokens kept per call (the entries the draft reads first: the pending
    token and the accepted drafts).

    Chain: the first draft step reads the ``al`` pending entries, the other ``k - 1`` one each, the head
    on one row each; the verifier reads ``k + 1`` positions; ``verify`` reads k + (k + 1) laws; the
    bookkeeping fuses ``k + 1`` features. Tree of N verified nodes: the root step as the chain's first,
    then one step per level but the last over that level's (grown) nodes, the head on each; the
    verifier reads N + 1 positions; bookkeeping also moves the ``al`` kept entries."""
    al = _check_real("al", al, 1)
    if (k is None) == (tree is None):
        raise ValueError("give exactly one of k (a chain) and tree")
    V = verifier.args.vocab
    if tree is None:
        k = _positive_int("k", k)
        draft_c = draft_step_cost(draft, al, context, batch)
        if k > 1:
            draft_c += draft_step_cost(draft, 1, context, batch).times(k - 1)
        N, kept = k, 0.0
    else:
        tree = as_tree(tree, "tree")
        sizes = tree_sizes(tree)
        N = tree.nodes  # verified per step (a BudgetTree grows more than it keeps)
        draft_c = draft_step_cost(draft, al, context, batch)
        for s in sizes[:-1]:
            draft_c += draft_step_cost(draft, s, context, batch, head_rows=s)
        kept = al
    return {"draft": draft_c, "verifier": verifier_forward_cost(verifier, N + 1, context, batch),
            "verify": verify_cost(V, N, batch),
            "bookkeeping": bookkeeping_cost(draft, verifier, N + 1, batch, kept=kept)}


def roofline(cost: Cost, bandwidth: float, flop_rate: float | None) -> tuple[float, str]:
    """``(seconds, bound)``: the phase's time at the roof, ``max(bytes / bandwidth, flops / flop_rate)``,
    and which roof binds (``"memory"`` or ``"compute"``)."""
    bandwidth = _check_real("bandwidth", bandwidth, 0, True)
    mem = cost.bytes / bandwidth
    if cost.flops <= 0:
        return mem, "memory"
    flop_rate = _check_real("flop_rate", flop_rate, 0, True)
    comp = cost.flops / flop_rate
    return (mem, "memory") if mem >= comp else (comp, "compute")


def phase_rows(label: str, seconds: dict[str, float], costs: dict[str, Cost], bandwidth: float,
               flop_rate, nominal: float | None = None) -> list[dict]:
    """One dict per phase of ``costs`` (seconds per verifier call in ``seconds``; ``flop_rate`` the compute
    roof, a number or a dict by phase, e.g. a draft in another dtype than the verifier): ``row``, ``phase``,
    ``ms``, ``bytes``, ``flops``, the cost's parts, ``roofline_ms``, ``bound``, ``ratio`` (measured /
    roofline), ``bandwidth_share`` (bytes / measured time over the measured copy bandwidth) and, where
    ``nominal`` (bytes/s) is known, ``nominal_share`` (the same over the nominal bandwidth)."""
    out = []
    for phase, c in costs.items():
        s = seconds[phase]
        roof, bound = roofline(c, bandwidth, flop_rate[phase] if isinstance(flop_rate, dict) else flop_rate)
        r = {"row": label, "phase": phase, "ms": 1e3 * s, **c.as_dict(), "roofline_ms": 1e3 * roof, "bound": bound,
             "ratio": s / roof if roof > 0 else math.nan,
             "bandwidth_share": c.bytes / s / bandwidth if s > 0 else math.nan}
        if nominal:
            r["nominal_share"] = c.bytes / s / nominal if s > 0 else math.nan
        out.append(r)
    return out


def format_table(roof: dict, rules=None) -> str:
    """The markdown table of a run's roofline (``bench_lm``'s ``res["roofline"]``): a line naming the
    machine and its roofs, then one row per (row, phase), only those of the rule labels ``rules`` if given
    (phase rows without a rule, e.g. the verifier alone, always)."""
    n, k = roof["gemm_shape"]
    rates = ", ".join(f"{v / 1e9:.1f} at W = {w}" for w, v in sorted(roof["flop_rates_by_rows"].items(),
                                                                  key=lambda x: int(x[0])))
    head = (f"{roof['device_name']} ({roof['device']}), {roof['dtype']}, {roof['threads']} thread(s): copy bandwidth "
            f"{roof['bandwidth'] / 1e9:.1f} GB/s ({roof['bandwidth_nbytes'] / 2**20:.0f} MiB buffer)")
    if roof.get("nominal_bandwidth"):
        head += f", nominal {roof['nominal_bandwidth'] / 1e9:.0f} GB/s"
    head += (f"; GEMM (m x {k}) by ({k} x {n}): {roof['flop_rate'] / 1e9:.1f} GFLOP/s at m = {roof['peak_rows']} "
             f"(the compute roof); {rates} GFLOP/s")
    nominal = any("nominal_share" in r for r in roof["phases"])
    cols = ["row", "phase", "ms", "MB", "MFLOP", "roofline ms", "bound", "measured / roofline", "bandwidth share"]
    cols += ["nominal share"] if nominal else []
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in roof["phases"]:
        if rules is not None and r.get("rule") is not None and r["rule"] not in rules:
            continue
        cells = [r["row"], r["phase"], f"{r['ms']:.2f}", f"{r['bytes'] / 1e6:.1f}", f"{r['flops'] / 1e6:.1f}",
                 f"{r['roofline_ms']:.2f}", r["bound"], f"{r['ratio']:.1f}x", f"{r['bandwidth_share']:.0%}"]
        cells += [f"{r['nominal_share']:.0%}" if "nominal_share" in r else "-"] if nominal else []
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
