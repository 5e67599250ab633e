"""The GPU path of the package: `pytest -m gpu tests/gpu` on a CUDA machine (skipped without CUDA).

fp16 autocast with a GradScaler (what a T4 uses), bf16, torch.compile, resume on CUDA, the `code-gpu`
preset through the command line, and the paper-format loader onto the GPU in half precision.
"""

import json

import pytest
import torch

import minigate
from minigate import ModelConfig, Transformer
from minigate import train as T
from minigate.cli import main
from minigate.hardware import pick_precision

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
TINY = dict(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128,
            gate="G1", gate_granularity="headwise")
# TrainConfig fields of the CUDA runs (train_cfg in tests/conftest.py: its tiny CPU run with these changed)
CUDA_RUN = dict(steps=30, batch_size=8, seq_len=64, warmup_steps=3, lr=3e-3, eval_every=10, ckpt_every=10,
                device="cuda")


def _model():
    torch.manual_seed(0)
    return Transformer(ModelConfig(**TINY))


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_training_on_cuda_learns_in_every_precision(precision, token_split, train_cfg):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    tr, va = token_split(n=20_000, n_val=2_000)
    h = T.train(_model(), tr, va, train_cfg(**CUDA_RUN, precision=precision), progress=False)
    assert all(torch.isfinite(torch.tensor(h.loss))) and h.val_loss[-1] < h.val_loss[0]


def test_fp16_uses_a_grad_scaler_and_auto_picks_by_capability():
    assert pick_precision("fp16", torch.device("cuda")) == (torch.float16, True)
    want = (torch.bfloat16, False) if torch.cuda.get_device_capability()[0] >= 8 else (torch.float16, True)
    assert pick_precision("auto", torch.device("cuda")) == want


def test_compile_matches_eager_closely(token_split, train_cfg):
    tr, va = token_split(n=20_000, n_val=2_000)
    eager = T.train(_model(), tr, va, train_cfg(**CUDA_RUN, precision="fp32", compile=False), progress=False)
    with_compile = T.train(_model(), tr, va, train_cfg(**CUDA_RUN, precision="fp32", compile=True), progress=False)
    assert with_compile.val_loss[-1] == pytest.approx(eager.val_loss[-1], abs=2e-2)


def test_resume_on_cuda_continues_the_run(tmp_path, token_split, train_cfg):
    tr, va = token_split(n=20_000, n_val=2_000)
    straight = T.train(_model(), tr, va, train_cfg(**CUDA_RUN, precision="fp32"), progress=False)

    def stop(step, model, history):
        if step == 10:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        T.train(_model(), tr, va, train_cfg(**CUDA_RUN, precision="fp32", callback_every=1), out_dir=tmp_path,
                callback=stop, progress=False)
    resumed = T.train(_model(), tr, va, train_cfg(**CUDA_RUN, precision="fp32", callback_every=1), out_dir=tmp_path,
                      resume=True, progress=False)
    assert resumed.step == straight.step
    # CUDA kernels need not be bitwise deterministic; the run must continue, not restart
    assert resumed.val_loss[-1] == pytest.approx(straight.val_loss[-1], abs=1e-3)


def test_from_pretrained_onto_cuda_in_half_precision(tmp_path):
    model = _model().eval()
    minigate.save_pretrained(model, tmp_path)
    gpu = minigate.from_pretrained(tmp_path, dtype=torch.float16, device="cuda")
    assert next(gpu.parameters()).device.type == "cuda" and next(gpu.parameters()).dtype == torch.float16
    tokens = torch.randint(0, 64, (2, 32))
    want = model(tokens)
    got = gpu(tokens.cuda()).float().cpu()
    assert (got - want).abs().max() < 5e-2 * want.abs().max()
    logits, cache = gpu.run_with_cache(tokens.cuda(), names_filter=lambda n: n.endswith("hook_pattern"))
    assert cache["blocks.0.attn.hook_pattern"].is_cuda


def test_code_preset_on_cuda_through_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGATE_CODE_MAX_BYTES", "3000000")
    out = tmp_path / "code"
    assert main(["train", "--preset", "code-gpu", "--variant", "headwise", "--out", str(out), "--steps", "20",
                 "--quiet", "--set", "eval_every=10"]) == 0
    run_json = json.loads((out / "run.json").read_text())
    history = json.loads((out / "history.json").read_text())
    assert run_json["train"]["compile"] == "auto" and history["val_loss"][-1] < history["val_loss"][0]
    assert [m["step"] for m in history["metrics"]] == [10, 20]
