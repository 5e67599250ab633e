"""The figures lessons quote from the paper or another named publication, with their source: the only numbers a
lesson's text may state without printing them (course/prose.py). PUBLISHED[lesson][number as written] = source.
A test fails when an entry is no longer in its lesson's text."""

QIU = "Qiu et al. 2025 (arXiv 2505.06708)"
GU = "Gu et al., ICLR 2025 (When attention sink emerges in language models)"
ANALYSIS = "an unpublished independent analysis of the released 1B checkpoints"

TABLE_1 = ["6.026", "58.79", "52.92", "5.761", "60.82", "55.27", "5.820", "59.17", "53.97", "6.016", "59.18", "50.49",
           "5.981", "58.74", "6.017", "59.41", "50.87", "1.6", "5.792", "60.05", "54.44", "0.2", "5.808", "59.32",
           "53.53", "5.801", "60.06", "53.15", "5.821", "53.30", "5.822", "60.49", "54.59"]  # 15B MoE, 400B tokens

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
           "0.15": f"{ANALYSIS}: its best constant gate value"},
    "08": {"7.421": f"{QIU}, Table 2", "7.288": f"{QIU}, Table 2", "9.195": f"{QIU}, Table 2",
           "7.325": f"{QIU}, Table 2", "58.82": f"{QIU}, Table 5", "31.65": f"{QIU}, Table 5",
           "0.116": f"{QIU}, Table 4: the elementwise gate's mean score",
           "2.5": f"{QIU}, Table 1: the 15B-A2.5B MoE models, 2.5B parameters active per token",
           "1.7": f"{QIU}, Table 2: the dense 1.7B models of the learning-rate comparison"},
}
