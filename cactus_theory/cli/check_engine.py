"""``cactus-theory check-engine``: is an engine's speculative decoding lossless over whole decodes?

``--engine loop`` judges our loop (``speculative_generate``, or ``tree_generate`` with ``--tree``; any
``--rule``) against the verifier alone on the real pair (SmolLM2-135M-Instruct and the embedded draft by
default); ``--engine transformers`` judges transformers' ``generate(assistant_model=...)`` against plain
``generate`` (the assistant: the verifier's first ``--assistant-layers`` layers with its final norm and head,
made on the fly); ``--engine vllm --spec {ngram,eagle3}`` judges vLLM's ``LLM.generate`` with speculative decoding
(n-gram lookup, or EAGLE-3 with the project's draft) against the same vLLM without it (it needs vLLM: ``make
vllm-env``, then ``.venv-vllm/bin/cactus-theory``). Both sides decode ``--n`` times each prompt; ``theory.check_generation`` tests the
next-token law at every position of the observed prefix tree (Holm over the family) and prints the table;
``--json`` writes it. ``--equivalence EPS`` adds upper confidence bounds on the next-token TV at every tested
prefix (``check_generation``'s equivalence mode). ``--quick``: the smallest meaningful run, a smoke test of the
wiring rather than a verdict (``QUICK``: 50 decodes of one prompt per side, positions 0 and 1 of 2-token decodes,
so position 1, the first a drafted token can change, is tested; flags given explicitly win). Exit status 0 when
no difference is found (and, with ``--equivalence``, the bounds clear EPS), 1 when equality in law is rejected,
2 for an argument error (one line, before any model loads), 3 when nothing was tested (no prefix seen
``--min-count`` times on both sides), 4 when no difference was found but the equivalence bounds do not clear
EPS. The engines are ``integrations.engines.ENGINES``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from ..core.tree_shapes import BUDGET_DEPTH, BUDGET_TOPK, flag_tree
from ..lm.loading import check_model, quiet_transformers
from ..util.args import check_writable_file, positive_int, read_prompts

__all__ = ["DESCRIPTION", "ENGINE_NAMES", "configure", "check", "run", "result_json"]

DESCRIPTION = ("Judge an engine's speculative decoding against the same engine without it, over whole decodes: "
               "per-position next-token tests along the observed prefix tree (Holm), with the detectable TV of "
               "each position. Exit status 1 when equality in law is rejected.")
ENGINE_NAMES = ("loop", "transformers", "vllm", "llamacpp")  # integrations.engines.ENGINES (a test pins the copy)
VLLM_SPECS = ("ngram", "eagle3")  # integrations.engines.VLLM_SPECS (pinned by the same test)
VLLM_PLUGIN_MODES = ("none", "fixes")  # integrations.engines.VLLM_PLUGIN_MODES
DEFAULT_N, DEFAULT_MAX_NEW = 500, 32
QUICK = {"n": 50, "positions": 2, "max_new_tokens": 2, "prompts": 1}  # --quick (module docstring)
EXIT_UNTESTED, EXIT_NOT_EQUIVALENT = 3, 4


def _unit_float(text: str) -> float:
    """argparse type: a number in (0, 1)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1), got {text!r}") from None
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"must be a number in (0, 1), got {text!r}")
    return v


def configure(parser: argparse.ArgumentParser) -> None:
    from ..core.registry import add_rule_arguments, add_sampling_arguments

    parser.add_argument("--engine", choices=ENGINE_NAMES, default="loop",
                        help="loop: our speculative loop vs the verifier alone; transformers: generate(assistant_model=...) "
                             "vs plain generate; vllm: vLLM with --spec speculation vs without (needs vLLM); llamacpp: "
                             "llama.cpp's prompt-lookup speculation vs without (needs llama-cpp-python)")
    g = parser.add_argument_group("prompts")
    g.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable; default: the project's "
                                                                  "three built-in prompts, one per style)")
    g.add_argument("--prompts-file", help=r"a UTF-8 text file, one prompt per line ('\n' inside a line is a newline)")
    g.add_argument("--no-chat", action="store_true", help="feed prompts raw, without the chat template")
    add_rule_arguments(parser, default="sps")
    g = parser.add_argument_group("decoding")
    g.add_argument("-k", "--num-drafts", dest="num_drafts", type=positive_int, default=4, help="drafted tokens per step")
    g.add_argument("--max-new-tokens", type=positive_int, default=None,
                   help=f"new tokens per decode at most (default {DEFAULT_MAX_NEW}; --quick: {QUICK['max_new_tokens']})")
    g.add_argument("--tree", type=positive_int, default=None, metavar="NODES",
                   help="--engine loop: EAGLE-2's budget tree of NODES nodes (deterministic top-k candidates), "
                        "--tree-depth levels, --tree-topk per node")
    g.add_argument("--tree-depth", type=positive_int, default=None, metavar="D", help=f"(default {BUDGET_DEPTH})")
    g.add_argument("--tree-topk", type=positive_int, default=None, metavar="K", help=f"(default {BUDGET_TOPK})")
    g.add_argument("--batch-size", type=positive_int, default=32,
                   help="decodes run together, on both sides (vllm: max_num_seqs; transformers: 1, since its assisted "
                        "generation takes one sequence)")
    g.add_argument("--spec", choices=VLLM_SPECS, default=None,
                   help="--engine vllm: vLLM's speculation, n-gram lookup or EAGLE-3 with --draft (required there)")
    g.add_argument("--draft-sampling", choices=("greedy", "probabilistic"), default=None,
                   help="--engine vllm --spec eagle3: vLLM's draft_sample_method (default: vLLM's default, greedy)")
    g.add_argument("--vllm-plugin", choices=VLLM_PLUGIN_MODES, default=None,
                   help="--engine vllm: none: vLLM as shipped (the project's plugin not loaded); fixes: the project's "
                        "plugin loaded without a rule (vLLM's own rejection sampling with the plugin's CPU fixes, "
                        "docs/vllm.md) (default none)")
    add_sampling_arguments(parser)
    g = parser.add_argument_group("models")
    g.add_argument("--draft", default="embedded", help="--engine loop: 'embedded', 'smollm2', a .gguf file, a folder or "
                                                       "a hub id; --engine vllm --spec eagle3: 'embedded', a draft file "
                                                       "(.pt) or an EAGLE-3 folder")
    g.add_argument("--verifier", default="smollm2", help="'smollm2', a .gguf file, a folder or a hub id")
    g.add_argument("--assistant-layers", type=positive_int, default=None,
                   help="--engine transformers: the assistant's decoder layers, the verifier's first ones (default 4)")
    g.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                   help="weights and compute (default float32; --engine llamacpp: the GGUF file as it is, or a copy in "
                        "this precision written by llama.cpp's quantizer)")
    g.add_argument("--threads", type=positive_int, default=None,
                   help="torch CPU threads (vllm: its CPU worker's OpenMP threads, unpinned; llamacpp: llama.cpp's threads)")
    g = parser.add_argument_group("the test")
    g.add_argument("--n", type=positive_int, default=None,
                   help=f"decodes of each prompt on each side (default {DEFAULT_N}; --quick: {QUICK['n']})")
    g.add_argument("--quick", action="store_true",
                   help=f"smoke test, not a verdict: --n {QUICK['n']}, --positions {QUICK['positions']}, "
                        f"--max-new-tokens {QUICK['max_new_tokens']} and the first built-in prompt only, unless given")
    g.add_argument("--equivalence", type=_unit_float, default=None, metavar="EPS",
                   help="also bound the next-token TV at every tested prefix from above (joint confidence 1 - alpha); "
                        "exit 4 when a bound exceeds EPS")
    g.add_argument("--positions", type=positive_int, default=None,
                   help="test positions 0 .. POSITIONS - 1 (default: min(16, --max-new-tokens))")
    g.add_argument("--alpha", type=_unit_float, default=1e-3, help="family-wise level (Holm)")
    g.add_argument("--power", type=_unit_float, default=0.9, help="power at which the detectable TVs are stated")
    g.add_argument("--min-count", type=positive_int, default=20,
                   help="a prefix is tested when each side has it at least this often")
    g.add_argument("--seed", type=int, default=0, help="seed (side a gets 2 seed, side b 2 seed + 1)")
    g.add_argument("--negative-control", action="store_true",
                   help="also run the engine's planted bug (side a with it) through the same check at the same n against "
                        "the same side-b decodes; reported caught or missed (engines that declare one: llamacpp)")
    g.add_argument("--plant-temperature", type=float, default=None, metavar="T",
                   help="--negative-control (llamacpp): the temperature of the planted draws after an accepted draft "
                        "(default 1.0; must differ from --temperature)")
    g = parser.add_argument_group("output")
    g.add_argument("--json", help="also write the table and the configuration to this JSON file (atomically)")
    g.add_argument("--verbose", action="store_true", help="keep transformers' warnings and progress bars")


def _prompts(args) -> list[str]:
    prompts = read_prompts(args)
    if any(not p.strip() for p in prompts):
        raise ValueError("--prompt must not be empty")
    if not prompts:
        from ..lm.data import prompt_set

        prompts = prompt_set(1)[:QUICK["prompts"]] if args.quick else prompt_set(1)
    return prompts


def _apply_quick(args: argparse.Namespace) -> None:
    """Fill ``--n``, ``--positions`` and ``--max-new-tokens`` left out: ``QUICK`` with ``--quick``, else the
    defaults (``--positions``: min(16, --max-new-tokens))."""
    if args.n is None:
        args.n = QUICK["n"] if args.quick else DEFAULT_N
    if args.max_new_tokens is None:
        args.max_new_tokens = QUICK["max_new_tokens"] if args.quick else DEFAULT_MAX_NEW
    if args.positions is None and args.quick:
        args.positions = min(QUICK["positions"], args.max_new_tokens)


def check(args: argparse.Namespace) -> None:
    """Every check that needs no model (``ValueError`` naming the flag)."""
    from ..core.registry import rule_from_args

    _apply_quick(args)
    args.rule_obj = rule_from_args(args)
    args.prompts = _prompts(args)
    check_model(args.verifier, "--verifier")
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    if args.positions is None:
        args.positions = min(16, args.max_new_tokens)
    elif args.positions > args.max_new_tokens:
        raise ValueError(f"--positions {args.positions}: a decode has at most --max-new-tokens {args.max_new_tokens} "
                         f"tokens, so positions 0 .. {args.max_new_tokens - 1} only")
    if args.min_count < 2:
        raise ValueError(f"--min-count must be >= 2, got {args.min_count}")
    if args.n < args.min_count:
        raise ValueError(f"--n {args.n} is below --min-count {args.min_count}: no prefix can be seen --min-count times on "
                         f"both sides, so nothing would be tested")
    for flag in ("tree_depth", "tree_topk"):
        if getattr(args, flag) is not None and args.tree is None:
            raise ValueError(f"--{flag.replace('_', '-')} shapes the --tree NODES tree: give --tree NODES too")
    _check_caps(args)
    if args.engine != "vllm":
        for flag in ("spec", "draft_sampling", "vllm_plugin"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')} applies to --engine vllm")
    if args.engine == "loop":
        check_model(args.draft, "--draft")
        if args.assistant_layers is not None:
            raise ValueError("--assistant-layers builds transformers' assistant: it applies to --engine transformers only")
        if args.tree is not None:
            _tree(args)  # counted arithmetically and held to the caps before it is built (torch-free)
            if args.rule_obj.reads_head:
                raise ValueError(f"--rule {args.rule}: a rule that reads the verifier's LM head is not supported on trees")
    elif args.engine == "vllm":
        _check_vllm(args)
    elif args.engine == "llamacpp":
        _check_llamacpp(args)
    else:
        if args.draft != "embedded":
            raise ValueError("--draft applies to --engine loop and --engine vllm --spec eagle3; transformers' assistant "
                             "is --assistant-layers of the verifier")
        if args.tree is not None:
            raise ValueError("--tree applies to --engine loop; transformers drafts chains")
        if args.rule != "sps":
            raise ValueError(f"--engine transformers verifies with its own rule (SpS): --rule {args.rule} would be "
                             "ignored")
        if args.temperature <= 0:
            raise ValueError(f"--engine transformers samples (do_sample=True): --temperature must be > 0, got "
                             f"{args.temperature}")
        if args.assistant_layers is not None:
            _check_assistant_layers(args.assistant_layers, args.verifier)
    if args.json:
        check_writable_file(args.json, "--json")
    if args.engine == "vllm":  # last: every other argument is checked where vLLM is missing too
        from ..integrations.engines import vllm_problem

        problem = vllm_problem()
        if problem:
            raise ValueError(problem)
    elif args.engine == "llamacpp":
        from ..integrations.engines import engine_problem

        problem = engine_problem(args.engine)
        if problem:
            raise ValueError(problem)


def _check_caps(args: argparse.Namespace) -> None:
    """What ``integrations.engines.ENGINE_CAPS`` declares for ``--engine``: the negative control and its temperature,
    and ``--dtype``'s default (float32 where the project or vLLM loads the model; llama.cpp's file as it is)."""
    from ..integrations.engines import ENGINE_CAPS

    caps = ENGINE_CAPS[args.engine]
    if args.negative_control and caps.negative_control is None:
        have = ", ".join(n for n, c in ENGINE_CAPS.items() if c.negative_control)
        raise ValueError(f"--negative-control: --engine {args.engine} declares no planted bug (engines with one: {have})")
    if args.plant_temperature is not None:
        if not args.negative_control:
            raise ValueError("--plant-temperature sets the planted bug of --negative-control: give --negative-control too")
        if not (math.isfinite(args.plant_temperature) and args.plant_temperature > 0):
            raise ValueError(f"--plant-temperature must be a finite number > 0, got {args.plant_temperature}")
        if args.plant_temperature == args.temperature:
            raise ValueError(f"--plant-temperature {args.plant_temperature:g} equals --temperature: the planted bug "
                             "would change nothing")
    if args.negative_control and args.plant_temperature is None:
        args.plant_temperature = 1.0 if args.temperature != 1.0 else 0.6
    if args.dtype is None and args.engine != "llamacpp":
        args.dtype = "float32"


def _check_llamacpp(args: argparse.Namespace) -> None:
    """``--engine llamacpp``'s own arguments (no model, no llama.cpp import): its lossless rule only, chains, no
    ``--draft`` (prompt lookup drafts from the context), a GGUF verifier."""
    from ..integrations.engines import ENGINE_CAPS
    from ..integrations.llamacpp import check_gguf_verifier

    caps = ENGINE_CAPS["llamacpp"]
    if args.assistant_layers is not None:
        raise ValueError("--assistant-layers builds transformers' assistant: it applies to --engine transformers only")
    if not caps.trees and args.tree is not None:
        raise ValueError("--tree applies to --engine loop; llama.cpp's prompt lookup drafts chains")
    if not caps.rules and args.rule != "sps":
        raise ValueError(f"--engine llamacpp verifies with llama.cpp's own sample-and-match (lossless: SpS's law): "
                         f"--rule {args.rule} would be ignored")
    if caps.drafts is None and args.draft != "embedded":
        raise ValueError(f"--draft: --engine llamacpp drafts by prompt lookup from the context (got --draft {args.draft!r})")
    check_gguf_verifier(args.verifier)


def _check_assistant_layers(layers: int, verifier: str) -> None:
    """``--assistant-layers`` against the verifier's depth, read from its config only (``lm.pair.model_depth``: no
    weights load): the assistant keeps ``1 <= layers < depth`` of them (``integrations.engines.first_layers``)."""
    from ..lm.pair import model_depth

    try:
        depth = model_depth(verifier)
    except OSError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"could not read --verifier {verifier!r}'s config to check --assistant-layers: {first}") from None
    if not 1 <= layers < depth:
        raise ValueError(f"--assistant-layers must be in [1, {depth - 1}] for --verifier {verifier!r} of {depth} decoder "
                         f"layers, got {layers}")


def _check_vllm(args: argparse.Namespace) -> None:
    """``--engine vllm``'s own arguments (no model, no vLLM import)."""
    import os

    if args.spec is None:
        raise ValueError("--engine vllm needs --spec ngram or --spec eagle3 (the speculation judged against none)")
    if args.assistant_layers is not None:
        raise ValueError("--assistant-layers builds transformers' assistant: it applies to --engine transformers only")
    if args.tree is not None:
        raise ValueError("--tree applies to --engine loop; vLLM drafts chains")
    if args.rule != "sps":
        raise ValueError(f"--engine vllm verifies with vLLM's own rejection sampling (SpS): --rule {args.rule} would be "
                         "ignored (a rule runs inside vLLM through the project's plugin: docs/vllm.md)")
    if args.spec == "ngram":
        if args.draft != "embedded":
            raise ValueError(f"--draft applies to --spec eagle3: n-gram lookup drafts from the context (got --draft "
                             f"{args.draft!r})")
        if args.draft_sampling is not None:
            raise ValueError("--draft-sampling applies to --spec eagle3: n-gram drafts are not sampled")
        return
    if os.path.isdir(args.draft):
        if not os.path.isfile(os.path.join(args.draft, "config.json")):
            raise ValueError(f"--draft {args.draft!r}: an EAGLE-3 folder needs a config.json")
        return
    if args.verifier != "smollm2":
        raise ValueError(f"--draft {args.draft!r}: the project's drafts are exported for the embedded SmolLM2 only; for "
                         f"--verifier {args.verifier!r} give an EAGLE-3 folder")
    if args.draft == "embedded":
        from ..lm.draft import MissingDraftError
        from ..lm.pair import embedded_draft_path

        path = embedded_draft_path()
        if not os.path.isfile(path):
            raise MissingDraftError.not_built(path)
    elif not (args.draft.endswith(".pt") and os.path.isfile(args.draft)):
        raise ValueError(f"--draft {args.draft!r}: --spec eagle3 takes 'embedded', an existing draft file (.pt) or an "
                         "EAGLE-3 folder")


def _tree(args: argparse.Namespace):
    """The ``core.tree_shapes.BudgetTree`` of ``--tree NODES`` (``--tree-depth``, ``--tree-topk``; ``ValueError``
    naming the flags)."""
    depth, topk = args.tree_depth or BUDGET_DEPTH, args.tree_topk or BUDGET_TOPK
    return flag_tree("budget", (args.tree, depth, topk), f"--tree {args.tree} --tree-depth {depth} --tree-topk {topk}")


def options(args: argparse.Namespace):
    """``integrations.engines.EngineOptions`` from the parsed (and checked) arguments."""
    from ..integrations.engines import EngineOptions

    tree = _tree(args) if args.tree is not None else None
    return EngineOptions(rule=args.rule_obj, k=args.num_drafts, tree=tree, max_new_tokens=args.max_new_tokens,
                         temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, batch_size=args.batch_size,
                         chat=not args.no_chat, assistant_layers=args.assistant_layers or 4, spec=args.spec,
                         draft_sampling=args.draft_sampling or "greedy", vllm_plugin=args.vllm_plugin or "none",
                         plant_temperature=args.plant_temperature or 1.0)


def _load(args):
    import torch

    from ..lm.pair import load_model, load_pair

    if args.engine == "vllm":  # vLLM loads the models in its own processes
        return {"verifier": args.verifier, "draft": args.draft, "dtype": args.dtype, "threads": args.threads}
    if args.engine == "llamacpp":  # llama.cpp loads the GGUF file itself
        return {"verifier": args.verifier, "dtype": args.dtype, "threads": args.threads}
    dtype = getattr(torch, args.dtype)
    try:
        if args.engine == "loop":
            return {"pair": load_pair(args.draft, args.verifier, dtype=dtype)}
        model, tok = load_model(args.verifier, dtype)
        return {"model": model, "tokenizer": tok}
    except OSError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"could not load --verifier {args.verifier!r}: {first}") from None


def run(args: argparse.Namespace, models: dict | None = None) -> int:
    """Load the models (or take ``models``: the engine function's keyword arguments), build the engine's two
    generators, run ``check_generation``, print the table, write ``--json``. Returns 1 when it rejects."""
    if not hasattr(args, "rule_obj"):
        check(args)
    import torch

    from ..integrations.engines import ENGINE_CAPS, ENGINES
    from ..theory.check_generation import check_generation
    from ..util.atomic import atomic_write_json

    if args.threads:
        torch.set_num_threads(args.threads)
    own = ENGINE_CAPS[args.engine].own_loader
    t0 = time.perf_counter()
    if models is None:
        if not own:
            print(f"loading {args.verifier!r} ...", file=sys.stderr, flush=True)
        with quiet_transformers(args.verbose):
            models = _load(args)
        if not own:
            print(f"loaded in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    opts = options(args)
    kw = dict(prompts=args.prompts, n=args.n, positions=args.positions, alpha=args.alpha, power=args.power,
              seed=args.seed, min_count=args.min_count, equivalence=args.equivalence)
    control = None
    with quiet_transformers(args.verbose):
        eng = ENGINES[args.engine](opts, **models)
        for note in eng.notes:
            print(f"[{args.engine}] {note}", file=sys.stderr, flush=True)
        decodes: dict = {}

        def kept(name, g):  # the same decodes of side b serve the verdict and the negative control
            def call(prompts, n, seed):
                if (name, n, seed) not in decodes:
                    decodes[(name, n, seed)] = g(prompts, n, seed)
                return decodes[(name, n, seed)]
            return call

        generate_b = kept("b", eng.generate_b)
        t1 = time.perf_counter()
        try:
            res = check_generation(eng.generate_a, generate_b, names=(eng.label_a, eng.label_b), **kw)
            seconds = time.perf_counter() - t1
            if args.negative_control:
                control = _negative_control(eng, kept("planted", eng.generate_planted), generate_b, decodes, kw, args)
        finally:
            if eng.close is not None:
                eng.close()
    print(res.table())
    for note in eng.notes:
        print(f"note: {note}")
    if control is not None:
        print(control.pop("table"))
        print(control["line"])
    if args.json:
        out = result_json(args, eng, res, seconds)
        if control is not None:
            out["negative_control"] = control
        atomic_write_json(args.json, out)
    return exit_status(res)


def result_json(args: argparse.Namespace, eng, res, seconds: float) -> dict:
    """What ``--json`` writes: the engine, the configuration (every argument), the generators' labels, each side's
    batch size, the decoding seconds, then ``res.as_dict()`` with the engine's notes first."""
    config = {k: v for k, v in vars(args).items() if k not in ("rule_obj", "prompts") and not callable(v)}
    config["prompts"] = list(args.prompts)
    config["rule"] = repr(args.rule_obj)
    out = res.as_dict()
    return ({"engine": args.engine, "config": config, "labels": [eng.label_a, eng.label_b],
             "batch_sizes": list(eng.batch_sizes), "decode_seconds": round(seconds, 1)} | out
            | {"notes": list(eng.notes) + out["notes"]})


def _negative_control(eng, generate_planted, generate_b, decodes: dict, kw: dict, args) -> dict:
    """The engine's planted bug through the same check (same prompts, n, positions, seeds, alpha) against the same
    side-b decodes: its verdict ("caught" when it rejects), its size at the compared prefixes
    (``EngineRun.plant_size``), the result, and one summary line."""
    from ..theory.check_generation import check_generation

    t0 = time.perf_counter()
    res = check_generation(generate_planted, generate_b, names=(f"{eng.label_a} + planted bug", eng.label_b), **kw)
    seconds = time.perf_counter() - t0
    seeds = (2 * args.seed, 2 * args.seed + 1)
    size = eng.plant_size(args.prompts, decodes[("planted", args.n, seeds[0])], decodes[("b", args.n, seeds[1])],
                          args.n, args.positions, args.min_count)
    caught = bool(res.tested and res.reject)
    verdict = "CAUGHT" if caught else ("UNTESTED" if not res.tested else "MISSED")
    line = (f"negative control ({eng.plant_label}): {verdict} (smallest Holm p {res.pvalue:.3g} at alpha "
            f"{args.alpha:g}); the bug acts at {size['acting']} of the {size['prefixes']} compared prefixes"
            + (f", next-token TV there mean {size['mean_tv']:.3f}, max {size['max_tv']:.3f}" if size["acting"] else ""))
    return {"plant": eng.plant_label, "plant_temperature": args.plant_temperature, "caught": caught,
            "verdict": res.verdict, "size": size, "decode_seconds": round(seconds, 1), "line": line,
            "table": res.table(), "result": res.as_dict()}


def exit_status(res) -> int:
    """1 rejected, 3 nothing tested (one line on stderr), 4 no difference but equivalence not shown, else 0."""
    if not res.tested:
        print("check-engine: nothing was tested (no prefix seen --min-count times on both sides): not a verdict",
              file=sys.stderr)
        return EXIT_UNTESTED
    if res.reject:
        return 1
    return EXIT_NOT_EQUIVALENT if res.equivalent is False else 0
