"""The eval's vLLM engine (``integrations.vllm_eval``) against a stand-in of vLLM's offline ``LLM`` with vLLM 0.32's
interface (``generate`` returning ``RequestOutput``s whose ``CompletionOutput`` holds ``token_ids``, per-token
``logprobs`` dicts and ``spec_decode_metrics.per_step_accepted`` / ``per_step_drafted``; ``collective_rpc`` returning
one answer per worker): the engine arguments it passes, the rule set and confirmed on every worker before any decode
(a refusal or a wrong answer stops it, naming the method), the counters it builds (checked against the stand-in's
own numbers), and the request seeds. The live engine: tests/integrations/vllm_cpu_eval.py (``make test-vllm``)."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field

import pytest

import cactus_theory as ct
from cactus_theory.integrations import vllm_eval
from cactus_theory.integrations.vllm import rule_from_spec
from cactus_theory.lm.experiments import replicated as rp
from cactus_theory.lm.experiments.eval import Method

TOKS = [[5, 6, 7, 8, 9], [5, 6]]  # each request's tokens, by request index
STEPS = {0: ([2, 0, 1], [4, 4, 4]), 1: ([0], [4])}  # per-step accepted / drafted of each request


@dataclass
class _Logprob:
    logprob: float


@dataclass
class _Metrics:
    per_step_accepted: list
    per_step_drafted: list


@dataclass
class _Completion:
    token_ids: list
    logprobs: list | None
    spec_decode_metrics: _Metrics | None = None


@dataclass
class _Output:
    outputs: list


@dataclass
class _FakeLLM:
    """vLLM 0.32's ``LLM`` as the engine uses it; ``refuse``: rule classes (lower case) its workers refuse."""

    kwargs: dict
    refuse: tuple = ()
    workers: int = 2
    wrong: bool = False
    calls: list = field(default_factory=list)
    rule: object = None

    def collective_rpc(self, method, args=()):
        assert method == "cactus_theory_set_rule"
        spec = args[0]
        self.calls.append(spec)
        if spec is None:
            self.rule = None
            return ["vllm"] * self.workers
        rule = rule_from_spec(spec)
        if type(rule).__name__.lower() in self.refuse:
            raise RuntimeError(f"cactus_theory: cannot verify with {rule!r}: a model-specific sampler")
        self.rule = rule
        return [repr(rule)] * (self.workers - 1) + [repr(ct.SpS()) if self.wrong else repr(rule)]

    def generate(self, prompts, params, use_tqdm=True):
        self.seen = [(p["prompt_token_ids"], sp) for p, sp in zip(prompts, params, strict=True)]
        out = []
        for i, sp in enumerate(params):
            toks = TOKS[i % 2]
            lps = None if sp.logprobs is None else [{t: _Logprob(-0.5 * (j + 1))} for j, t in enumerate(toks)]
            m = None if "speculative_config" not in self.kwargs else _Metrics(*STEPS[i % 2])
            out.append(_Output([_Completion(list(toks), lps, m)]))
        return out


class _Tok:
    chat_template = None
    eos_token_id = 0

    def __call__(self, text):
        return {"input_ids": [len(w) for w in text.split()]}

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(str(t) for t in ids)


@pytest.fixture
def fake_vllm(monkeypatch):
    made = []

    @dataclass
    class SamplingParams:
        temperature: float = 1.0
        top_k: int = -1
        top_p: float = 1.0
        max_tokens: int = 16
        seed: int | None = None
        logprobs: int | None = None

    mod = types.ModuleType("vllm")
    mod.SamplingParams = SamplingParams
    mod.LLM = lambda **kw: made.append(_FakeLLM(kw, **made_opts)) or made[-1]
    plat = types.ModuleType("vllm.platforms")
    plat.current_platform = types.SimpleNamespace(is_cpu=lambda: True)
    made_opts: dict = {}
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setitem(sys.modules, "vllm.platforms", plat)
    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: _Tok())
    return made, made_opts


def _cfg():
    cfg = rp.RunConfig(tasks=["add_wide"], questions=2, replicates=1, batch_size=2, dtype="bfloat16",
                       engine="vllm/draft_model")
    cfg.check()
    return cfg


METHODS = [Method("verifier alone", None), Method("SpS", "sps", {}, ct.SpS()),
           Method("Cactus delta=1", "cactus", {"delta": 1.0}, ct.Cactus(delta=1.0))]


def test_engines_start_with_the_protocols_settings_and_pass_through_arguments(fake_vllm, tmp_path):
    made, _ = fake_vllm
    eng = vllm_eval.VllmEvalEngine(str(tmp_path), "org/draft", _cfg(), "draft_model",
                                   engine_args={"tensor_parallel_size": 2, "max_num_seqs": 64})
    plain, spec = made
    assert "speculative_config" not in plain.kwargs
    assert spec.kwargs["speculative_config"] == {"method": "draft_model", "model": "org/draft",
                                                 "num_speculative_tokens": 4, "draft_sample_method": "probabilistic"}
    assert spec.kwargs["per_request_spec_decode_metrics"] == "detailed"
    for kw in (plain.kwargs, spec.kwargs):
        assert kw["dtype"] == "bfloat16" and kw["seed"] == 0 and kw["tensor_parallel_size"] == 2
        assert kw["max_num_seqs"] == 64 and kw["enforce_eager"] is True  # a passed argument wins over a default
        assert kw["max_num_batched_tokens"] >= 2 * vllm_eval.PROMPT_BUDGET  # CPU: no seeded prefill is split
    assert eng.env["VLLM_PLUGINS"].split(",").count("cactus_theory") == 1


def test_every_rule_is_confirmed_on_every_worker_before_any_decode(fake_vllm, tmp_path):
    made, opts = fake_vllm
    eng = vllm_eval.VllmEvalEngine(str(tmp_path), "org/draft", _cfg(), "draft_model")
    eng.check_rules(METHODS)
    spec = made[1]
    assert [rule_from_spec(c) if c else None for c in spec.calls] == [ct.SpS(), ct.Cactus(delta=1.0), None]
    assert eng.workers == 2 and eng.rule_now is None and made[0].calls == []
    opts["refuse"] = ("cactus",)  # the running vLLM refuses Cactus: stopped, naming the method
    eng2 = vllm_eval.VllmEvalEngine(str(tmp_path), "org/draft", _cfg(), "draft_model")
    with pytest.raises(ValueError, match="this vLLM cannot apply 'Cactus delta=1': .*model-specific sampler"):
        eng2.check_rules(METHODS)
    opts.update(refuse=(), wrong=True)  # one worker answers with another rule (the plugin not loaded there)
    eng3 = vllm_eval.VllmEvalEngine(str(tmp_path), "org/draft", _cfg(), "draft_model")
    with pytest.raises(ValueError, match="the workers run .* for 'Cactus delta=1', not"):
        eng3.check_rules(METHODS)


def test_rows_carry_the_request_seeds_and_vllms_counts(fake_vllm, tmp_path):
    made, _ = fake_vllm
    cfg = _cfg()
    eng = vllm_eval.VllmEvalEngine(str(tmp_path), "org/draft", cfg, "draft_model")
    seeds = [rp.engine_seed(2**40 + 3, cfg.engine), 17]
    res = eng.generate_rows(["one two three", "four five"], seeds, METHODS[2], cfg)
    spec = made[1]
    assert [sp.seed for _, sp in spec.seen] == [3, 17] and [ids for ids, _ in spec.seen] == [[3, 3, 5], [4, 4]]
    assert all((sp.temperature, sp.top_k, sp.top_p, sp.max_tokens, sp.logprobs) == (0.6, 20, 0.95, 128, 0)
               for _, sp in spec.seen)
    assert rule_from_spec(spec.calls[-1]) == ct.Cactus(delta=1.0)  # switched before the batch
    c0, c1 = res["counters"]
    assert (c0["new_tokens"], c0["steps"], c0["accepted"], c0["drafted"]) == (5, 3, 3, 12)
    assert (c1["new_tokens"], c1["steps"], c1["accepted"], c1["drafted"]) == (2, 1, 0, 4)
    assert c0["nll_sum"] == pytest.approx(0.5 * (1 + 2 + 3 + 4 + 5)) and c0["nll_count"] == 5
    assert (c0["kl_sum"], c0["kl_count"]) == (0.0, 0) and isinstance(c0["kl_sum"], float)
    assert res["texts"] == ["5 6 7 8 9", "5 6"] and res["tokens"] == TOKS and res["seconds"] >= 0
    base = eng.generate_rows(["one two three", "four five"], seeds, METHODS[0], cfg)  # the plain engine
    assert made[0].seen and [(c["steps"], c["accepted"], c["drafted"]) for c in base["counters"]] == [(4, 0, 0),
                                                                                                      (1, 0, 0)]
