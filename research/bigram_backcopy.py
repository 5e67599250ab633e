"""Bigram-Backcopy (Guo et al., 2024): trigger tokens are followed by the token before them, the rest follow a
sparse bigram chain. docs/experiments.md section 1 logs what it shows.

    python -m research.bigram_backcopy --variant none --steps 1000 --lr 3e-3 --threads 2 [--no-qk-norm]
"""

import torch

from research.common import build_model, fit, gate_means, parser, sink_line

V, NT = 64, 16  # tokens 1..V-1, <bos> = 0; the triggers are 1..NT


def bigram(seed: int = 0, k: int = 2) -> torch.Tensor:
    """(V, V) transition probabilities: each token has k random successors."""
    g = torch.Generator().manual_seed(seed)
    P = torch.zeros(V, V)
    for a in range(V):
        succ = torch.randperm(V - 1, generator=g)[:k] + 1
        P[a, succ] = torch.rand(k, generator=g) + 0.1
    return P / P.sum(1, keepdim=True)


def generate(n: int, T: int, g: torch.Generator) -> torch.Tensor:
    cdf = bigram().cumsum(1)
    cdf[:, -1] = 1.0
    x = torch.zeros(n, T, dtype=torch.long)
    x[:, 1] = torch.randint(NT + 1, V, (n,), generator=g)
    for t in range(2, T):
        prev, cur = x[:, t - 2], x[:, t - 1]
        nxt = torch.searchsorted(cdf[cur], torch.rand(n, 1, generator=g)).squeeze(1).clamp(max=V - 1)
        x[:, t] = torch.where((cur >= 1) & (cur <= NT), prev, nxt)
    return x


def main():
    args = parser(__doc__.split("\n")[0], layers=1, steps=1000, batch=64).parse_args()
    rows = generate(50000, args.T, torch.Generator().manual_seed(5))
    probe = rows[torch.randint(0, len(rows), (64,), generator=torch.Generator().manual_seed(99))]
    model = build_model(args, V)
    everywhere = torch.ones_like(probe, dtype=torch.bool)

    def report(step, model, loss, seconds):
        print(f"{args.variant} step {step} loss {loss:.3f} {sink_line(model, probe)}"
              f"{gate_means(model, probe, [everywhere])} t={seconds:.0f}s", flush=True)

    fit(model, rows, probe, args, report)
    with torch.no_grad():
        hit = model(probe)[:, :-1].argmax(-1) == probe[:, 1:]
        _, cache = model.run_with_cache(probe, names_filter="blocks.0.attn.hook_pattern")
    trig = (probe[:, :-1] >= 1) & (probe[:, :-1] <= NT)
    trig[:, 0] = False
    print("trigger acc", hit[trig].float().mean().item(), "non-trigger acc", hit[~trig].float().mean().item(),
          "trigger frac", trig.float().mean().item())
    p = cache["pattern", 0]  # (batch, head, query_pos, key_pos)
    tq = ((probe >= 1) & (probe <= NT))[:, 1:]
    idx = torch.arange(1, p.shape[-1])
    prev = p[:, :, idx, idx - 1]  # attention on the previous token
    heads = range(p.shape[1])
    print("prev-token attention at trigger queries per head", [round(prev[:, h][tq].mean().item(), 3) for h in heads])
    print("prev-token attention at non-trigger queries", [round(prev[:, h][~tq].mean().item(), 3) for h in heads])
    print("bos attention at non-trigger queries", [round(p[:, h, 1:, 0][~tq].mean().item(), 3) for h in heads])


if __name__ == "__main__":
    main()
