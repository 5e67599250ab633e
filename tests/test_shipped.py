"""The checkpoints the course ships (data/checkpoints/): complete, portable, small, and as documented."""

import json

import pytest
import torch

import minigate
from minigate import data
from minigate.analysis import TRACKED
from minigate.course.release import SHIPPED_DIR
from minigate.resources import DATA_DIR
from minigate.course import release

TEXT = ("text-baseline", "text-headwise", "text-elementwise")
INDUCTION = ("induction-baseline", "induction-headwise", "induction-elementwise")
CODE = ("code-baseline", "code-headwise", "code-elementwise")


def test_every_documented_model_is_shipped_and_the_set_fits_the_budget():
    assert set(release.shipped_names()) >= {"copy-baseline", "copy-headwise", "copy-elementwise", *TEXT, *INDUCTION,
                                             *CODE}
    size = sum(p.stat().st_size for p in DATA_DIR.rglob("*") if p.is_file())
    assert size < 60e6, f"data/ is {size / 1e6:.1f} MB; the budget is 60 MB"


@pytest.mark.parametrize("name", release.shipped_names())
def test_shipped_metadata_has_no_machine_paths(name):
    for f in ("run.json", "history.json"):
        text = (SHIPPED_DIR / name / f).read_text()
        assert not any(d in text for d in ("/work/", "/root/", "/home/")), f"{name}/{f} names a machine path"


@pytest.mark.parametrize("name", release.shipped_names())
def test_shipped_records_use_todays_names(name):
    """run.json and history.json name the variant `variant`, and the tracker's metrics carry analysis.TRACKED's names
    (with F-Attn above uniform): what lesson 03's GROW display and the plots read, with no translation."""
    run = json.loads((SHIPPED_DIR / name / "run.json").read_text())
    history = json.loads((SHIPPED_DIR / name / "history.json").read_text())
    assert "gate" not in run and run["variant"] in ("none", "headwise", "elementwise")
    assert "gate" not in history["info"] and history["info"]["variant"] == run["variant"]
    assert history["metrics"] and all(set(m) - {"step"} <= set(TRACKED) and "f_attn_excess" in m
                                      for m in history["metrics"])


@pytest.mark.parametrize("name", TEXT)
def test_text_models_match_their_run_and_predict_text(name):
    model, run = release.shipped(name), release.shipped_run(name)
    gate = {"text-baseline": "none", "text-headwise": "headwise", "text-elementwise": "elementwise"}[name]
    assert run["preset"] == "text" and run["variant"] == gate and run["history"]["step"][-1] == 1500
    assert model.cfg.to_dict() == minigate.ModelConfig.from_dict(run["model"]).to_dict()
    tok = data.get_tokenizer(SHIPPED_DIR / name / "tokenizer.json")  # the folder carries its tokenizer: the shipped one
    assert tok.tok.to_str() == data.get_tokenizer().tok.to_str()
    text = "def add(a, b):\n    return a + b\n\n\nThe river flows into the sea."
    ids = data.encode(text, tok)
    folder_tok = data.get_tokenizer(SHIPPED_DIR / name)  # the folder (its tokenizer_config.json): AutoTokenizer
    assert folder_tok.encode(text) == ids.tolist() and folder_tok.bos_id == tok.bos_id
    x = torch.cat([torch.tensor([tok.bos_id]), ids])[None]
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(model(x[:, :-1])[0], x[0, 1:]).item()
    assert loss < 6.0, f"{name}: loss {loss:.2f} on plain text; ln(4096) = 8.3 would mean it learned nothing"
    assert json.loads((SHIPPED_DIR / name / "config.json").read_text())["num_hidden_layers"] == 4


def test_induction_models_match_their_run_and_only_the_baseline_has_a_sink_head():
    """What data/checkpoints/README.md and lesson 04 say of these three: the baseline grows one head that parks
    its idle attention on the (random, not <bos>) first token; neither gated model has a head above 0.3."""
    from minigate.analysis import attention_sink

    x = data.induction_task(256, seed=3)[:, :-1]  # held out: seeds 1 and 2 made the training and validation rows
    assert not (x[:, 0] == 0).any(), "the induction rows start with a random first token, never <bos>"
    heads = {}
    for name in INDUCTION:
        model, run = release.shipped(name), release.shipped_run(name)
        assert run["preset"] == "induction" and run["corpus"] == "induction"
        assert run["history"]["step"][-1] == run["train"]["steps"] == 15000
        assert model.cfg.vocab_size == 146
        assert model.cfg.to_dict() == minigate.ModelConfig.from_dict(run["model"]).to_dict()
        heads[name] = attention_sink(model, x).n_sink_heads
    assert heads == {"induction-baseline": 1, "induction-headwise": 0, "induction-elementwise": 0}, heads


@pytest.mark.slow
def test_code_models_show_the_sink_and_the_gate_removing_most_of_it():
    """What data/checkpoints/README.md and lesson 04 say of these three, measured afresh on 16 held-out prose
    windows at T=512 (scripts/ship.py's bar checks the stored rows of all 75, tests/test_release.py):
    the baseline has a head with a quarter of its attention on <bos> and massive activations; the elementwise twin has
    at most a third of its F-Attn above uniform, the headwise twin at most half; both at least 1.5x lower M-Act, at no
    worse validation loss."""
    from minigate.analysis import attention_sink, massive_activations, uniform_first_token_share
    from minigate.measure import prose_windows

    prose = prose_windows(data.DEFAULT_TOKENIZER, limit=16)
    excess, m_act, head, loss = {}, {}, {}, {}
    for name in CODE:
        model, run = release.shipped(name), release.shipped_run(name)
        assert run["preset"] == "code" and run["history"]["step"][-1] == run["train"]["steps"] == 4000
        assert model.cfg.to_dict() == minigate.ModelConfig.from_dict(run["model"]).to_dict()
        sink = attention_sink(model, prose, batch_size=8)
        excess[name], head[name] = sink.f_attn - uniform_first_token_share(512), sink.share.max().item()
        m_act[name], loss[name] = massive_activations(model, prose, batch_size=8).m_act, run["history"]["val_loss"][-1]
    assert head["code-baseline"] > 0.2 and m_act["code-baseline"] > 50, (head, m_act)
    assert excess["code-elementwise"] * 3 < excess["code-baseline"], excess
    assert excess["code-headwise"] * 2 < excess["code-baseline"], excess
    for name in CODE[1:]:
        assert m_act[name] * 1.5 < m_act["code-baseline"] and head[name] < head["code-baseline"], (m_act, head)
        assert loss[name] <= loss["code-baseline"] + 0.02, loss


@pytest.mark.slow
def test_the_moe_pair_matches_its_run_and_the_baseline_opens_in_transformers():
    """code-moe-baseline / -elementwise (lesson 08): the code-moe preset's run, 8 experts of which 2 per token; the
    baseline's folder is a transformers Qwen3-MoE checkpoint that gives minigate's logits."""
    from transformers import AutoModelForCausalLM

    for name, gate in (("code-moe-baseline", "none"), ("code-moe-elementwise", "elementwise")):
        model, run = release.shipped(name), release.shipped_run(name)
        assert run["preset"] == "code-moe" and run["variant"] == gate
        assert run["history"]["step"][-1] == run["train"]["steps"] == 4000 and len(run["history"]["aux_loss"]) > 0
        assert (model.cfg.n_experts, model.cfg.n_experts_per_token, model.cfg.expert_width) == (8, 2, 192)
        assert model.cfg.to_dict() == minigate.ModelConfig.from_dict(run["model"]).to_dict()
    hf = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR / "code-moe-baseline", torch_dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3MoeForCausalLM"
    x = data.encode("def f(x):\n    return x + 1\n", data.load_tokenizer())[None, :32]
    with torch.no_grad():
        diff = (hf(x).logits - release.shipped("code-moe-baseline", dtype=torch.float32)(x)).abs().max().item()
    assert diff < 1e-4, diff
