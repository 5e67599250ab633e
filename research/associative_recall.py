"""Associative recall with marked queries: pair tokens (k, v) define bindings; a query token q_k is followed by
v; the rest is random filler. The query token itself says whether the retrieval head has work to do.
docs/experiments.md section 2 logs what it shows.

    python -m research.associative_recall --variant headwise --steps 1500 --lr 1e-2 --wd 0.5 --threads 2
"""

import random

import torch

from research.common import build_model, fit, gate_means, parser, sink_line

NK, NV, NF = 16, 16, 32  # keys, values, filler tokens
BOS, PAIR0 = 0, 1  # <bos>; pair token k * NV + v
Q0 = PAIR0 + NK * NV  # query tokens
VAL0 = Q0 + NK  # value tokens
F0 = VAL0 + NV  # filler tokens
VOCAB = F0 + NF


def sequence(rng: random.Random, T: int) -> list[int]:
    s, defined, keys = [BOS], {}, list(range(NK))
    rng.shuffle(keys)
    while len(s) < T:
        r = rng.random()
        if r < 0.25 and keys:
            k = keys.pop()
            defined[k] = rng.randrange(NV)
            s.append(PAIR0 + k * NV + defined[k])
        elif r < 0.45 and defined and len(s) < T - 1:
            k = rng.choice(list(defined))
            s += [Q0 + k, VAL0 + defined[k]]
        else:
            s.append(F0 + rng.randrange(NF))
    return s[:T]


def main():
    ap = parser(__doc__.split("\n")[0], layers=1, steps=1000, batch=64)
    ap.add_argument("--share", action="store_true", help="print every head's first-token share at the end")
    args = ap.parse_args()
    rng = random.Random(5)
    rows = torch.tensor([sequence(rng, args.T) for _ in range(30000)])
    probe = torch.tensor([sequence(random.Random(99 + i), args.T) for i in range(64)])
    is_query = (probe >= Q0) & (probe < VAL0)
    model = build_model(args, VOCAB)

    def report(step, model, loss, seconds):
        with torch.no_grad():
            hit = model(probe)[:, :-1].argmax(-1) == probe[:, 1:]
        acc = hit[is_query[:, :-1]].float().mean().item()
        print(f"{args.variant} step {step} loss {loss:.3f} recall-acc {acc:.2f} {sink_line(model, probe)}"
              f"{gate_means(model, probe, [is_query, ~is_query])} t={seconds:.0f}s", flush=True)

    fit(model, rows, probe, args, report)
    if args.share:
        from minigate.analysis import attention_sink

        print((attention_sink(model, probe).share * 100).round().int())


if __name__ == "__main__":
    main()
