"""Marked induction copy: <bos>, then random tokens from A = 1..N, then the same tokens shifted into
B = N+1..2N (a fixed-offset copy). The query token's own range says whether there is anything to retrieve.
docs/experiments.md section 3 logs what it shows.

    python -m research.marked_copy --variant headwise --layers 2 --steps 2000 --batch 32 --threads 2 [--gbias -2]

Unlike data.copy_task: no separator unless --sep, the copy starts after (T - 1) * --frac random symbols, and
--random-first puts a random A token at position 0 instead of <bos>.
"""

import torch

from research.common import build_model, fit, gate_means, parser, sink_line


def rows(n: int, args, g: torch.Generator) -> torch.Tensor:
    N, T, H = args.N, args.T, int((args.T - 1) * args.frac)
    a = torch.randint(1, N + 1, (n, H), generator=g)
    first = torch.randint(1, N + 1, (n, 1), generator=g) if args.random_first else torch.zeros(n, 1, dtype=torch.long)
    if args.sep:  # a separator token marks where the copy starts: no position counting needed
        return torch.cat([first, a, torch.full((n, 1), 2 * N + 1), a[:, : T - 2 - H] + N], 1)[:, :T]
    return torch.cat([first, a, a[:, : T - 1 - H] + N], 1)[:, :T]


def main():
    ap = parser(__doc__.split("\n")[0], layers=2, steps=1000, batch=32)
    ap.add_argument("--N", type=int, default=64, help="symbols in A (and B)")
    ap.add_argument("--frac", type=float, default=0.5, help="share of the row that is random")
    ap.add_argument("--sep", action="store_true", help="a separator before the copy")
    ap.add_argument("--random-first", action="store_true", help="a random A token at position 0, no <bos>")
    ap.add_argument("--gbias", type=float, default=0.0, help="a fixed offset on the gate logits")
    args = ap.parse_args()
    H = int((args.T - 1) * args.frac)
    train_rows = rows(40_000, args, torch.Generator().manual_seed(1))
    probe = rows(64, args, torch.Generator().manual_seed(99))
    model = build_model(args, 2 * args.N + 2)
    a_part, b_part = torch.zeros_like(probe, dtype=torch.bool), torch.zeros_like(probe, dtype=torch.bool)
    a_part[:, 1: H + 1], b_part[:, H + 1:] = True, True

    def report(step, model, loss, seconds):
        with torch.no_grad():
            acc = (model(probe)[:, :-1].argmax(-1) == probe[:, 1:])[:, H + 1:].float().mean().item()
        print(f"{args.variant} step {step} loss {loss:.3f} copy-acc {acc:.2f} {sink_line(model, probe)}"
              f"{gate_means(model, probe, [a_part, b_part])} t={seconds:.0f}s", flush=True)

    offset = [(lambda n: n.endswith("hook_gate_logits"), lambda x, hook: x + args.gbias)]
    with model.hooks(offset if args.gbias and args.variant != "none" else []):  # on for training and measuring
        fit(model, train_rows, probe, args, report)
        if args.variant != "none":
            _, cache = model.run_with_cache(probe, names_filter=lambda n: n.endswith(("hook_gate", "hook_pattern")))
            for L in range(args.layers):
                gate = cache["gate", L]  # (batch, pos, head[, d_head])
                gate = gate.mean(-1) if gate.dim() == 4 else gate
                print(f"L{L} gate on A per head", [round(v, 2) for v in gate[:, 1: H + 1].mean((0, 1)).tolist()],
                      "on B", [round(v, 2) for v in gate[:, H + 1:].mean((0, 1)).tolist()],
                      "bos-attn from A",
                      [round(v, 2) for v in cache["pattern", L][:, :, 1: H + 1, 0].mean((0, 2)).tolist()])


if __name__ == "__main__":
    main()
