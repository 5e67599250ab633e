"""Training throughput (tokens/s): first what precision="auto" chooses on this machine and how much of the machine's
best matmul rate in that precision train() reaches on the natural-data recipe (--preset, default `code`; `code-gpu`
on CUDA): its model FLOP/s (6 x parameters + causal attention, per token) over the best square matmul's FLOP/s in
that precision, both measured in the same run.

Then, on CPU, the settings that could speed up the recipe, each contender in a fresh process of its own (the
allocator setting is process-wide and lasting), in interleaved rounds:

    fp32, glibc's default allocator     what train() gets where it cannot tune the allocator (not glibc)
    fp32, tuned allocator               train()'s CPU default where the CPU has no native bf16
    bf16 autocast                       pays only on CPUs with native bf16 matrix units (AMX, AVX512-BF16)
    fp32 + torch.compile                its one-off compile time printed apart, and its end-to-end ratio
    bf16 + torch.compile                the same against bf16 eager (what a CPU with AMX or AVX512-BF16 trains in)

Then train() against a bare loop, on CPU (`ci` sizes) or CUDA (`code-gpu` sizes):

    minigate train() baseline / G1 headwise / G1 elementwise   the real loop (AdamW, schedule, clipping,
                                                                 history, progress bookkeeping)
    minigate baseline, plain loop                               the same model in a bare PyTorch loop
    transformers Qwen3ForCausalLM, plain loop                   Qwen3Config with the same sizes
    minigate train() baseline, compile=True                     CUDA only: torch.compile (steady state;
                                                                 its one-off compile time is printed apart)

Contenders take turns (rounds of --steps steps each, round-robin) so they share the machine's
noise; each step's time runs from sampling the batch to the end of the optimizer step, as in
train()'s own tokens/s. The first step of every round is dropped. Reports medians and ratios.

    python -m minigate.bench train [--device auto] [--threads 2] [--rounds 5] [--steps 10] [--preset code]
                                   [--settings-rounds 3] [--skip-settings] [--auto-rounds 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time

import torch

from minigate import Transformer
from minigate.ablation import forward_flops
from minigate.bench.common import best_matmul_rate, qwen3_twin
from minigate.data import sample_batch
from minigate.evaluation import token_cross_entropy
from minigate.hardware import cpu_has_native_bf16, pick_device, pick_precision, precision_name, tune_cpu_allocator
from minigate.presets import PRESETS, model_config
from minigate.train import lr_at, make_optimizer, train

# CPU contenders of the settings comparison: name -> (tune the allocator, precision, torch.compile)
SETTINGS = {
    "fp32, glibc's default allocator": (False, "fp32", False),
    "fp32, tuned allocator (default)": (True, "fp32", False),
    "bf16 autocast, tuned allocator": (True, "bf16", False),
    "fp32 + torch.compile, tuned": (True, "fp32", True),
    "bf16 + torch.compile, tuned": (True, "bf16", True),
}
# each compiled contender against its eager twin: end to end over the preset's steps, compile time included
COMPILED = {"fp32 + torch.compile, tuned": "fp32, tuned allocator (default)",
            "bf16 + torch.compile, tuned": "bf16 autocast, tuned allocator"}


def plain_loop(model, logits_of, tokens, train_cfg, gen) -> list[float]:
    """A bare loop doing the same work per step as train(): AdamW with the schedule, clipping, autocast."""
    device = pick_device(train_cfg.device)
    amp_dtype, use_scaler = pick_precision(train_cfg.precision, device)
    model.to(device).train()
    opt = make_optimizer(model, train_cfg, device)
    scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)
    rates = []
    for step in range(1, train_cfg.steps + 1):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, train_cfg)
        t0 = time.perf_counter()
        x, y = sample_batch(tokens, train_cfg.batch_size, train_cfg.seq_len, train_cfg.bos_id, gen)
        with torch.autocast(device.type, amp_dtype, enabled=amp_dtype is not None):
            loss = token_cross_entropy(logits_of(model, x.to(device)), y.to(device))
        scaler.scale(loss).backward()
        loss.item()  # train() reads the loss every step too (and so waits for the GPU)
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), train_cfg.grad_clip)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        rates.append(train_cfg.batch_size * train_cfg.seq_len / (time.perf_counter() - t0))
    return rates


def settings_worker(name: str, preset_name: str, steps: int) -> dict:
    """One contender of the CPU settings comparison, in its own process: the preset's baseline model and
    batch, `steps` steps of plain_loop; the first step's seconds (compiling, if any) and the other steps' rates."""
    tune, precision, compile_ = SETTINGS[name]
    if tune:
        tune_cpu_allocator()
    preset = PRESETS[preset_name]
    train_cfg = dataclasses.replace(preset.train, steps=steps, warmup_steps=1, device="cpu", precision=precision)
    torch.manual_seed(0)
    model = Transformer(model_config(preset_name, "none"))
    fwd = torch.compile(model) if compile_ else model
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, model.cfg.vocab_size, (2_000_000,), generator=gen)
    rates = plain_loop(model, lambda m, x: fwd(x), tokens, train_cfg, gen)
    return {"first_s": train_cfg.batch_size * train_cfg.seq_len / rates[0], "rates": rates[1:]}


def cpu_settings(preset_name: str, threads: int, rounds: int, steps: int) -> dict[str, float]:
    """Median tokens/s of each SETTINGS contender, fresh processes taking turns; prints the ratios."""
    rates, first = {n: [] for n in SETTINGS}, {n: [] for n in SETTINGS}
    for _ in range(rounds):
        for name in SETTINGS:
            out = subprocess.run([sys.executable, "-m", "minigate.bench", "train", "--worker", name, "--preset",
                                  preset_name, "--steps", str(steps), "--threads", str(threads)],
                                 capture_output=True, text=True, check=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            rates[name] += got["rates"]
            first[name].append(got["first_s"])
    med = {n: statistics.median(r) for n, r in rates.items()}
    m, train_cfg = model_config(preset_name), PRESETS[preset_name].train
    step_tokens = train_cfg.batch_size * train_cfg.seq_len
    print(f"CPU settings, {preset_name} preset ({m.d_model} wide, {m.n_layers} layers, {m.n_heads} x {m.head_dim} "
          f"heads, batch {train_cfg.batch_size} x {train_cfg.seq_len}), {threads} threads, fresh process per turn; "
          f"median of {len(rates[next(iter(SETTINGS))])} steps each ({rounds} interleaved rounds of {steps - 1}); "
          f"native bf16: {cpu_has_native_bf16()}")
    base = med["fp32, glibc's default allocator"]
    for name, r in med.items():
        print(f"  {name:34s} {r:9,.0f} tok/s  {r / base:5.2f}x fp32 with glibc's defaults")
    run_tokens = train_cfg.steps * step_tokens * train_cfg.grad_accum
    for name, eager in COMPILED.items():
        compile_s = statistics.median(first[name]) - step_tokens / med[name]
        eager_s, compiled_s = run_tokens / med[eager], compile_s + run_tokens / med[name]
        print(f"{name}: {compile_s:.0f} s to compile (median over rounds; the first ever compile is slower); "
              f"{med[name] / med[eager]:.2f}x {eager!r} per step, end to end over the preset's {train_cfg.steps} "
              f"steps {eager_s / compiled_s:.2f}x")
    return med


def train_flops_per_token(model_cfg, seq_len: int) -> float:
    """Training FLOPs per token: three times the forward's (the backward is two forwards), 2 per parameter plus causal
    attention (ablation.forward_flops)."""
    params = Transformer(model_cfg).num_params()
    return 3 * forward_flops(params, model_cfg.n_layers, model_cfg.n_heads, model_cfg.head_dim, 1, seq_len) / seq_len


def auto_precision(preset_name: str, device: torch.device, steps: int, rounds: int) -> dict:
    """What precision="auto" chooses here, and the share of the machine's best matmul rate in that precision that
    train() reaches on the preset's baseline (median tokens/s of `rounds` runs of `steps` steps, the first step of
    each dropped); prints one report and returns its numbers."""
    amp_dtype, _ = pick_precision("auto", device)
    chosen = precision_name(amp_dtype)
    best, n = best_matmul_rate(amp_dtype or torch.float32, device)
    train_cfg = dataclasses.replace(PRESETS[preset_name].train, steps=steps, warmup_steps=1, eval_every=10**9,
                                    eval_batches=1, ckpt_every=0, ckpt_minutes=0, device=str(device),
                                    precision="auto", compile=False)
    model_cfg = model_config(preset_name, "none")
    tokens = torch.randint(1, model_cfg.vocab_size, (500_000,), generator=torch.Generator().manual_seed(0))
    val = tokens[: train_cfg.seq_len * train_cfg.batch_size]
    rates = []
    for _ in range(rounds):
        torch.manual_seed(0)
        history = train(Transformer(model_cfg), tokens, val, train_cfg, progress=False)
        assert history.info["precision_used"] == chosen
        rates += history.tokens_per_s[1:]
    tok_s = statistics.median(rates)
    achieved = tok_s * train_flops_per_token(model_cfg, train_cfg.seq_len)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else (
        f"CPU, {torch.get_num_threads()} threads, native bf16: {cpu_has_native_bf16()}")
    print(f"precision='auto' on {where}: {chosen}. train() on the {preset_name} baseline (batch {train_cfg.batch_size} "
          f"x {train_cfg.seq_len}): {tok_s:,.0f} tokens/s = {achieved / 1e9:.1f} GFLOP/s of model FLOPs, "
          f"{achieved / best:.1%} of this machine's best {chosen} matmul rate ({best / 1e9:.1f} GFLOP/s, "
          f"{n} x {n}; median of {len(rates)} steps)")
    return {"precision": chosen, "tokens_per_s": tok_s, "model_flops": achieved, "best_matmul_flops": best,
            "fraction": achieved / best}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m minigate.bench train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="auto (cuda if there is one), cpu or cuda")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="turns per contender")
    ap.add_argument("--steps", type=int, default=10, help="training steps per turn")
    ap.add_argument("--preset", default="code", help="the recipe whose sizes the CPU settings comparison uses")
    ap.add_argument("--settings-rounds", type=int, default=3, help="turns per CPU settings contender")
    ap.add_argument("--skip-settings", action="store_true", help="no CPU settings comparison")
    ap.add_argument("--auto-rounds", type=int, default=2, help="runs of --steps steps for the precision report")
    ap.add_argument("--worker", choices=SETTINGS, help=argparse.SUPPRESS)  # one settings contender (internal)
    args = ap.parse_args(argv)
    if args.preset not in PRESETS:
        ap.error(f"unknown --preset {args.preset!r}; choose from {sorted(PRESETS)}")
    torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(settings_worker(args.worker, args.preset, args.steps)))
        return None
    device = pick_device(args.device)
    auto_precision("code-gpu" if device.type == "cuda" else args.preset, device, args.steps, args.auto_rounds)
    if device.type == "cpu" and not args.skip_settings:
        cpu_settings(args.preset, args.threads, args.settings_rounds, args.steps)
    preset_name = "code-gpu" if device.type == "cuda" else "ci"
    preset = PRESETS[preset_name]
    train_cfg = dataclasses.replace(preset.train, steps=args.steps, warmup_steps=1, eval_every=10**9, eval_batches=1,
                              ckpt_every=0, ckpt_minutes=0, device=str(device), compile=False,
                              precision="auto" if device.type == "cuda" else "fp32")
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 4096, (200_000,), generator=gen)
    val = tokens[: train_cfg.seq_len * train_cfg.batch_size]

    def minigate_train(model, **kw):
        return lambda: train(model, tokens, val, dataclasses.replace(train_cfg, **kw), progress=False).tokens_per_s

    def plain(model, logits_of):
        return lambda: plain_loop(model, logits_of, tokens, train_cfg, gen)

    torch.manual_seed(0)
    models = {gate: Transformer(model_config(preset_name, gate)) for gate in ("none", "headwise", "elementwise")}
    contenders = {
        "minigate train() baseline": minigate_train(models["none"]),
        "minigate train() G1 headwise": minigate_train(models["headwise"]),
        "minigate train() G1 elementwise": minigate_train(models["elementwise"]),
        # the very same model object as train() baseline, so only the loop differs
        "minigate baseline, plain loop": plain(models["none"], lambda m, x: m(x)),
        "transformers Qwen3, plain loop": plain(qwen3_twin(model_config(preset_name, "none")),
                                                lambda m, x: m(input_ids=x).logits),
    }
    compile_s = None
    if device.type == "cuda":  # its own model: compiling must not change what the others run
        compiled = Transformer(model_config(preset_name, "none"))
        contenders["minigate train() baseline, compile=True"] = minigate_train(compiled, compile=True)
        t0 = time.perf_counter()
        contenders["minigate train() baseline, compile=True"]()
        compile_s = time.perf_counter() - t0
    for contender in contenders.values():  # warm-up turn: first-call costs (imports, allocator) out of the way
        contender()
    rates = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, contender in contenders.items():
            rates[name] += contender()[1:]
    med = {name: statistics.median(r) for name, r in rates.items()}

    m = model_config(preset_name)
    n = len(rates["minigate train() baseline"])
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {args.threads} threads"
    print(f"training tokens/s on {where}, {preset_name} preset ({train_cfg.precision}): batch {train_cfg.batch_size} x "
          f"{train_cfg.seq_len}, d_model {m.d_model}, {m.n_layers} layers, vocab {m.vocab_size}; median of {n} "
          f"steps per contender ({args.rounds} interleaved rounds of {args.steps})")
    base = med["minigate train() baseline"]
    for name, r in med.items():
        print(f"  {name:34s} {r:9,.0f} tok/s  {1000 * train_cfg.batch_size * train_cfg.seq_len / r:7.1f} ms/step  "
              f"{r / base:5.3f}x minigate baseline")
    print(f"minigate train() / transformers plain loop: {base / med['transformers Qwen3, plain loop']:.3f}x "
          "(>1: minigate's loop is faster)")
    print("train() loop overhead vs a plain loop, same model: "
          f"{med['minigate baseline, plain loop'] / base:.3f}x")
    for g in ("headwise", "elementwise"):
        print(f"gated / baseline, G1 {g}: {med[f'minigate train() G1 {g}'] / base:.3f}x tokens/s")
    if compile_s is not None:
        fast = med["minigate train() baseline, compile=True"]
        tokens_run = preset.train.steps * train_cfg.batch_size * train_cfg.seq_len  # the whole preset run
        print(f"compile=True / eager: {fast / base:.3f}x tokens/s after {compile_s:.0f} s of compiling (first "
              f"turn); end to end over the preset's {preset.train.steps} steps: "
              f"{(tokens_run / base) / (compile_s + tokens_run / fast):.2f}x")
    return med


if __name__ == "__main__":
    main()
