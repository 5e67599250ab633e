"""Bad input always gets a one-line answer, and nothing a user trained is ever lost or silently corrupted.

Most cases run the `minigate` command against a finished run folder and assert three things: exit code 2,
exactly one line on stderr starting with `error:` that names the problem, and every file of the folder
byte for byte as it was. The rest check the Python API (configs, hooks, gate overrides, model inputs).
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import minigate
from minigate import ModelConfig, Transformer, ablation
from minigate import train as T
from minigate.checkpoint import CheckpointError, ckpt_step, load_checkpoint
from minigate.cli import main
from minigate.presets import TrainConfig
from minigate.runfolder import RunFolderInUse, RunLock



def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, ci_args):
    """A finished 3-step `ci` run (checkpoint, history, run.json, model/)."""
    out = tmp_path_factory.mktemp("bad") / "run"
    assert main(["train", *ci_args, "--out", str(out), "--steps", "3"]) == 0
    return out


@pytest.fixture
def run_copy(run_dir, tmp_path):
    """A copy of the finished run that a test may damage."""
    import shutil

    return Path(shutil.copytree(run_dir, tmp_path / "run"))


def _one_line_error(capsys, argv, *fragments, folder=None):
    """Run the command; assert exit 2, one stderr line `error: ...` holding every fragment, folder unchanged."""
    before = _snapshot(folder) if folder is not None else None
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    for f in fragments:
        assert f in err, (f, err)
    if folder is not None:
        assert _snapshot(folder) == before, "the run folder changed"
    return err


# -- --set values: each is refused before anything is written, whatever the folder held --------------------
SET_CASES = [
    ("grad_clip=-1", "grad_clip"), ("lr=-1", "TrainConfig.lr"), ("lr=nan", "TrainConfig.lr"),
    ("norm_eps=-1", "norm_eps"), ("rope_theta=0", "rope_theta"), ("n_layers=True", "expected an integer"),
    ("betas=0.9", "betas"), ("min_lr_ratio=2", "min_lr_ratio"), ("warmup_steps=-1", "warmup_steps"),
    ("eval_batches=-1", "eval_batches"), ("spike_factor=0", "spike_factor"), ("ckpt_minutes=-1", "ckpt_minutes"),
    ("weight_decay=inf", "weight_decay"), ("gate_bias=nan", "gate_bias"), ("seq_len=4096", "max_seq_len"),
    ("gate=G7", "gate position"), ("d_ff=0", "d_ff"), ("nope=1", "no such ModelConfig or TrainConfig field"),
]


@pytest.mark.parametrize("setting,fragment", SET_CASES, ids=[c[0] for c in SET_CASES])
def test_bad_set_value_is_refused_and_the_run_is_untouched(run_dir, capsys, setting, fragment, ci_args):
    _one_line_error(capsys, ["train", *ci_args, "--out", str(run_dir), "--resume", "--set", setting],
                    "--set", fragment, folder=run_dir)


def test_bad_set_on_a_fresh_folder_writes_nothing(tmp_path, capsys, ci_args):
    _one_line_error(capsys, ["train", *ci_args, "--out", str(tmp_path / "new"), "--set", "lr=-1"], "lr")
    assert not (tmp_path / "new").exists()


def test_a_rejected_resume_leaves_run_json_so_the_plain_resume_still_works(run_copy, capsys, ci_args):
    _one_line_error(capsys, ["train", *ci_args, "--out", str(run_copy), "--resume", "--set", "d_ff=128"],
                    "another model config", "d_ff", folder=run_copy)
    assert "delete" not in capsys.readouterr().err
    with pytest.warns(UserWarning, match="steps"):
        assert main(["train", *ci_args, "--out", str(run_copy), "--resume", "--steps", "4"]) == 0
    assert json.loads((run_copy / "history.json").read_text())["step"] == [1, 2, 3, 4]


@pytest.mark.slow
def test_set_order_does_not_matter_and_the_gate_is_named_as_built(tmp_path, capsys, ci_args):
    for order in (["gate=G5", "gate_granularity=elementwise"], ["gate_granularity=elementwise", "gate=G5"]):
        out = tmp_path / "_".join(order)
        sets = [x for s in order for x in ("--set", s)]
        capsys.readouterr()
        assert main(["train", *ci_args, "--out", str(out), "--steps", "1", *sets]) == 0
        assert "ci / G5 elementwise:" in capsys.readouterr().out
        assert json.loads((out / "run.json").read_text())["gate_config"] == "G5 elementwise"
        assert minigate.from_pretrained(out / "model").cfg.gate == "G5"


# -- flags, folders, files ------------------------------------------------------------------------------
def test_flag_values_are_checked_by_the_parser(tmp_path, capsys, ci_args):
    for argv, fragment in [(["train", *ci_args[:4], "--out", str(tmp_path), "--threads", "-1"], "--threads"),
                           (["train", *ci_args, "--out", str(tmp_path), "--steps", "0"], "--steps"),
                           (["eval", str(tmp_path), "--seq-len", "0"], "--seq-len"),
                           (["eval", str(tmp_path), "--batch-size", "0"], "--batch-size")]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and fragment in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--gate", "--gates"])
def test_the_old_gate_flag_is_one_line_naming_variant(tmp_path, capsys, flag):
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["train", "--preset", "ci", flag, "headwise", "--out", str(tmp_path / "r"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("error: ") and "\n" not in err, err
    assert f"{flag} is now spelled --variant: --variant headwise" in err
    assert not (tmp_path / "r").exists()


def test_a_run_folder_recording_its_variant_as_gate_is_one_line_and_resumes_once_renamed(run_copy, capsys, ci_args):
    """Folders written by minigate 0.1 record the variant under "gate": one line says which key to rename, nothing in
    the folder changes, and once renamed the run resumes."""
    recorded = json.loads((run_copy / "run.json").read_text())
    (run_copy / "run.json").write_text(json.dumps({("gate" if k == "variant" else k): v for k, v in recorded.items()}))
    _one_line_error(capsys, ["train", *ci_args, "--out", str(run_copy), "--resume"],
                    "records the run's variant under 'gate'", "rename that key to 'variant'", folder=run_copy)
    (run_copy / "run.json").write_text(json.dumps(recorded))  # what the line asks for
    with pytest.warns(UserWarning, match="steps"):
        assert main(["train", *ci_args, "--out", str(run_copy), "--resume", "--steps", "4"]) == 0
    assert json.loads((run_copy / "run.json").read_text())["variant"] == "headwise"


def test_out_that_is_a_file_or_unwritable(tmp_path, capsys, ci_args):
    f = tmp_path / "a_file"
    f.write_text("mine")
    _one_line_error(capsys, ["train", *ci_args, "--out", str(f)], "is a file")
    assert f.read_text() == "mine"
    _one_line_error(capsys, ["train", *ci_args, "--out", "/proc/minigate-run"], "cannot be written")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda(tmp_path, capsys, ci_args):
    _one_line_error(capsys, ["train", *ci_args, "--out", str(tmp_path / "r"), "--device", "cuda"], "no CUDA GPU")
    assert not (tmp_path / "r").exists()
    _one_line_error(capsys, ["train", *ci_args, "--out", str(tmp_path / "r"), "--device", "gpu0"], "not a torch device")


def test_damaged_checkpoints_are_named_as_damaged_and_left_alone(run_copy, capsys, ci_args):
    ckpt = run_copy / "checkpoint.pt"
    good = ckpt.read_bytes()
    resume = ["train", *ci_args, "--out", str(run_copy), "--resume", "--steps", "5"]
    ckpt.write_bytes(good[: len(good) // 2])  # truncated
    _one_line_error(capsys, resume, "checkpoint.pt is damaged", "truncated", folder=run_copy)
    ckpt.write_bytes(b"")  # empty
    _one_line_error(capsys, resume, "the file is empty", folder=run_copy)
    ckpt.write_bytes(good)  # flip bytes inside one weight tensor: loads fine, fails the checksum
    state = torch.load(ckpt, weights_only=True)
    name = "embed.weight"
    raw = bytearray(good)
    needle = state["model"][name].reshape(-1)[:4].numpy().tobytes()
    at = raw.find(needle)
    assert at > 0
    raw[at + 3] ^= 0x7F
    ckpt.write_bytes(bytes(raw))
    err = _one_line_error(capsys, resume, "checksum", "corrupted", folder=run_copy)
    assert "delete" not in err and "learning rate" not in err
    with pytest.raises(CheckpointError, match="checksum"):
        load_checkpoint(ckpt)


def test_damaged_weights_tokenizer_and_config(run_copy, capsys, tmp_path, ci_args):
    model = run_copy / "model"
    st = model / "model.safetensors"
    st.write_bytes(st.read_bytes()[:1000])
    with pytest.raises(ValueError, match="damaged or incomplete") as e:
        minigate.from_pretrained(model)
    assert "\n" not in str(e.value)
    _one_line_error(capsys, ["eval", str(run_copy)], "damaged or incomplete")

    (model / "tokenizer.json").write_text("this is not json")
    with pytest.raises(ValueError, match="not a valid tokenizer.json"):
        minigate.data.load_tokenizer(model / "tokenizer.json")
    bad_tok = ["--tokenizer", str(model / "tokenizer.json")]
    _one_line_error(capsys, ["train", *ci_args, "--out", str(tmp_path / "t"), *bad_tok], "not a valid tokenizer.json")

    cfg = json.loads((model / "config.json").read_text())
    cfg["minigate"]["gate_colour"] = "blue"
    (model / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['gate_colour'\]"):
        minigate.from_pretrained(model)


def test_tokenizer_without_bos_is_refused_unless_bos_id_is_given(tmp_path, capsys, ci_args):
    tok = json.loads(minigate.data.DEFAULT_TOKENIZER.read_text())
    tok["added_tokens"] = [t for t in tok["added_tokens"] if t["content"] != "<bos>"]
    tok["model"]["vocab"] = {k: v for k, v in tok["model"]["vocab"].items() if k != "<bos>"}
    path = tmp_path / "nobos.json"
    path.write_text(json.dumps(tok))
    _one_line_error(capsys, ["train", *ci_args, "--out", str(tmp_path / "r"), "--tokenizer", str(path)],
                    "has no <bos> token", "--set bos_id")
    assert not (tmp_path / "r").exists()


def test_eval_beyond_max_seq_len_needs_the_flag(run_dir, capsys):
    _one_line_error(capsys, ["eval", str(run_dir), "--seq-len", "256"], "max_seq_len=128", "--beyond-max-seq-len")


def test_from_pretrained_of_a_missing_relative_path_does_not_go_to_the_hub(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    for path in ("runs/nope", "runs/a/b", Path("x/y")):
        with pytest.raises(FileNotFoundError, match="no folder") as e:
            minigate.from_pretrained(path)
        assert "Hub" not in str(e.value)
    monkeypatch.chdir(tmp_path / "runs")  # from the wrong folder "runs/nope" could be a Hub id: say both
    with pytest.raises(FileNotFoundError, match="is neither a local folder .* nor a Hugging Face Hub repo"):
        minigate.from_pretrained("runs/nope")


# -- concurrency, signals, stale state --------------------------------------------------------------------
def _start(out: Path, steps: int, ci_args) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "minigate.cli", "train", *ci_args, "--out", str(out), "--steps", str(steps)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stdout:  # training has started once the summary line is out
        if "->" in line:
            break
    return proc


@pytest.mark.slow
def test_second_run_into_a_busy_folder_is_refused_and_sigterm_resumes_bitwise(tmp_path, capsys, ci_args):
    out, steps = tmp_path / "run", 40
    proc = _start(out, steps, ci_args)
    try:
        time.sleep(0.5)
        err = _one_line_error(capsys, ["train", "--preset", "ci", "--variant", "none", "--quiet", "--out", str(out)],
                              "is in use by another run", f"process {proc.pid}")
        assert "Ctrl-C" in err
        time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr
    assert "SIGTERM" in stdout and "--resume" in stdout and "Traceback" not in stderr
    stopped_at = ckpt_step(out / "checkpoint.pt")
    assert 1 <= stopped_at < steps and not (out / ".lock").exists()
    assert json.loads((out / "run.json").read_text())["variant"] == "headwise"  # the refused run wrote nothing

    assert main(["train", *ci_args, "--out", str(out), "--steps", str(steps), "--resume"]) == 0
    straight = tmp_path / "straight"
    assert main(["train", *ci_args, "--out", str(straight), "--steps", str(steps)]) == 0
    a, b = minigate.from_pretrained(out / "model"), minigate.from_pretrained(straight / "model")
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


@pytest.mark.slow
def test_lock_is_reentrant_in_process_and_refuses_another_process(tmp_path):
    with RunLock(tmp_path), RunLock(tmp_path):
        code = ("import sys; from minigate.runfolder import RunLock, RunFolderInUse\n"
                f"try:\n    RunLock({str(tmp_path)!r}).__enter__()\nexcept RunFolderInUse as e:\n"
                "    print(e); sys.exit(3)")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert r.returncode == 3 and f"process {os.getpid()}" in r.stdout
    assert not (tmp_path / ".lock").exists()
    with RunLock(tmp_path):  # free again
        pass
    assert issubclass(RunFolderInUse, RuntimeError)


def test_stale_lock_and_orphan_temp_files_are_reported_and_cleaned(run_copy, capsys, ci_args):
    (run_copy / ".lock").write_text("pid=999999\nhost=elsewhere\nstarted=yesterday\n")
    orphans = [run_copy / ".checkpoint.pt.4242.tmp", run_copy / "model" / ".model.safetensors.4242.tmp"]
    for p in orphans:
        p.write_bytes(b"half a file")
    capsys.readouterr()
    with pytest.warns(UserWarning, match="steps"):
        assert main(["train", *ci_args, "--out", str(run_copy), "--resume", "--steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "process 999999 on elsewhere" in out and "no longer running" in out
    assert "removed 2 temp file(s)" in out
    assert not any(p.exists() for p in orphans) and not (run_copy / ".lock").exists()


def test_time_based_checkpoints(tmp_path, monkeypatch, tiny):
    g = torch.Generator().manual_seed(0)
    tr, va = torch.randint(1, 64, (3000,), generator=g), torch.randint(1, 64, (500,), generator=g)
    clock = {"t": 0.0}
    monkeypatch.setattr(T.time, "monotonic", lambda: clock["t"])
    steps_saved = []

    def tick(step, model, history):  # one minute per step
        clock["t"] += 60
        if (tmp_path / "checkpoint.pt").exists():
            steps_saved.append(ckpt_step(tmp_path / "checkpoint.pt"))

    torch.manual_seed(0)
    cfg = TrainConfig(steps=6, batch_size=4, seq_len=16, warmup_steps=1, eval_every=3, eval_batches=1,
                        callback_every=1, ckpt_every=0, ckpt_minutes=2, device="cpu")
    T.train(Transformer(ModelConfig(**tiny)), tr, va, cfg, out_dir=tmp_path, callback=tick, progress=False)
    assert steps_saved[:4] == [2, 2, 4, 4]  # every 2 minutes, with no step-based checkpoints


# -- the Python API: configs, model inputs, hooks, gate overrides --------------------------------------------
@pytest.mark.parametrize("field,value", [("n_layers", True), ("d_model", 0), ("norm_eps", -1.0),
                                         ("norm_eps", float("nan")), ("rope_theta", 0.0), ("qk_norm", "yes"),
                                         ("gate_bias", float("inf")), ("max_seq_len", 1.5)])
def test_model_config_rejects(field, value):
    with pytest.raises(ValueError, match=f"ModelConfig.{field}="):
        ModelConfig(**{field: value})


@pytest.mark.parametrize("field,value", [("grad_clip", -1.0), ("lr", 0.0), ("betas", (0.9,)), ("betas", (0.9, 1.5)),
                                         ("steps", True), ("seed", -1), ("compile", "yes"), ("bos_id", -1)])
def test_train_config_rejects(field, value):
    with pytest.raises(ValueError, match=f"TrainConfig.{field}="):
        TrainConfig(**{field: value})


def test_token_ids_are_checked_where_they_enter_the_model(tiny):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**tiny))
    for bad in (64, -1):
        with pytest.raises(ValueError, match=f"token id {bad}.*vocab_size is 64"):
            model(torch.tensor([[1, bad, 2]]))
    g = torch.Generator().manual_seed(0)
    tr, va = torch.randint(1, 64, (3000,), generator=g), torch.randint(1, 64, (500,), generator=g)
    cfg = TrainConfig(steps=2, batch_size=2, seq_len=16, warmup_steps=0, device="cpu")
    with pytest.raises(ValueError, match="training data hold token id -3"):
        T.train(model, torch.cat([tr, torch.tensor([-3])]), va, cfg, progress=False)
    with pytest.raises(ValueError, match="seq_len=16 is longer than the model's max_seq_len=8"):
        T.train(Transformer(ModelConfig(**tiny, max_seq_len=8)), tr, va, cfg, progress=False)


def test_hooks_refuse_empty_filters_and_wrong_shapes(tiny):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**tiny, gate="G1", gate_granularity="headwise"))
    tokens = torch.randint(0, 64, (2, 8))
    with pytest.raises(ValueError, match="matches no hook point"):
        model.run_with_hooks(tokens, fwd_hooks=[(lambda n: n.endswith("hook_gates"), lambda x, hook: x * 0)])
    with pytest.raises(ValueError, match="matches no hook point"):
        model.run_with_cache(tokens, names_filter=[])
    with pytest.raises(ValueError, match=r"blocks.0.attn.hook_gate returned \(1, 1, 4\).*shape \(2, 8, 4\)"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_gate", lambda x, hook: x[:1, :1] * 0)])
    with pytest.raises(ValueError, match="returned float"):
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_gate", lambda x, hook: 0.5)])
    assert not any(hp.active for hp in model.hook_dict.values())  # nothing left attached


def test_gate_overrides_are_checked_against_the_activation(tiny):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**tiny, gate="G1", gate_granularity="headwise"))
    for value in (5.0, -1, float("nan")):
        with pytest.raises(ValueError, match="gate value"):
            ablation.set_gates(model, value)
    with pytest.raises(ValueError, match=r"sigmoid gate lives in \[0, 1\]"):
        ablation.close_head(model, 0, 1, value=2)
    assert len(ablation.set_gates(model, 1.0)) == 2 and len(ablation.close_head(model, 0, 1)) == 1
    silu = Transformer(ModelConfig(**tiny, gate="G1", gate_activation="silu"))
    assert ablation.set_gates(silu, 3.0)  # a SiLU gate can exceed 1
    with pytest.raises(ValueError, match="SiLU"):
        ablation.set_gates(silu, -1.0)


def test_a_disk_that_fills_up_mid_run_keeps_the_last_checkpoint(tmp_path, capsys, monkeypatch, ci_args):
    real_save, calls = torch.save, {"n": 0}

    def full_disk_on_second_save(obj, f):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        return real_save(obj, f)

    monkeypatch.setattr(torch, "save", full_disk_on_second_save)
    out = tmp_path / "run"
    capsys.readouterr()
    assert main(["train", *ci_args, "--out", str(out), "--steps", "6", "--set", "ckpt_every=2"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "No space left on device" in err and "intact" in err and "--resume" in err
    assert ckpt_step(out / "checkpoint.pt") == 2 and not list(out.glob(".*.tmp"))
