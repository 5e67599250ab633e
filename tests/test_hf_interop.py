"""minigate folders in Hugging Face transformers: the tokenizer and a baseline through the Auto classes with the
same ids and logits, gated folders refused loudly, an elementwise model through Qwen3NextForCausalLM;
from_pretrained's Hub and dtype options; the package's version."""

import json
import subprocess
import sys

import pytest
import torch

import minigate
from minigate import ModelConfig, Transformer
from minigate.resources import DATA_DIR
from minigate.course import release

TOKENIZER = DATA_DIR / "tokenizer.json"
TEXTS = ["\n  def", "def add(a, b):\n    return a + b\n\n\nThe river flows into the sea . Hello , world",
         "  \t naïve café — 東京 ✓ 🙂", "x<bos>y"]


def _small(**kw) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=4096, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=48, **kw)
    model = Transformer(cfg).eval()
    for p in model.parameters():  # norms start at 1: perturb them so a missed or unshifted norm weight shows
        p.data.add_(0.1 * torch.randn_like(p))
    return model


def _ids(n=2, t=12, vocab=4096, seed=0):
    return torch.randint(0, vocab, (n, t), generator=torch.Generator().manual_seed(seed))


# ---- the tokenizer ----------------------------------------------------------------------------------
def test_auto_tokenizer_gives_minigate_ids_and_keeps_bos(tmp_path):
    from transformers import AutoTokenizer

    from minigate import data

    minigate.save_tokenizer(TOKENIZER, tmp_path)
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["bos_token"] == "<bos>"
    hf, ours = AutoTokenizer.from_pretrained(tmp_path), data.load_tokenizer(TOKENIZER)
    assert hf.bos_token == "<bos>" and hf.bos_token_id == ours.token_to_id("<bos>") == 0
    assert hf("\n  def")["input_ids"][0] == 2165  # Qwen2Tokenizer, AutoTokenizer's guess without the config: 199
    for text in TEXTS:
        ids = ours.encode(text).ids
        assert hf(text)["input_ids"] == ids == hf(text, add_special_tokens=False)["input_ids"], text
        assert hf.decode(ids, skip_special_tokens=True) == ours.decode(ids)  # tokenizers skips <bos> by default
        assert hf.decode(ids) == ours.decode(ids, skip_special_tokens=False)  # transformers keeps it
    assert hf.decode(hf("a , b .")["input_ids"]) == "a , b ."  # no clean-up of spaces before punctuation


def test_save_tokenizer_over_its_own_copy_and_without_bos(tmp_path):
    from tokenizers import Tokenizer, models

    minigate.save_tokenizer(TOKENIZER, tmp_path)
    minigate.save_tokenizer(tmp_path / "tokenizer.json", tmp_path)  # the folder's own file: left as it is
    assert (tmp_path / "tokenizer.json").read_bytes() == TOKENIZER.read_bytes()
    Tokenizer(models.BPE()).save(str(tmp_path / "plain.json"))
    minigate.save_tokenizer(tmp_path / "plain.json", tmp_path / "plain")
    assert "bos_token" not in json.loads((tmp_path / "plain" / "tokenizer_config.json").read_text())
    with pytest.raises(FileNotFoundError, match="no tokenizer at"):
        minigate.save_tokenizer(tmp_path / "missing.json", tmp_path)


@pytest.mark.parametrize("name", ["text-baseline", "text-headwise", "text-elementwise",
                                  "code-baseline", "code-headwise", "code-elementwise"])
def test_shipped_text_models_carry_the_tokenizer_config(name):
    from minigate.pretrained import tokenizer_config

    folder = DATA_DIR / "checkpoints" / name
    assert json.loads((folder / "tokenizer_config.json").read_text()) == tokenizer_config(TOKENIZER)
    assert (folder / "tokenizer.json").read_bytes() == TOKENIZER.read_bytes()


# ---- a baseline round-trips through the Auto classes ---------------------------------------------------
def test_baseline_and_tokenizer_round_trip_through_auto_classes(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from minigate import data

    model = _small()
    minigate.save_pretrained(model, tmp_path, tokenizer=TOKENIZER)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    ids = data.get_tokenizer(TOKENIZER).encode(TEXTS[1])
    x = torch.tensor([[tok.bos_token_id] + tok(TEXTS[1])["input_ids"]])
    assert x[0, 1:].tolist() == ids
    with torch.no_grad():
        diff = (hf(x).logits - model(x)).abs().max().item()
    print(f"baseline through AutoModelForCausalLM: max |logit difference| {diff:.2e}")
    assert diff < 1e-5
    assert minigate.from_pretrained(tmp_path).cfg == model.cfg  # and minigate still reads it


# ---- gated folders: transformers refuses them ---------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(gate="G1", gate_granularity="headwise"), dict(gate="G1"),
                                dict(gate="G2", gate_head_specific=False), dict(sandwich_norm=True),
                                dict(qk_norm=False)])
def test_folders_transformers_cannot_compute_fail_loudly_there(tmp_path, kw):
    from transformers import AutoConfig, AutoModelForCausalLM

    model = _small(**kw)
    minigate.save_pretrained(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "minigate" and config["architectures"] == ["MinigateForCausalLM"]
    for load in (AutoConfig.from_pretrained, AutoModelForCausalLM.from_pretrained,
                 lambda p: AutoModelForCausalLM.from_pretrained(p, ignore_mismatched_sizes=True)):
        with pytest.raises(ValueError, match="minigate"):
            load(tmp_path)
    back = minigate.from_pretrained(tmp_path)  # minigate reads it, exactly
    assert back.cfg == model.cfg
    torch.testing.assert_close(back(_ids()), model(_ids()), atol=0, rtol=0)


def test_official_gated_configs_still_load(tmp_path):
    """The paper's checkpoints declare Qwen3ForCausalLM with the *_attn_output_gate keys (no "minigate" key)."""
    model = _small(gate="G1", gate_granularity="headwise")
    minigate.save_pretrained(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for key in ("minigate", "minigate_note"):
        config.pop(key)
    config.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    back = minigate.from_pretrained(tmp_path)
    assert back.cfg == model.cfg
    torch.testing.assert_close(back(_ids()), model(_ids()), atol=0, rtol=0)


@pytest.mark.parametrize("name", release.shipped_names())
def test_shipped_configs_follow_the_convention(name):
    config = json.loads((DATA_DIR / "checkpoints" / name / "config.json").read_text())
    cfg = ModelConfig.from_hf_config(config)
    assert config == cfg.to_hf_config()
    # a baseline is a transformers checkpoint (qwen3, or qwen3_moe with experts); a gated model says minigate, so
    # transformers refuses it instead of silently dropping the gate
    want = "minigate" if cfg.gate != "none" else "qwen3_moe" if cfg.n_experts else "qwen3"
    assert config["model_type"] == want


# ---- an elementwise model through Qwen3-Next ------------------------------------------------------------
@pytest.mark.parametrize("tied", [True, False])
def test_elementwise_model_exports_to_qwen3_next(tmp_path, tied):
    from transformers import AutoModelForCausalLM, Qwen3NextForCausalLM

    model = _small(gate="G1", gate_granularity="elementwise", tie_embeddings=tied)
    minigate.export_qwen3_next(model, tmp_path, tokenizer=TOKENIZER)
    hf = Qwen3NextForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert all(layer.self_attn is not None for layer in hf.model.layers)  # full attention everywhere
    assert type(hf.model.layers[0].mlp).__name__ == "Qwen3NextMLP"  # no experts
    x = _ids(2, 20)
    with torch.no_grad():
        diff = (hf(x).logits - model(x)).abs().max().item()
    print(f"elementwise G1 through Qwen3NextForCausalLM (tied={tied}): max |logit difference| {diff:.2e}")
    assert diff < 1e-5
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path)).__name__ == "Qwen3NextForCausalLM"
    with pytest.raises(ValueError, match="Qwen3-Next folder"):
        minigate.from_pretrained(tmp_path)


def test_export_is_sensitive_to_the_q_proj_order(tmp_path):
    """The per-head [q_h | gate_h] re-ordering matters: without it the logits move (so the test above checks it)."""
    from einops import rearrange
    from safetensors.torch import load_file, save_file
    from transformers import Qwen3NextForCausalLM

    model = _small(gate="G1", gate_granularity="elementwise")
    minigate.export_qwen3_next(model, tmp_path)
    w = load_file(tmp_path / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    w[name] = rearrange(w[name], "(kv g two d) c -> (kv two g d) c", kv=2, two=2, g=2)  # back to per kv head
    save_file(w, tmp_path / "model.safetensors", metadata={"format": "pt"})
    hf = Qwen3NextForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    with torch.no_grad():
        assert (hf(_ids()).logits - model(_ids())).abs().max() > 1e-3


@pytest.mark.parametrize("kw, field", [
    (dict(gate="G1", gate_granularity="headwise"), "gate_granularity"), (dict(gate="G2"), "gate"),
    (dict(gate="G1", gate_head_specific=False), "gate_head_specific"),
    (dict(gate="G1", gate_activation="silu"), "gate_activation"), (dict(gate="G1", gate_layers=1), "gate_layers"),
    (dict(gate="G1", gate_bias=-2.0), "gate_bias"), (dict(gate="G1", sandwich_norm=True), "sandwich_norm"),
    (dict(gate="G1", qk_norm=False), "qk_norm"), (dict(), "gate")])
def test_export_refuses_what_qwen3_next_cannot_express(tmp_path, kw, field):
    with pytest.raises(ValueError, match=rf"cannot export to Qwen3-Next: ModelConfig\.{field}="):
        minigate.export_qwen3_next(Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2,
                                                           n_kv_heads=2, head_dim=16, d_ff=48, **kw)), tmp_path)
    assert not (tmp_path / "config.json").exists()


# ---- from_pretrained: dtype and Hub options ----------------------------------------------------------
def test_dtype_auto_and_names(tmp_path):
    model = _small(gate="G1", gate_granularity="headwise")
    minigate.save_pretrained(model, tmp_path / "bf16", dtype="bfloat16")
    minigate.save_pretrained(model, tmp_path / "fp32")
    dtypes = lambda m: {p.dtype for p in m.parameters()}
    assert dtypes(minigate.from_pretrained(tmp_path / "bf16", dtype="auto")) == {torch.bfloat16}
    assert dtypes(minigate.from_pretrained(tmp_path / "fp32", dtype="auto")) == {torch.float32}
    assert dtypes(minigate.from_pretrained(tmp_path / "bf16")) == {torch.float32}  # None: float32, as before
    for name, want in [("bfloat16", torch.bfloat16), ("float16", torch.float16), ("torch.float16", torch.float16),
                       ("float32", torch.float32), (torch.bfloat16, torch.bfloat16)]:
        assert dtypes(minigate.from_pretrained(tmp_path / "fp32", dtype=name)) == {want}, name
    for bad in ("bfloat", "int8", torch.int64):
        with pytest.raises(ValueError, match=r"dtype=.*use a floating torch dtype"):
            minigate.from_pretrained(tmp_path / "fp32", dtype=bad)


def test_hub_options_reach_snapshot_download(tmp_path, monkeypatch):
    import huggingface_hub

    model = _small()
    seen = {}

    def fake_snapshot_download(repo_id, **kw):
        seen.update(kw, repo_id=repo_id)
        minigate.save_pretrained(model, tmp_path / "1B_baseline")
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    got = minigate.from_pretrained("QwQZh/gated_attention", subfolder="1B_baseline", revision="abc123",
                                   cache_dir=tmp_path / "cache", token="hf_x", dtype="auto")
    assert seen["repo_id"] == "QwQZh/gated_attention" and seen["allow_patterns"] == ["1B_baseline/*"]
    assert (seen["revision"], seen["cache_dir"], seen["token"]) == ("abc123", tmp_path / "cache", "hf_x")
    assert got.cfg == model.cfg


def test_offline_error_names_the_revision(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="at revision 'abc123'.*No network"):
        minigate.from_pretrained("QwQZh/gated_attention", subfolder="1B_gate_headwise", revision="abc123")


# ---- packaging ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_version_flag_and_one_version_string():
    from importlib.metadata import PackageNotFoundError, version

    out = subprocess.run([sys.executable, "-m", "minigate.cli", "--version"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"minigate {minigate.__version__}", out
    try:
        assert version("minigate") == minigate.__version__  # the installed metadata reads the same string
    except PackageNotFoundError:
        pass
    assert (minigate.resources.PACKAGE / "py.typed").exists()


def test_minigate_train_writes_the_tokenizer_config(tmp_path):
    from transformers import AutoTokenizer

    from minigate.cli import main

    out = tmp_path / "run"
    assert main(["train", "--preset", "ci", "--variant", "none", "--quiet", "--threads", "1", "--out", str(out),
                 "--steps", "1"]) == 0
    tok = AutoTokenizer.from_pretrained(out / "model")
    assert tok.bos_token_id == 0 and tok("\n  def")["input_ids"] == minigate.data.load_tokenizer().encode("\n  def").ids
