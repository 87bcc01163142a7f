"""Bad input gets a clear error, never a silent answer (issue 17, part 4).

Two layers:
  * one regression test per reproduced report (each failed on the code before this change): a NaN /
    out-of-range / misshapen DropMatch ``hit``, ``assisted_generate`` without an assistant,
    ``speculative_sampling`` with batch > 1, ``verify_flat`` generator keys, ``verify`` on inputs that
    require grad, parameters beyond float32's range, ``solve_target_multi``'s ``max_cuts`` / ``tol``, the
    command line (one line, exit 2, no model loaded), and numpy scalars accepted alike by every rule;
  * hypothesis properties over the public entry points: valid inputs (numpy float64 / float32, torch
    float64 / float32 / float16 / bfloat16, zeros, ties, tiny and huge parameters) give finite laws in
    [0, 1] that sum to 1 within the dtype's tolerance and tokens in [0, V) or the -1 padding; invalid
    inputs raise ``ValueError`` / ``TypeError`` whose message names the argument.
"""

from __future__ import annotations

import contextlib
import io
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import cactus_theory as ct
from cactus_theory import registry
from cactus_theory.rules import DropMatch, MedusaTypical, TargetRule
from cactus_theory.sampler import verify, verify_flat
from cactus_theory.validate import prob_atol
from tests.helpers import cases, fitted

ERRORS = (ValueError, TypeError)
FAST = settings(max_examples=30, derandomize=True, deadline=None)

P3 = np.array([0.2, 0.3, 0.5])
Q3 = np.array([0.5, 0.25, 0.25])


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- reproduced reports --------------------------------------------------------------------------------

@pytest.mark.parametrize("hit, needle", [
    (np.array([[np.nan, 0.5, 0.5], [0.1, 0.2, 0.3]]), "hit must hold probabilities in \\[0, 1\\]"),
    (np.array([[1.5, 0.5, 0.5], [0.1, 0.2, 0.3]]), "hit must hold probabilities in \\[0, 1\\]"),
    (np.array([[-0.1, 0.5, 0.5], [0.1, 0.2, 0.3]]), "hit must hold probabilities in \\[0, 1\\]"),
    (torch.tensor([[float("nan"), 0.5, 0.5], [0.1, 0.2, 0.3]]), "hit must hold probabilities"),
    (np.array(["a", "b", "c"]), "hit must hold probabilities"),
    (np.float64(0.5), "hit must have a vocabulary axis"),
])
def test_dropmatch_hit_refused_when_bound(hit, needle):
    """Before: an all-NaN law or every draft silently rejected."""
    with pytest.raises(ValueError, match=needle):
        DropMatch().at(hit)


def test_dropmatch_hit_of_another_shape_is_never_reshaped():
    """Before: a hit (3, 2) bound for q (2, 3) was silently reshaped (same element count)."""
    p = np.stack([P3, Q3])
    q = np.stack([Q3, P3])
    rule = DropMatch().at(np.full((3, 2), 0.5))
    for call in (lambda: ct.acceptance_rate(rule, p, q), lambda: ct.induced_distribution(rule, p, q),
                 lambda: rule.accept_prob(p, q, np.array([0, 1]))):
        with pytest.raises(ValueError, match=r"hit must have q's shape \(2, 3\), got \(3, 2\)"):
            call()
    # the documented broadcasts still work: one row's hit for every row, and batched exact laws
    one = DropMatch().at(np.array([1.0, 0.0, 0.0]))
    acc = ct.acceptance_rate(one, p, q)
    # phi_0 = 1 (hit), phi_1 and phi_2 = min(1, q/p): an independent hand computation
    want = [P3[0] + P3[1] * min(1, Q3[1] / P3[1]) + P3[2] * min(1, Q3[2] / P3[2]),
            Q3[0] + Q3[1] * min(1, P3[1] / Q3[1]) + Q3[2] * min(1, P3[2] / Q3[2])]
    np.testing.assert_allclose(acc, want, rtol=1e-12)
    batched = ct.induced_distribution(DropMatch().at(np.full((2, 3), 0.3)), p, q)
    rows = [ct.induced_distribution(DropMatch().at(np.full(3, 0.3)), p[i], q[i]) for i in range(2)]
    np.testing.assert_allclose(batched, np.stack(rows), atol=1e-15)


def test_assisted_generate_without_assistant_is_refused():
    import cactus_theory.integrations.transformers as ct_tf

    class Model:
        def generate(self, **kw):  # pragma: no cover - must not be reached
            raise AssertionError("generate ran without an assistant: the rule would never be called")

    with pytest.raises(ValueError, match="assistant_model is None"):
        ct_tf.assisted_generate(Model(), None, ct.SpS(), max_new_tokens=3)


def test_speculative_sampling_refuses_batch_above_one():
    """Before: row 1 came back as placeholder ids. transformers' own function is batch 1 only."""
    import cactus_theory.integrations.transformers as ct_tf
    V, k = 5, 2
    ids = torch.zeros((2, 4 + k), dtype=torch.long)
    with pytest.raises(ValueError, match="batch 1.*batch 2"):
        ct_tf.speculative_sampling(ct.SpS(), ids, torch.zeros(2, k, V), k, torch.zeros(2, k + 1, V))
    with pytest.raises(ValueError, match="candidate_length = 3 does not match"):
        ct_tf.speculative_sampling(ct.SpS(), ids[:1], torch.zeros(1, k, V), 3, torch.zeros(1, k + 1, V))
    with pytest.raises(ValueError, match="candidate_length must be an integer >= 0"):
        ct_tf.speculative_sampling(ct.SpS(), ids[:1], torch.zeros(1, k, V), -1, torch.zeros(1, k + 1, V))
    with pytest.raises(ValueError, match="new_logits has NaN"):
        ct_tf.speculative_sampling(ct.SpS(), ids[:1], torch.zeros(1, k, V), k, torch.full((1, k + 1, V), math.nan))
    with pytest.raises(ValueError, match="rule must be a cactus_theory Rule"):
        ct_tf.speculative_sampling("sps", ids[:1], torch.zeros(1, k, V), k, torch.zeros(1, k + 1, V))


def _flat(B=2, V=4):
    counts = [2, 1][:B]
    T = sum(counts)
    probs = torch.full((T, V), 1.0 / V)
    return (torch.zeros(T, dtype=torch.long), torch.tensor(np.cumsum(counts)), None, probs,
            torch.zeros((B, 1), dtype=torch.long), ct.SpS())


@pytest.mark.parametrize("gens, needle", [
    ({-1: None}, "key -1 is not a request index in \\[0, 2\\)"),  # before: silently the last request
    ({2: None}, "key 2 is not a request index"),  # before: IndexError
    ({"0": None}, "key '0' must be a request index"),  # before: TypeError from torch
    ({0.0: None}, "key 0.0 must be a request index"),
    ({True: None}, "key True must be a request index"),
    ({0: 7}, "the value for request 0 must be a torch.Generator, got int"),
])
def test_verify_flat_generator_keys(gens, needle):
    gens = {k: (_gen() if v is None else v) for k, v in gens.items()}
    with pytest.raises(ValueError, match=f"^generator: {needle}"):
        verify_flat(*_flat(), generator=gens)


def test_verify_flat_numpy_integer_keys_work():
    out_np = verify_flat(*_flat(), generator={np.int64(1): _gen(3)})
    out_py = verify_flat(*_flat(), generator={1: _gen(3)})
    assert torch.equal(out_np[1], out_py[1])


def test_verify_reads_requires_grad_inputs_detached():
    """Before: a RuntimeError from torch.where(out=...) on tensors that require grad."""
    torch.manual_seed(0)
    B, k, V = 4, 3, 6
    p = torch.rand(B, k, V).softmax(-1)
    q = torch.rand(B, k + 1, V).softmax(-1)
    n = torch.randint(0, V, (B, k))
    for rule in (ct.SpS(), ct.Cactus(0.5), ct.TAS(), ct.TopK(2, recovery="topk")):
        want = verify(n, p, q, rule, generator=_gen(1))
        got = verify(n, p.clone().requires_grad_(), q.clone().requires_grad_(), rule, generator=_gen(1))
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        assert not got[0].requires_grad
        flat_want = verify_flat(n.reshape(-1), torch.arange(1, B + 1) * k, p.reshape(-1, V), q[:, :k].reshape(-1, V),
                                torch.zeros((B, 1), dtype=torch.long), rule, _gen(2))
        flat_got = verify_flat(n.reshape(-1), torch.arange(1, B + 1) * k, p.reshape(-1, V).requires_grad_(),
                               q[:, :k].reshape(-1, V).requires_grad_(), torch.zeros((B, 1), dtype=torch.long), rule,
                               _gen(2))
        assert torch.equal(flat_got, flat_want)


@pytest.mark.parametrize("make, needle", [
    (lambda: ct.TAS(epsilon=1e39), "^epsilon must be a positive number \\(at most 65504"),
    (lambda: ct.TAS(epsilon=1e5), "^epsilon must be a positive number \\(at most 65504"),
    (lambda: MedusaTypical(1e39), "^epsilon must be a positive number \\(at most 65504"),
    (lambda: MedusaTypical(epsilon=True), "^epsilon must be a positive number, got True"),
    (lambda: MedusaTypical(alpha=float("nan")), "^alpha must be a positive number, got nan"),
    (lambda: ct.TAS(alpha=np.bool_(True)), "^alpha must be a positive number, got"),
    (lambda: ct.Cactus(delta="0.5"), "^delta must be finite and >= 0, got '0.5'"),
    (lambda: ct.Cactus(delta=10**400), "^delta must be finite and >= 0, got 1000"),  # beyond float64: not an OverflowError
    (lambda: ct.EARS(beta=-10**400), "^beta must be finite and >= 0"),
    (lambda: ct.Cactus(0.5, divergence=["kl"]), "^divergence must be one of"),
    (lambda: ct.TopK(2.0), "^k must be an integer >= 1, got 2.0"),
    (lambda: DropMatch(num_paths=np.float64(2)), "^num_paths must be an integer >= 0"),
    (lambda: ct.SGLangThreshold(threshold_acc=0.0), "^threshold_acc must be a number in \\(0, 1\\]"),
    (lambda: ct.SGLangThreshold(threshold_acc=1e-300), "^threshold_acc must be >= 2\\^-24"),  # NaN in float32
    (lambda: ct.FLy(window_accept=np.float32(1.5)), "^window_accept must be a number in \\[0, 1\\]"),
])
def test_rule_parameters_refused_by_name(make, needle):
    with pytest.raises(ERRORS, match=needle):
        make()


def test_epsilon_at_its_limit_works_in_every_dtype_and_acts_as_one():
    """The bound is float16's largest value: there the clip works in every dtype, and every epsilon >= 1
    gives the same law as epsilon = 1 (the threshold is compared with q_n <= 1)."""
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(7), size=5), rng.dirichlet(np.full(7, 0.3), size=5)
    for cls in (ct.TAS, MedusaTypical):
        big, one = cls(epsilon=65504.0, alpha=2.0), cls(epsilon=1.0, alpha=2.0)
        np.testing.assert_array_equal(ct.induced_distribution(big, p, q), ct.induced_distribution(one, p, q))
        n = torch.tensor(rng.integers(0, 7, 5))
        for dt in (torch.float16, torch.bfloat16, torch.float32):
            pt, qt = torch.tensor(p).to(dt), torch.tensor(q).to(dt)
            a = big.accept_prob(pt, qt, n)
            assert torch.equal(a, one.accept_prob(pt, qt, n))
            tokens, a = verify(n.view(5, 1), pt.view(5, 1, 7), torch.stack([qt, qt], 1), big, generator=_gen())
            _assert_tokens(tokens, a, 7, 1)


def test_solve_target_multi_refuses_max_cuts_and_tol():
    from cactus_theory.optimize import solve_target_multi

    args = (np.array([0.5, 0.5]), np.array([0.3, 0.7]), 0.1, 1)
    for kw, needle in ((dict(max_cuts=0), "^max_cuts must be an integer >= 1, got 0"),  # before: UnboundLocalError
                       (dict(max_cuts=2.5), "^max_cuts must be an integer >= 1"),
                       (dict(tol=-1e-9), "^tol must be finite and >= 0, got -1e-09"),  # before: accepted
                       (dict(tol=float("nan")), "^tol must be finite and >= 0, got nan"),
                       (dict(max_cells=0), "^max_cells must be an integer >= 1"),
                       (dict(method=None), "^method must be")):
        with pytest.raises(ERRORS, match=needle):
            solve_target_multi(*args, method=kw.pop("method", "dual"), **kw)
    # numpy scalars and a zero tolerance are fine, and agree with the plain call
    a = solve_target_multi(*args, method="dual", max_cuts=np.int64(50), tol=np.float32(0.0))
    b = solve_target_multi(*args, method="dual", max_cuts=50, tol=0.0)
    assert a.value == pytest.approx(b.value, abs=1e-7) and 0 <= a.value <= 1


# the command line: one line, exit 2, before any model loads

CLI_CASES = [
    (["eval", "--device", "banana"], "--device 'banana' is not a torch device"),
    (["eval", "--device", "cuda:99"], "--device 'cuda:99'"),
    (["eval", "--out", "/proc/no/such"], "--out '/proc/no/such': cannot write in folder"),
    (["eval", "--out", "{file}/sub"], "is a file, not a folder"),
    (["eval", "--cache", "{file}"], "--cache"),
    (["eval", "--draft", "./no/such/draft.gguf"], "--draft './no/such/draft.gguf': no such .gguf file"),
    (["eval", "--verifier", "/no/such/folder"], "--verifier '/no/such/folder': no such file or folder"),
    (["eval", "--threads", "0"], "--threads"),
    (["eval", "--tree", "0"], "--tree must be an integer >= 1"),
    (["eval", "--tree", "16", "--tree-depth", "0"], "--tree-depth must be an integer >= 1"),
    (["eval", "--tree", "16", "--tree-depth", "2", "--tree-topk", "2"], "--tree 16 --tree-depth 2 --tree-topk 2: nodes"),
    (["eval", "--vllm-arg", "data_parallel_size=2"], "--vllm-arg goes with --engine vllm"),
    (["eval", "--engine", "vllm", "--vllm-arg", "model=x"], "--vllm-arg model: the eval sets model itself"),
    (["eval", "--engine", "vllm", "--vllm-draft-method", "draft_model"], "draft_model needs a causal LM as --draft"),
    (["eval", "--engine", "vllm", "--draft", "Qwen/Qwen3-0.6B", "--verifier", "Qwen/Qwen3-8B", "--seed", "-4"],
     "--seed must be an integer >= 0"),
    (["build-draft", "--threads", "-1"], "--threads: must be an integer >= 1"),
    (["build-draft", "--epochs", "0"], "epochs must be an integer >= 1"),
    (["decode", "--prompt", "x", "--json", "/proc/out.json"], "--json '/proc/out.json': cannot write"),
    (["decode", "--prompt", "x", "--json", "{file}/out.json"], "is a file, not a folder"),
]


@pytest.mark.parametrize("argv, needle", CLI_CASES, ids=[" ".join(a) for a, _ in CLI_CASES])
def test_cli_refuses_before_any_model_loads(argv, needle, tmp_path, monkeypatch):
    from cactus_theory import cli
    from cactus_theory.lm import pair
    from cactus_theory.lm.experiments import eval as lm_eval
    from cactus_theory.lm.train import draft_build

    def no_load(*a, **kw):
        raise AssertionError(f"a model load was attempted for {argv}")

    for mod, name in ((pair, "load_pair"), (pair, "load_model"), (lm_eval, "load_eval_pair"),
                      (draft_build, "build_draft"), (draft_build, "load_model")):
        if hasattr(mod, name):
            monkeypatch.setattr(mod, name, no_load)
    monkeypatch.setattr(torch, "set_num_threads", no_load)  # build-draft's first step on main
    f = tmp_path / "a_file"
    f.write_text("x")
    argv = [a.replace("{file}", str(f)) for a in argv]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            rc = cli.main(argv)
        except SystemExit as e:
            rc = e.code
    text = err.getvalue()
    assert rc == 2, (argv, rc, text)
    assert text.count("\n") == 1 and text.startswith("cactus-theory") and "Traceback" not in text, text
    assert needle in text, text


# numpy scalars: every rule accepts them alike and stores Python numbers

def _numeric_params():
    out = []
    for key, sp in registry.RULES.items():
        for prm in sp.params:
            if prm.type in (int, float):
                out.append((key, prm.name, prm.type))
    return out


@pytest.mark.parametrize("key, name, kind", _numeric_params())
def test_numpy_scalars_are_accepted_by_every_rule(key, name, kind):
    base = 2 if kind is int else 0.5  # exact in float16, inside every parameter's range
    plain = registry.make(key, **{name: base})
    np_types = (np.int64, np.int32, np.uint8) if kind is int else (np.float64, np.float32, np.float16)
    for t in np_types:
        r = registry.make(key, **{name: t(base)})
        v = getattr(r, name)
        assert type(v) is kind and v == getattr(plain, name), (t, v)
        assert r == plain and repr(r) == repr(plain)
    with pytest.raises(ERRORS, match=f"^{name} must be"):
        registry.make(key, **{name: np.bool_(True)})
    with pytest.raises(ERRORS, match=f"^{name} must be"):
        registry.make(key, **{name: True})
    with pytest.raises(ERRORS, match=f"^{name} must be"):
        registry.make(key, **{name: np.array([base])})  # an array is not a scalar
    if kind is float:
        for bad in (math.nan, math.inf, -math.inf):
            with pytest.raises(ValueError, match=f"^{name} must be"):
                registry.make(key, **{name: bad})


# -- properties over the public entry points -------------------------------------------------------------

DTYPES = ("np64", "np32", "np16", "t64", "t32", "t16", "tbf16")
FLOAT_VALUES = [0.0, 1e-300, 1e-12, 0.09, 0.3, 0.5, 1.0, 2.5, 1e4, 65504.0, 1e30, 3.4e38, 1e39, 1e300,
                -0.5, math.nan, math.inf, True, "0.5", None, np.float32(0.3), np.float64(0.7), np.int64(1),
                np.float16(0.25)]
INT_VALUES = [0, 1, 2, 3, 7, 10**6, -1, 1.5, True, "2", None, np.int64(2), np.int32(1), np.uint8(3)]
STR_VALUES = ["bogus", 3, None, ["kl"]]


@st.composite
def rule_params(draw):
    key = draw(st.sampled_from(list(registry.RULES)))
    sp = registry.RULES[key]
    params = {}
    for prm in sp.params:
        if not draw(st.booleans()):
            continue  # keep the default
        if prm.type is float:
            params[prm.name] = draw(st.sampled_from(FLOAT_VALUES))
        elif prm.type is int:
            params[prm.name] = draw(st.sampled_from(INT_VALUES))
        else:
            params[prm.name] = draw(st.sampled_from(list(prm.choices or ()) + STR_VALUES))
    return key, params


def _convert(x: np.ndarray, kind: str):
    if kind == "np64":
        return x.astype(np.float64)
    if kind == "np32":
        return x.astype(np.float32)
    if kind == "np16":
        return x.astype(np.float16)
    dt = {"t64": torch.float64, "t32": torch.float32, "t16": torch.float16, "tbf16": torch.bfloat16}[kind]
    return torch.tensor(x).to(dt)


def _np(x) -> np.ndarray:
    return x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, dtype=np.float64)


def _assert_law(h, like, what: str):
    """``h`` (..., V) finite, non-negative and summing to 1 within ``like``'s dtype tolerance."""
    a = _np(h)
    atol = prob_atol(like)
    assert np.all(np.isfinite(a)), (what, a)
    assert a.min() >= -atol, (what, a)
    np.testing.assert_allclose(a.sum(-1), 1.0, atol=atol, err_msg=what)


def _build(key, params):
    """The rule, or None after checking that the refusal names one of the parameters set."""
    try:
        return registry.make(key, **params)
    except ERRORS as e:
        msg = str(e)
        assert params and any(name in msg for name in params), (key, params, msg)
        return None


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numpy float16 / float32 saturate
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # in an untaken where() branch
@settings(max_examples=150, derandomize=True, deadline=None)  # about 60 of them build a rule (the rest: refusals)
@given(rule_params(), cases(max_V=8), st.sampled_from(DTYPES), st.integers(0, 2**31 - 1))
def test_every_rule_valid_or_named_and_finite_in_every_dtype(kp, case, kind, seed):
    key, params = kp
    rule = _build(key, params)
    if rule is None:
        return
    p64, q64, n0 = case
    V = p64.size
    rng = np.random.default_rng(seed)
    rule = fitted(rule, V)
    P, Q = np.stack([p64, q64]), np.stack([q64, p64])  # two rows (batched), both orders
    N = np.array([n0, rng.integers(V)])
    if isinstance(rule, DropMatch):
        rule = rule.at(rng.uniform(size=(2, V)) * (rng.uniform() < 0.8))
    p, q = _convert(P, kind), _convert(Q, kind)
    n = torch.tensor(N) if isinstance(p, torch.Tensor) else N
    if rule.stateful:  # SequenceBudget: no one-step law (refused by its flag); judged through a state by verify
        with pytest.raises(ValueError, match="stateful"):
            ct.induced_distribution(rule, p, q)
        if isinstance(p, torch.Tensor):
            state = rule.start(2, max_tokens=8)
            pt, qt = torch.stack([p, p.flip(0)], 1), torch.stack([q, q.flip(0), q], 1)
            tokens, a = verify(torch.stack([n, n.flip(0)], 1), pt, qt, rule, generator=_gen(seed), state=state)
            _assert_tokens(tokens, a, V, 2)
            assert np.all(np.isfinite(state.spent)) and np.all(state.spent <= rule.budget), state
        return
    phi = _np(rule.accept_prob(p, q, n))
    assert phi.shape == (2,) and np.all(np.isfinite(phi)) and np.all((phi >= 0) & (phi <= 1)), phi
    _assert_law(rule.residual(p, q, n), p, f"{rule!r} residual")
    if isinstance(rule, TargetRule):
        _assert_law(rule.target(p, q, n), p, f"{rule!r} target")
    # exact laws (float64 whatever the input)
    h = ct.induced_distribution(rule, p, q)
    _assert_law(h, np.zeros(1), f"{rule!r} induced")
    acc = ct.acceptance_rate(rule, p, q)
    assert np.all(np.isfinite(acc)) and np.all((acc >= -1e-12) & (acc <= 1 + 1e-12)), acc
    # batched verification in torch: tokens in [0, V), then -1 padding
    if isinstance(p, torch.Tensor):
        k = 2
        pt = torch.stack([p, p.flip(0)], 1)  # (B, k, V)
        qt = torch.stack([q, q.flip(0), q], 1)  # (B, k + 1, V)
        nt = torch.stack([n, n.flip(0)], 1)
        tokens, a = verify(nt, pt, qt, rule, generator=_gen(seed))
        _assert_tokens(tokens, a, V, k)


def _assert_tokens(tokens, a, V, k):
    tokens, a = tokens.long(), a.long()
    assert tokens.shape[1] == k + 1
    assert ((a >= 0) & (a <= k)).all()
    for row, ai in zip(tokens, a, strict=True):
        emitted, pad = row[: int(ai) + 1], row[int(ai) + 1:]
        assert ((emitted >= 0) & (emitted < V)).all() and (pad == -1).all(), (row, ai)


CORRUPTIONS = ("nan", "inf", "negative", "unnormalised", "vocab", "n_range", "n_float", "int_probs", "list",
               "no_vocab_axis")


def _corrupt(how, p, q, n, rng):
    """One bad argument; returns (p, q, n, name of the argument the message must name)."""
    p, q, n = p.copy(), q.copy(), n.copy()
    i, j = rng.integers(p.shape[0]), rng.integers(p.shape[-1])
    target = "p" if rng.uniform() < 0.5 else "q"
    arr = p if target == "p" else q
    if how == "nan":
        arr[i, j] = np.nan
    elif how == "inf":
        arr[i, j] = np.inf
    elif how == "negative":
        arr[i, j] -= 0.5
        arr[i, (j + 1) % arr.shape[-1]] += 0.5
    elif how == "unnormalised":
        arr *= 1.5
    elif how == "vocab":
        q = np.concatenate([q, np.zeros((q.shape[0], 1))], -1)
        return p, q, n, "p and q must have the same shape"
    elif how == "n_range":
        n[0] = p.shape[-1] if rng.uniform() < 0.5 else -1
        return p, q, n, "n has token ids out of range"
    elif how == "n_float":
        return p, q, n.astype(np.float64), "n must hold integer"
    elif how == "int_probs":
        arr = arr.astype(np.int64)
    elif how == "list":
        arr = arr.tolist()
    elif how == "no_vocab_axis":
        return np.asarray(p[0, 0]), np.asarray(q[0, 0]), np.array(0), "vocabulary axis"  # 0-d arrays, not scalars
    if target == "p":
        p = arr
    else:
        q = arr
    return p, q, n, target


@settings(max_examples=80, derandomize=True, deadline=None)
@given(st.sampled_from(list(registry.RULES)), cases(max_V=6), st.sampled_from(CORRUPTIONS),
       st.sampled_from(("numpy", "torch")), st.integers(0, 2**31 - 1))
def test_every_rule_entry_point_names_the_bad_argument(key, case, how, kind, seed):
    p64, q64, n0 = case
    rng = np.random.default_rng(seed)
    V = p64.size
    rule = fitted(registry.make(key), V)
    if isinstance(rule, DropMatch):
        rule = rule.at(np.full((2, V), 0.5))
    P, Q, N = np.stack([p64, q64]), np.stack([q64, p64]), np.array([n0, 0])
    p, q, n, name = _corrupt(how, P, Q, N, rng)
    if kind == "torch" and how != "list":
        p, q = (torch.tensor(np.asarray(x)) for x in (p, q))
        n = torch.tensor(n) if isinstance(n, np.ndarray) else n
    calls = [lambda: rule.accept_prob(p, q, n), lambda: rule.residual(p, q, n)]
    if isinstance(rule, TargetRule):
        calls.append(lambda: rule.target(p, q, n))
    for call in calls:
        with pytest.raises(ERRORS) as e:
            call()
        assert name in str(e.value), (how, str(e.value))
    if how in ("nan", "inf", "negative", "unnormalised", "vocab"):  # the exact laws read p and q only
        for call in (lambda: ct.induced_distribution(rule, p, q), lambda: ct.acceptance_rate(rule, p, q),
                     lambda: ct.step_divergence(rule, p, q)):
            with pytest.raises(ValueError) as e:
                call()
            assert name in str(e.value), (how, str(e.value))


@FAST
@given(st.integers(1, 4), st.integers(1, 4), st.integers(2, 9), st.sampled_from(("t64", "t32", "t16", "tbf16")),
       st.sampled_from([0.05, 0.3, 1.0, 50.0]), st.booleans(), st.integers(0, 2**31 - 1))
def test_verify_and_verify_flat_tokens_in_range(B, k, V, kind, conc, ties, seed):
    """Dirichlet rows (a small concentration gives exact zeros after the cast, ties give equal masses)."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(V, conc), size=(B, k))
    q = rng.dirichlet(np.full(V, conc), size=(B, k + 1))
    if ties:
        q[..., : V // 2 + 1] = q[..., : V // 2 + 1].mean(-1, keepdims=True)
    pt, qt = _convert(p, kind), _convert(q, kind)
    n = torch.tensor(rng.integers(0, V, (B, k)))
    for rule in (ct.SpS(), ct.Cactus(1e300), ct.Cactus(1e-300), ct.TAS(epsilon=65504.0, alpha=1e300), ct.EARS(1e300),
                 ct.TopK(V), ct.Interpolation(1.0), ct.FLy(entropy_threshold=0.0)):
        tokens, a = verify(n, pt, qt, rule, generator=_gen(seed))
        _assert_tokens(tokens, a, V, k)
        counts = torch.tensor(rng.integers(0, k + 1, B))
        T = int(counts.sum())
        rows = torch.cat([torch.arange(c) + b * k for b, c in enumerate(counts.tolist())]).long()
        out = verify_flat(n.reshape(-1)[rows], counts.cumsum(0), pt.reshape(-1, V)[rows], qt[:, :k].reshape(-1, V)[rows],
                          torch.tensor(rng.integers(0, V, (B, 1))), rule, {0: _gen(seed)}, max_spec_len=k)
        assert out.shape == (B, k + 1) and T == int(counts.sum())
        for b in range(B):
            row = out[b].long()
            m = int((row >= 0).sum())
            assert 1 <= m <= int(counts[b]) + 1 and ((row[:m] >= 0) & (row[:m] < V)).all() and (row[m:] == -1).all()


@FAST
@given(cases(max_V=6), st.sampled_from(DTYPES), st.sampled_from(sorted(ct.DIVERGENCES)))
def test_divergence_finite_or_infinite_never_nan(case, kind, name):
    p64, q64, _ = case
    h, q = _convert(np.stack([p64, q64]), kind), _convert(np.stack([q64, q64]), kind)
    d = _np(ct.divergence(h, q, name))
    assert d.shape == (2,) and not np.isnan(d).any() and (d >= -prob_atol(h) * 10).all(), d
    assert abs(d[1]) <= 10 * prob_atol(h) or name == "cross_entropy"  # D(q || q) = 0
    if name in ("tv", "hellinger", "js"):  # bounded divergences
        assert np.isfinite(d).all()


@pytest.mark.parametrize("call, needle", [
    (lambda: ct.divergence([0.5, 0.5], np.array([0.5, 0.5])), "^h must be a numpy array or a torch tensor"),
    (lambda: ct.divergence(np.array([0.5, 0.5]), np.array([0.5, 0.5]), ["kl"]), "^divergence must be one of"),
    (lambda: ct.divergence(np.array([0.5, 0.5]), torch.tensor([0.5, 0.5])), "^h and q must both be"),
    (lambda: ct.induced_distribution(ct.SpS(), P3, Q3, method=None), "^method must be"),
    (lambda: verify(torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, 2) / 2, torch.ones(1, 2, 2) / 2,
                    ct.SpS(), generator=np.random.default_rng(0)), "^generator must be a torch.Generator"),
    (lambda: verify_flat(*_flat(), max_spec_len=1), "^max_spec_len must be an integer >= 2"),
    (lambda: verify_flat(*_flat(), max_spec_len=2.0), "^max_spec_len must be an integer"),
])
def test_other_entry_points_name_the_argument(call, needle):
    with pytest.raises(ERRORS, match=needle):
        call()


@FAST
@given(st.integers(2, 6), st.integers(1, 200), st.sampled_from(["auto", "exact", "montecarlo"]),
       st.sampled_from(["chi2", "gtest"]), st.integers(0, 2**31 - 1))
def test_goodness_of_fit_pvalues_in_unit_interval(V, N, method, statistic, seed):
    from cactus_theory.stats import goodness_of_fit

    rng = np.random.default_rng(seed)
    e = rng.dirichlet(np.full(V, 0.5))
    e[rng.integers(V)] += 0.0  # ties and tiny masses come from the small concentration
    x = rng.choice(V, size=N, p=e / e.sum())
    if method == "exact" and math.comb(N + V - 1, V - 1) > 200_000:
        method = "montecarlo"
    res = goodness_of_fit(x, e, method=method, statistic=statistic, n_sim=500, seed=np.int64(seed % 100),
                          kind="samples")
    assert 0 <= res.pvalue <= 1 and np.isfinite(res.statistic) and res.statistic >= -1e-12


@pytest.mark.parametrize("kw, needle", [
    (dict(alpha=0.0), "^alpha must be in \\(0, 1\\), got 0.0"),
    (dict(alpha=True), "^alpha must be in \\(0, 1\\), got True"),
    (dict(alpha=math.nan), "^alpha must be in \\(0, 1\\)"),
    (dict(n_sim=0), "^n_sim must be an integer >= 1"),
    (dict(min_expected=-1.0), "^min_expected must be finite and >= 0"),
    (dict(method=None), "^method must be"),
    (dict(statistic=["chi2"]), "^statistic must be"),
])
def test_goodness_of_fit_names_the_argument(kw, needle):
    from cactus_theory.stats import goodness_of_fit

    with pytest.raises(ERRORS, match=needle):
        goodness_of_fit(np.array([0, 1, 1]), np.array([0.5, 0.5]), **kw)
    # numpy float alpha accepted like a Python float
    a = goodness_of_fit(np.array([0, 1, 1]), np.array([0.5, 0.5]), alpha=np.float32(0.05))
    b = goodness_of_fit(np.array([0, 1, 1]), np.array([0.5, 0.5]), alpha=0.05)
    assert a.pvalue == b.pvalue


@settings(max_examples=6, derandomize=True, deadline=None)
@given(cases(max_V=4), st.sampled_from([0.0, 1e-3, 0.3, 1e6]), st.sampled_from(["kl", "tv", "chi2"]))
def test_solve_target_valid_inputs_give_laws(case, delta, div):
    from cactus_theory.optimize import solve_target

    p, q, n = case
    res = solve_target(q, np.int64(n), np.float64(delta), div, p=p)
    _assert_law(res.h, np.zeros(1), "solve_target")
    assert res.gamma >= q[n] - 1e-6 and 0 <= res.objective <= 1 + 1e-9


@pytest.mark.parametrize("kw, needle", [
    (dict(n=3), "^n has token ids out of range"),
    (dict(n=1.0), "^n must hold integer"),
    (dict(delta=-1.0), "^delta must be finite and >= 0"),
    (dict(delta=math.inf), "^delta must be finite and >= 0"),
    (dict(delta=True), "^delta must be finite and >= 0, got True"),
    (dict(divergence=["kl"]), "^divergence must be one of"),
    (dict(q=np.array([0.5, np.nan, 0.5])), "^q contains NaN"),
    (dict(p=np.array([0.5, 0.5])), "^p and q must have the same shape"),
])
def test_solve_target_names_the_argument(kw, needle):
    from cactus_theory.optimize import solve_target

    args = dict(q=np.array([0.2, 0.3, 0.5]), n=0, delta=0.1, divergence="kl", p=None)
    args.update(kw)
    with pytest.raises(ERRORS, match=needle):
        solve_target(args["q"], args["n"], args["delta"], args["divergence"], p=args["p"])


@settings(max_examples=10, derandomize=True, deadline=None)
@given(st.integers(0, 3), st.integers(2, 7), st.sampled_from([0.5, 1.0, 20.0]), st.integers(0, 2**31 - 1),
       st.sampled_from([ct.SpS(), ct.Cactus(1.0), ct.TAS(), ct.TopK(1)]))
def test_transformers_speculative_sampling_tokens_in_range(k, V, scale, seed, rule):
    import cactus_theory.integrations.transformers as ct_tf
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (1, 3 + k), generator=g)
    cand = torch.randn(1, k, V, generator=g) * scale
    cand[..., 0] = -math.inf  # a token the draft's top-k removed
    new = torch.randn(1, k + 1, V, generator=g) * scale
    if k:
        ids[0, -k:] = torch.distributions.Categorical(logits=cand[0]).sample()
    toks, a = ct_tf.speculative_sampling(rule, ids, cand, k, new, generator=g)
    assert toks.shape == (1, int(a) + 1) and 0 <= int(a) <= k
    assert ((toks >= 0) & (toks < V)).all()
    assert torch.equal(toks[0, : int(a)], ids[0, -k:][: int(a)]) if k else int(a) == 0


# every numeric parameter at the ends of its valid range, in every dtype, on the adversarial cases

def _valid(key, name, v) -> bool:
    try:
        registry.make(key, **{name: v})
        return True
    except ValueError:
        return False


def _extremes():
    out = []
    for key, name, kind in _numeric_params():
        lo = 1 if kind is int else 0.0
        if (key, name) in (("sglang", "threshold_acc"),):
            lo = 2.0 ** -24  # its smallest valid value (float16's smallest positive number)
        if kind is int:
            hi = 10**6
            if not _valid(key, name, hi):  # a bounded integer (SpS's rand_bits): its largest valid value, by bisection
                a, b = lo, hi
                while b - a > 1:
                    a, b = ((a + b) // 2, b) if _valid(key, name, (a + b) // 2) else (a, (a + b) // 2)
                hi = a
            vals = [lo, hi]
        else:
            probe = [lo, 1e-300, 1.0, 65504.0, 1e300]
            vals = []
            for v in probe:
                try:
                    registry.make(key, **{name: v})
                    vals.append(v)
                except ValueError:
                    pass
        out += [(key, name, v) for v in vals]
    return out


def _stateful_extremes(rule, P, Q, N, kind_case):
    """A stateful rule (SequenceBudget) at an extreme parameter, in every dtype: the Cactus its plan judges each
    row with gives valid acceptance and recovery laws, and ``verify`` with a state emits valid tokens and
    charges finite nats within the budget."""
    for dk in DTYPES:
        p, q = _convert(P, dk), _convert(Q, dk)
        n = torch.tensor(N) if isinstance(p, torch.Tensor) else N
        state = rule.start(2, max_tokens=8)
        judge = rule.plan(state, p[:, None], q[:, None]).rows(np.arange(2), np.zeros(2, dtype=int))
        phi = _np(judge.accept_prob(p, q, n))
        assert np.all(np.isfinite(phi)) and np.all((phi >= 0) & (phi <= 1)), (rule, dk, kind_case, phi)
        _assert_law(judge.residual(p, q, n), p, f"{rule!r} {dk} {kind_case} residual")
        if isinstance(p, torch.Tensor):
            tokens, a = verify(torch.stack([n, n.flip(0)], 1), torch.stack([p, p.flip(0)], 1),
                               torch.stack([q, q.flip(0), q], 1), rule, generator=_gen(), state=state)
            _assert_tokens(tokens, a, 5, 2)
            assert np.all(np.isfinite(state.spent)) and np.all(state.spent <= rule.budget), (rule, dk, state)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numpy float16 / float32 saturate
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # in an untaken where() branch
@pytest.mark.parametrize("key, name, value", _extremes())
def test_extreme_valid_parameters_stay_finite_in_every_dtype(key, name, value):
    from cactus_theory.theory.cases import make_pair

    base = registry.make(key, **{name: value})
    if key == "cactus" and value != 1.0:  # every divergence of the exact solver too, at the ends
        rules = [base] + [ct.Cactus(value, d, "exact") for d in ct.F_DIVERGENCES]
    else:
        rules = [base]
    rng = np.random.default_rng(0)
    for kind_case in ("onehot_q", "disjoint", "zeros_in_p", "qn_one", "tiny_qn", "topk_tie"):
        p64, q64, n0 = make_pair(kind_case, 5, rng)
        P, Q, N = np.stack([p64, q64]), np.stack([q64, p64]), np.array([n0, 4])
        for i, rule in enumerate(rules):
            if i and kind_case not in ("qn_one", "tiny_qn"):
                continue  # the exact solvers (about 20 ms a call: a bracketing solve) on the two hardest cases
            rule = fitted(rule, 5)
            if isinstance(rule, DropMatch):
                rule = rule.at(np.stack([np.linspace(0, 1, 5), np.zeros(5)]))
            if rule.stateful:  # judged through a state: its plan's per-row Cactus, and verify with the state
                _stateful_extremes(rule, P, Q, N, kind_case)
                continue
            for dk in (DTYPES if i == 0 else ("np32", "t16", "tbf16")):
                p, q = _convert(P, dk), _convert(Q, dk)
                n = torch.tensor(N) if isinstance(p, torch.Tensor) else N
                phi = _np(rule.accept_prob(p, q, n))
                assert np.all(np.isfinite(phi)) and np.all((phi >= 0) & (phi <= 1)), (rule, dk, kind_case, phi)
                _assert_law(rule.residual(p, q, n), p, f"{rule!r} {dk} {kind_case} residual")
                if isinstance(rule, TargetRule):
                    _assert_law(rule.target(p, q, n), p, f"{rule!r} {dk} {kind_case} target")
                if isinstance(p, torch.Tensor):
                    tokens, a = verify(torch.stack([n, n.flip(0)], 1), torch.stack([p, p.flip(0)], 1),
                                       torch.stack([q, q.flip(0), q], 1), rule, generator=_gen())
                    _assert_tokens(tokens, a, 5, 2)
            _assert_law(ct.induced_distribution(rule, P, Q), P, f"{rule!r} {kind_case} induced")


def test_transformers_helpers_name_the_argument():
    import cactus_theory.integrations.transformers as ct_tf
    with pytest.raises(ValueError, match="^generator must be a torch.Generator or None, got 5"):
        with ct_tf.use_rule(ct.SpS(), generator=5):
            pass  # pragma: no cover
    with pytest.raises(ValueError, match="^rule must be a cactus_theory Rule"):
        with ct_tf.use_rule("cactus"):
            pass  # pragma: no cover
    for bad in (0.0, 1.0, math.nan, True, "0.3"):
        with pytest.raises(ERRORS, match="^assistant_ensemble_weight must be in \\(0, 1\\)"):
            ct_tf.ensemble_weight_rule(bad)
    assert ct_tf.ensemble_weight_rule(np.float64(0.7)) == ct_tf.ensemble_weight_rule(0.7) == ct.Ensemble(0.7)


@settings(max_examples=4, derandomize=True, deadline=None)
@given(cases(max_V=3), st.sampled_from([0.0, 0.05, 1e6]), st.integers(1, 2), st.sampled_from(["coupling", "dual"]))
def test_solve_target_multi_valid_inputs_give_laws(case, delta, K, method):
    from cactus_theory.optimize import multi_draft_acceptance, solve_target_multi

    p, q, _ = case
    res = solve_target_multi(p, q, np.float32(delta), np.int64(K), method=method, max_cuts=np.int64(100))
    _assert_law(res.h, np.zeros(1), "solve_target_multi")
    # the budget only helps: never below the lossless optimum with h = q (an independent O(V log V) value)
    assert multi_draft_acceptance(p, q, K).value - 1e-6 <= res.value <= 1 + 1e-9


def test_verify_flat_bonus_probs_is_never_silently_ignored():
    """``bonus_probs`` is read only by a rule that draws its own bonus: with a q-bonus rule it is refused,
    and a rule that needs it refuses a missing, misshapen or unnormalised one."""
    import torch

    from cactus_theory.sampler import verify_flat

    V = 4
    ids = torch.tensor([1, 2])
    cu = torch.tensor([1, 2])
    q = torch.full((2, V), 0.25)
    bonus = torch.tensor([[0], [3]])
    with pytest.raises(ValueError, match="bonus_probs is read only"):
        verify_flat(ids, cu, None, q, bonus, ct.SpS(), bonus_probs=q)
    with pytest.raises(ValueError, match="pass bonus_probs"):
        verify_flat(ids, cu, None, q, bonus, ct.MedusaTypical())
    with pytest.raises(ValueError, match="pass bonus_probs"):
        verify_flat(ids, cu, None, q, bonus, ct.MedusaTypical(), bonus_probs=q[:1])
    with pytest.raises(ValueError, match="bonus_probs"):
        verify_flat(ids, cu, None, q, bonus, ct.MedusaTypical(), bonus_probs=2 * q)
    out = verify_flat(ids, cu, None, q, bonus, ct.MedusaTypical(), bonus_probs=q)
    assert out.shape == (2, 2) and bool(((out >= -1) & (out < V)).all())
