"""The figures lessons quote from the paper or another named publication, with their source: the only numbers a
lesson's text may state without printing them (course/prose.py). PUBLISHED[lesson][number as written] = source.
A test fails when an entry is no longer in its lesson's text."""

import math

from ..presets import GATED

QIU = "Qiu et al. 2025 (arXiv 2505.06708)"
GU = "Gu et al., ICLR 2025 (When attention sink emerges in language models)"
# what lessons 05-07 call "reported": a third-party analysis of the released 1B models, not the paper's
REPORTED = "reported: a third-party analysis of the released 1B checkpoints (not the paper's; not checked here)"

# The paper's figures that code computes with (the scorecard's bars, lessons 04 and 07's comparisons, the study's
# figure): one home. Table 4, the 15B MoE models (F-Attn, M-Act); Table 2, the 1.7B dense models' perplexity at lr 8e-3.
TABLE_4 = {"f_attn": {"none": 0.467, "headwise": 0.073, "elementwise": 0.048},
           "m_act": {"none": 1053, "headwise": 98, "elementwise": 94}}
# Table 2's values are average perplexities, as Table 1's (a 1.7B model's loss is near 2 nats, not 7-9): at lr 8e-3 the
# baseline degrades to 9.195, the gated model reaches 7.325; as a loss, ln(9.195 / 7.325) = 0.23 nats apart
TABLE_2_LR = {"none": 9.195, "elementwise": 7.325}  # the paper's gated 1.7B model: G1, elementwise
TABLE_2_LR_GAP = math.log(TABLE_2_LR["none"] / TABLE_2_LR["elementwise"])  # the loss the gate saves there, in nats
# what the third-party report measured on the released 1B headwise model: WikiText-2 perplexity, learned gates and
# every gate closed (REPORTED)
REPORTED_CLOSED = {"learned": 12.39, "gates=0": 304_000}
# Table 4 as ratios, baseline / gated: how many times smaller the gated models' F-Attn and M-Act are than the baseline's
TABLE_4_RATIOS = {key: {g: row["none"] / row[g] for g in GATED} for key, row in TABLE_4.items()}

TABLE_1 = ["6.026", "5.761", "1.6", "5.792", "5.820", "6.016", "5.981", "6.017"]  # 15B MoE, 400B tokens

PUBLISHED: dict[str, dict[str, str]] = {
    "01": {"0.3": f"{GU}: the sink-head threshold",
           "0.467": f"{QIU}, Table 4: the 15B baseline's F-Attn",
           "0.048": f"{QIU}, Table 4: the elementwise-gated 15B model's F-Attn"},
    "02": {**{n: f"{QIU}, Table 1" for n in TABLE_1},
           **{n: f"{QIU}, Table 4" for n in ("0.172", "0.116", "0.048", "0.297", "0.467")}},
    "03": {"6.026": f"{QIU}, Table 1: the 15B MoE baseline's average perplexity",
           "5.761": f"{QIU}, Table 1: elementwise G1's average perplexity"},
    "04": {"0.3": f"{GU}: the sink-head threshold"},
    "05": {"1.7": f"{QIU}: the released dense models have 1.7B parameters"},
    "06": {},
    "07": {"1.7": f"{QIU}: the released dense models have 1.7B parameters",
           "0.3": f"{GU}: the sink-head threshold",
           "0.15": f"{REPORTED}: its best constant gate value"},
    "08": {"7.421": f"{QIU}, Table 2", "7.288": f"{QIU}, Table 2", "9.195": f"{QIU}, Table 2",
           "7.325": f"{QIU}, Table 2", "58.82": f"{QIU}, Table 5", "31.65": f"{QIU}, Table 5",
           "0.116": f"{QIU}, Table 4: the elementwise gate's mean score",
           "2.5": f"{QIU}, Table 1: the 15B-A2.5B MoE models, 2.5B parameters active per token",
           "1.7": f"{QIU}, Table 2: the dense 1.7B models of the learning-rate comparison"},
}

# The README's own figures that no generated source prints (course/prose.py, generated_sources): measured once by a
# benchmark or a run on a named machine and quoted, each with where it was measured. A test fails when the README no
# longer states one; any other decimal or ratio in the README's prose must be printed by a generated source.
_BENCH = "python -m minigate.bench {}, on the 2-core dev machine (docs/benchmarks.md)"
README_QUOTED: dict[str, str] = {
    **{n: _BENCH.format("model") for n in ("1.00x", "1.06x", "0.99x")},
    **{n: _BENCH.format("train") for n in ("1.19x", "7.9", "6.7", "0.09x", "1.24x", "1.04x", "0.96x", "0.98x",
                                           "1.01x", "1.2x")},
    **{n: _BENCH.format("ablation") for n in ("1.02x", "0.94x", "1.54x", "4.3x", "0.02", "0.8x", "7.6")},
    "3x": "the speed-up the batched ablation engine aimed for (docs/benchmarks.md): an aim, not a measurement",
    **{n: _BENCH.format("ddp") for n in ("1.03x", "21.1", "20.5", "0.86x")},
    "0.087": "tests/test_distributed.py's runs: 2 gloo processes against 1 at the ci preset's lr, 100 steps",
    **{n: "docs/gpu.md, 'Measured on an H100': three runs of three of the recipe that became code-gpu"
       for n in ("3.6", "5.4x", "7x")},
    "0.6": "the python-code corpus read back from the token cache on 2 CPU cores (docs/training.md, The GPU track)",
}
