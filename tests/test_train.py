"""The training loop: schedule, bitwise resume, non-finite loss, atomic checkpoints, bf16, callbacks."""

import json
import math

import pytest
import torch

from minigate import hardware
from minigate import train as T
from minigate.checkpoint import History, ckpt_step, load_checkpoint
from minigate.evaluation import eval_mode, token_cross_entropy
from minigate.presets import PRESETS, TrainConfig, model_config


def test_lr_schedule_warmup_then_cosine_to_min():
    cfg = TrainConfig(steps=100, warmup_steps=10, lr=1.0, min_lr_ratio=0.1)
    lrs = [T.lr_at(s, cfg) for s in range(1, 101)]
    assert lrs[:10] == pytest.approx([s / 10 for s in range(1, 11)])  # linear warmup
    assert max(lrs) == lrs[9] == pytest.approx(1.0)  # peak at the last warmup step
    assert lrs[-1] == pytest.approx(0.1)  # down to min_lr at the last step
    assert all(a > b for a, b in zip(lrs[9:], lrs[10:], strict=False))  # strictly decreasing after warmup
    assert T.lr_at(55, cfg) == pytest.approx(0.55)  # halfway through the cosine: halfway between
    assert T.lr_at(10 + 90 // 4, cfg) > 0.55 + 0.45 / 2  # cosine, not linear: above the line early on


def test_lr_schedule_wsd_constant_then_linear_decay():
    cfg = TrainConfig(steps=100, warmup_steps=10, lr=1.0, min_lr_ratio=0.1, schedule="wsd", decay_frac=0.2)
    lrs = [T.lr_at(s, cfg) for s in range(1, 101)]
    assert lrs[:10] == pytest.approx([s / 10 for s in range(1, 11)])  # the same warmup
    assert lrs[9:80] == pytest.approx([1.0] * 71)  # stable until the last 20 steps
    assert lrs[-1] == pytest.approx(0.1) and T.lr_at(90, cfg) == pytest.approx(0.55)  # linear down to min_lr
    assert all(a > b for a, b in zip(lrs[79:], lrs[80:], strict=False))
    constant = TrainConfig(steps=100, warmup_steps=10, lr=1.0, min_lr_ratio=1.0)  # min_lr_ratio 1: flat
    assert [T.lr_at(s, constant) for s in range(10, 101)] == pytest.approx([1.0] * 91)


@pytest.mark.parametrize("kw", [dict(schedule="linear"), dict(decay_frac=0), dict(decay_frac=1.5)])
def test_bad_schedule_is_refused(kw):
    with pytest.raises(ValueError, match="schedule|decay_frac"):
        TrainConfig(**kw)


_FAULTS = """
import resource, sys, torch
from minigate import ModelConfig, Transformer
from minigate.evaluation import token_cross_entropy
from minigate.hardware import tune_cpu_allocator
if sys.argv[1] == "tuned":
    assert tune_cpu_allocator()
torch.manual_seed(0)
model = Transformer(ModelConfig(vocab_size=4096, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=16,
                                d_ff=64))
x = torch.randint(0, 4096, (16, 256))  # logits and their gradient: 64 MB each
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(12):
    if i == 6:
        before = faults()  # the steady state: steps 7-12
    token_cross_entropy(model(x), x).backward()
print(faults() - before)
"""


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="glibc's mallopt: Linux only")
@pytest.mark.slow
def test_cpu_allocator_keeps_freed_memory():
    # by default glibc maps blocks over its mmap threshold (at most 32 MB) afresh and hands them back when
    # freed, so every step faults the 64 MB logits' pages in again (about 400k page faults over six steps
    # here); tuned, the freed blocks are kept and reused (0-2 faults)
    import subprocess
    import sys

    def faults(mode):
        return int(subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True,
                                  check=True, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"}).stdout)

    tuned, default = faults("tuned"), faults("default")
    assert tuned * 10 < default, (tuned, default)


def _params_equal(a, b):
    """The same tensors under the same names: a tensor missing from either side makes them differ."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _stop_at(step, exc):
    def callback(s, model, history):
        if s == step:
            raise exc
    return callback


@pytest.mark.parametrize("how", ["ctrl-c", "killed"])
def test_resumed_run_is_bitwise_equal_to_uninterrupted(tmp_path, how, tiny_model, token_split, train_cfg):
    tr, va = token_split()
    cfg = train_cfg(grad_accum=2, callback_every=1, ckpt_every=2)
    straight = tiny_model(gate="G1", gate_granularity="headwise")
    h1 = T.train(straight, tr, va, cfg, progress=False)

    interrupted = tiny_model(gate="G1", gate_granularity="headwise")
    if how == "ctrl-c":  # KeyboardInterrupt after step 3: a checkpoint of step 3 is written
        with pytest.raises(KeyboardInterrupt):
            T.train(interrupted, tr, va, cfg, out_dir=tmp_path, callback=_stop_at(3, KeyboardInterrupt()),
                    progress=False)
        assert ckpt_step(tmp_path / "checkpoint.pt") == 3
    else:  # dies during step 5: only the periodic checkpoint of step 4 is there
        with pytest.raises(RuntimeError, match="power cut"):
            T.train(interrupted, tr, va, cfg, out_dir=tmp_path,
                    callback=_stop_at(5, RuntimeError("power cut")), progress=False)
        assert ckpt_step(tmp_path / "checkpoint.pt") == 4
    resumed = tiny_model(gate="G1", gate_granularity="headwise")
    torch.manual_seed(123)  # the global RNG is restored from the checkpoint too
    h2 = T.train(resumed, tr, va, cfg, out_dir=tmp_path, resume=True, progress=False)
    assert _params_equal(straight, resumed)
    assert h2.step == h1.step and h2.loss == h1.loss and h2.val_loss == h1.val_loss
    assert not _params_equal(straight, tiny_model(gate="G1", gate_granularity="headwise"))  # it did train


def test_resume_without_checkpoint_flag_refuses_to_overwrite(tmp_path, tiny_model, token_split, train_cfg):
    tr, va = token_split()
    T.train(tiny_model(), tr, va, train_cfg(steps=2, warmup_steps=1), out_dir=tmp_path, progress=False)
    with pytest.raises(FileExistsError, match="resume=True"):
        T.train(tiny_model(), tr, va, train_cfg(steps=2, warmup_steps=1), out_dir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="another model config"):
        T.train(tiny_model(d_ff=32), tr, va, train_cfg(steps=2, warmup_steps=1), out_dir=tmp_path, resume=True,
                progress=False)


def test_checkpoint_from_before_a_config_field_existed_still_resumes(tmp_path, tiny_model, token_split, train_cfg):
    tr, va = token_split()
    T.train(tiny_model(), tr, va, train_cfg(steps=2, warmup_steps=1), out_dir=tmp_path, progress=False)
    ckpt = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    del ckpt["model_config"]["gate_bias"]  # written by a version without this field: it means the default
    torch.save(ckpt, tmp_path / "checkpoint.pt")
    with pytest.warns(UserWarning, match="changed steps"):  # a longer run: told, and allowed
        h = T.train(tiny_model(), tr, va, train_cfg(steps=3, warmup_steps=1), out_dir=tmp_path, resume=True,
                    progress=False)
    assert h.step[-1] == 3


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, tiny_model, token_split, train_cfg):
    tr, va = token_split()
    model, calls = tiny_model(), {"n": 0}

    def poison(x, hook):  # the 5th training forward (step 5) produces NaN
        if torch.is_grad_enabled():
            calls["n"] += 1
            if calls["n"] == 5:
                return x * float("nan")

    with model.hooks([("hook_embed", poison)]):
        with pytest.raises(T.TrainingDiverged, match=r"loss nan at step 5.*checkpoint.*step 4\) was kept"):
            T.train(model, tr, va, train_cfg(steps=8, ckpt_every=2), out_dir=tmp_path, progress=False)
    ckpt = load_checkpoint(tmp_path / "checkpoint.pt")
    assert ckpt["step"] == 4 and all(torch.isfinite(v).all() for v in ckpt["model"].values())
    assert all(torch.isfinite(p).all() for p in model.parameters())  # the bad step was never applied
    assert not (tmp_path / "model").exists()  # no final model from a failed run


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch, tiny_model, token_split, train_cfg):
    tr, va = token_split()
    real_save, calls = torch.save, {"n": 0}

    def crash_on_second_save(obj, f):
        calls["n"] += 1
        if calls["n"] == 1:
            return real_save(obj, f)
        f.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash_on_second_save)
    with pytest.raises(OSError, match="disk full"):
        T.train(tiny_model(), tr, va, train_cfg(steps=4, ckpt_every=2), out_dir=tmp_path, progress=False)
    assert calls["n"] == 2
    assert load_checkpoint(tmp_path / "checkpoint.pt")["step"] == 2  # the previous one is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "history.json"]  # no temp files


def test_bf16_autocast_runs_on_cpu(tiny_model, token_split, train_cfg):
    tr, va = token_split()
    model, dtypes = tiny_model(gate="G1", gate_granularity="elementwise"), set()
    with model.hooks([("blocks.0.attn.hook_z", lambda z, hook: dtypes.add(z.dtype))]):
        h = T.train(model, tr, va, train_cfg(steps=3, precision="bf16"), progress=False)
    assert dtypes == {torch.bfloat16}  # autocast really was on
    assert all(math.isfinite(x) for x in h.loss + h.val_loss)
    assert next(model.parameters()).dtype == torch.float32  # master weights stay fp32
    with pytest.raises(ValueError, match="'fp16' needs a CUDA GPU"):
        T.train(tiny_model(), tr, va, train_cfg(precision="fp16"), progress=False)


@pytest.mark.parametrize("native", [True, False])
def test_auto_precision_on_a_cpu_is_bf16_only_where_it_has_native_bf16(monkeypatch, native, tiny_model,
                                                                       token_split, train_cfg):
    """The hardware query is mocked, not the arithmetic: the run really trains in what "auto" chose."""
    monkeypatch.delenv(hardware.PRECISION_ENV, raising=False)  # "auto" itself, not what the environment names
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: native)
    cpu = torch.device("cpu")
    assert hardware.pick_precision("auto", cpu) == ((torch.bfloat16, False) if native else (None, False))
    assert hardware.pick_precision("fp32", cpu) == (None, False)  # a named precision is what it says
    assert hardware.pick_precision("bf16", cpu) == (torch.bfloat16, False)
    assert hardware.pick_precision("auto", torch.device("mps")) == (None, False)
    tr, va = token_split()
    model, dtypes = tiny_model(), set()
    with model.hooks([("blocks.0.attn.hook_z", lambda z, hook: dtypes.add(z.dtype))]):
        h = T.train(model, tr, va, train_cfg(steps=2, warmup_steps=1, precision="auto"), progress=False)
    assert dtypes == {torch.bfloat16 if native else torch.float32}
    assert h.info["precision_used"] == ("bf16" if native else "fp32")


def test_minigate_precision_sets_what_auto_picks(monkeypatch):
    """MINIGATE_PRECISION=fp16 gives "auto" a T4's arithmetic on any GPU; a named precision ignores it; a typo is
    one clear error. On a CPU fp16 is refused as when named."""
    cpu = torch.device("cpu")
    monkeypatch.setenv("MINIGATE_PRECISION", "fp32")
    assert hardware.pick_precision("auto", cpu) == (None, False)
    monkeypatch.setenv("MINIGATE_PRECISION", "BF16")
    assert hardware.pick_precision("auto", cpu) == (torch.bfloat16, False)
    assert hardware.pick_precision("fp32", cpu) == (None, False)
    monkeypatch.setenv("MINIGATE_PRECISION", "fp16")
    with pytest.raises(ValueError, match="MINIGATE_PRECISION=fp16 needs a CUDA GPU"):
        hardware.pick_precision("auto", cpu)
    with pytest.raises(ValueError, match="^precision='fp16' needs a CUDA GPU"):  # named, not from the variable
        hardware.pick_precision("fp16", cpu)
    monkeypatch.setenv("MINIGATE_PRECISION", "half")
    with pytest.raises(ValueError, match="MINIGATE_PRECISION='half' is not a precision; set it to one of fp32, bf16"):
        hardware.pick_precision("auto", cpu)


@pytest.mark.parametrize("avx512_bf16, amx, native", [(False, False, False), (True, False, True),
                                                       (False, True, True), (True, True, True)])
def test_native_bf16_means_avx512_bf16_or_amx(monkeypatch, avx512_bf16, amx, native):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert hardware.cpu_has_native_bf16() is native


@pytest.mark.filterwarnings("ignore:resuming with a changed steps")
def test_run_json_records_the_precision_used_and_a_resume_elsewhere_says_it_is_not_bitwise(tmp_path, monkeypatch,
                                                                                             tiny_model, token_split,
                                                                                             train_cfg):
    tr, va = token_split()
    monkeypatch.delenv(hardware.PRECISION_ENV, raising=False)  # "auto" itself
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: True)
    T.train(tiny_model(), tr, va, train_cfg(steps=2, warmup_steps=1, precision="auto"), out_dir=tmp_path,
            run_json={"preset": "tiny"}, progress=False)
    assert json.loads((tmp_path / "run.json").read_text()) == {"preset": "tiny", "precision_used": "bf16"}
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: False)  # the same run folder on another CPU
    with pytest.warns(UserWarning, match="resuming in fp32 a run checkpointed in bf16.*not bitwise"):
        h = T.train(tiny_model(), tr, va, train_cfg(steps=3, warmup_steps=1, precision="auto"), out_dir=tmp_path,
                    resume=True, run_json={"preset": "tiny"}, progress=False)
    assert h.info["precision_used"] == "fp32"
    assert json.loads((tmp_path / "model" / "run.json").read_text())["precision_used"] == "fp32"


def test_the_presets_lessons_and_tests_train_on_a_cpu_are_fp32_on_every_cpu():
    """Their outputs are stored in the lessons and compared exactly; the natural-data recipes keep "auto"."""
    assert {name: p.train.precision for name, p in PRESETS.items()} == {
        "ci": "fp32", "copy": "fp32", "induction": "fp32", "text": "fp32",
        "code": "auto", "code-moe": "auto", "code-gpu": "auto"}


def test_callback_metrics_history_and_loss_goes_down(tiny_model, train_cfg):
    tr = torch.arange(4000) % 7 + 1  # a periodic stream: easy to learn
    seen = []

    def callback(step, model, history):
        seen.append((model.training, torch.is_grad_enabled()))
        return {"double": 2 * step}

    h = T.train(tiny_model(), tr, tr[:500], train_cfg(steps=30, warmup_steps=3, eval_every=10, callback_every=15),
                callback=callback, progress=False)
    assert h.metric("double") == ([15, 30], [30, 60]) and seen == [(False, False)] * 2
    assert h.step == list(range(1, 31)) and h.eval_step == [10, 20, 30]
    assert len(h.lr) == len(h.grad_norm) == len(h.tokens_per_s) == 30 and min(h.tokens_per_s) > 0
    assert h.val_loss[-1] < 0.5 * h.val_loss[0]
    assert History.from_dict(h.to_dict()) == h


def test_spike_rule():
    cfg = TrainConfig(spike_factor=1.5, spike_window=4)
    assert T.is_spike(6.1, [4.0] * 4, cfg) and not T.is_spike(5.9, [4.0] * 4, cfg)
    assert not T.is_spike(100.0, [4.0] * 3, cfg)  # not before a full window


def test_bad_inputs_have_clear_errors(tiny_model, token_split, train_cfg):
    tr, va = token_split()
    with pytest.raises(ValueError, match="token id 99.*vocab_size is 64"):
        T.train(tiny_model(), torch.cat([tr, torch.tensor([99])]), va, train_cfg(), progress=False)
    with pytest.raises(ValueError, match="validation corpus has 10 tokens"):
        T.train(tiny_model(), tr, va[:10], train_cfg(), progress=False)
    with pytest.raises(ValueError, match="warmup_steps=10: must be >= 0 and less than steps=10"):
        TrainConfig(steps=10, warmup_steps=10)


def test_presets_build_for_every_gate():
    from minigate.cli import PRESET_NAMES

    assert set(PRESETS) == set(PRESET_NAMES)
    for name, p in PRESETS.items():
        for gate in ("none", "headwise", "elementwise"):
            cfg = model_config(name, gate)
            # copy_task with 64 symbols: 2 * 64 + 2 ids; induction_task adds 16 first-token ids; else the BPE
            vocab = {"copy": 130, "induction": 146}.get(p.corpus, 4096)
            assert cfg.vocab_size == vocab and cfg.max_seq_len >= p.train.seq_len
            assert (cfg.gate == "none") == (gate == "none")
        assert (p.train.ckpt_minutes > 0) == (p.train.steps >= 1000), name  # long presets also checkpoint on a clock


def test_weight_decay_only_on_linear_matrices(tiny_model):
    model = tiny_model()
    opt = T.make_optimizer(model, TrainConfig(weight_decay=0.1), torch.device("cpu"))
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert "blocks.0.attn.q_proj.weight" in decayed and "blocks.1.mlp.down_proj.weight" in decayed
    assert not any("norm" in n or n.startswith("embed") for n in decayed)
    assert sum(len(g["params"]) for g in opt.param_groups) == len(names)


def test_eval_mode_restores_the_callers_mode_also_on_errors(tiny_model):
    model = tiny_model()
    for before in (True, False):
        model.train(before)
        with pytest.raises(RuntimeError), eval_mode(model):
            assert not model.training
            raise RuntimeError("inside")
        assert model.training == before


def test_token_cross_entropy_mean_and_per_token():
    logits, y = torch.randn(3, 5, 7), torch.randint(0, 7, (3, 5))
    per_token = token_cross_entropy(logits, y, reduction="none")
    assert per_token.shape == (3, 5)
    torch.testing.assert_close(per_token.mean(), token_cross_entropy(logits, y))
    torch.testing.assert_close(per_token[1, 2], torch.nn.functional.cross_entropy(logits[1, 2], y[1, 2]))
