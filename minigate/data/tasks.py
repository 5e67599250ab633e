"""Synthetic tasks: ready-made rows (n, seq_len + 1) instead of a token stream, and no tokenizer.

    copy       copy_task: the marked copy, where a baseline grows an attention sink on <bos>
    induction  induction_task: the variable-length induction copy, with no <bos>

`task_rows(task, n, seq_len, vocab_size, seed)` makes either for a model's vocabulary; `CopyTokenizer`
gives their ids a text face.
"""

from __future__ import annotations

import math

import torch

from .tokenizer import BOS


def copy_task(n: int, seq_len: int = 64, n_symbols: int = 64, seed: int = 0) -> torch.Tensor:
    """`n` rows of the marked copy task, (n, seq_len + 1): x = row[:-1], y = row[1:] (see sample_batch).

    A row is  <bos>, a_1 .. a_H, <sep>, a_1 + N, a_2 + N, ...  with H = seq_len // 2 random symbols
    a_i from 1..N (N = n_symbols), a separator 2N + 1, then the random part again, shifted into N+1..2N
    (cut to the row length).
    So the vocabulary has 2N + 2 ids (<bos> = 0). The first half is unpredictable; the second half is a
    pure copy, found by a head that looks back H + 1 positions. A token's own range tells a head whether
    there is anything to copy, so a head can learn to be *off* on the random part: there, an ungated
    model parks its attention on <bos> (an attention sink), and a gated one can close the gate instead.
    docs/experiments.md logs what it shows at 2 layers."""
    if n < 1 or seq_len < 4 or n_symbols < 1:
        raise ValueError(f"copy_task(n={n}, seq_len={seq_len}, n_symbols={n_symbols}): need n >= 1, "
                         "seq_len >= 4 and n_symbols >= 1")
    g = torch.Generator().manual_seed(seed)
    h = seq_len // 2
    a = torch.randint(1, n_symbols + 1, (n, h), generator=g)
    bos, sep = torch.zeros(n, 1, dtype=torch.long), torch.full((n, 1), 2 * n_symbols + 1)
    return torch.cat([bos, a, sep, a + n_symbols], dim=1)[:, : seq_len + 1]


INDUCTION_FIRST = 16  # induction_task's first-token ids, after the copy task's 2N + 2


def induction_task(n: int, seq_len: int = 64, n_symbols: int = 64, n_first: int = INDUCTION_FIRST, p: float = 0.05,
                   seed: int = 0) -> torch.Tensor:
    """`n` rows of the variable-length induction copy, (n, seq_len + 1): x = row[:-1], y = row[1:].

    A row is  f, a_1 .. a_L, <sep>, a_1 + N .. a_L + N, <sep>, a_1 + N, ...  (repeated to the row's end):
    f is one of `n_first` first-token ids 2N + 2 .. 2N + 1 + n_first (never copied, never predictable;
    n_first=0 puts <bos> = 0 there instead), L = 4 + a geometric number of symbols (success probability
    p, mean 4 + (1 - p) / p; at most seq_len - 8), the separator is 2N + 1. Vocabulary 2N + 2 + n_first.
    Unlike copy_task, the copy offset L + 1 changes from row to row, so it must be found by content (an
    induction head), not by a fixed relative position; and with no <bos>, position 0 carries no special
    token: a sink there must be found from position alone, as in the paper's packed pretraining data.
    A token's own range (a or b) still tells a head whether there is anything to copy."""
    if n < 1 or seq_len < 12 or n_symbols < 1 or n_first < 0 or not 0 < p <= 1:
        raise ValueError(f"induction_task(n={n}, seq_len={seq_len}, n_symbols={n_symbols}, n_first={n_first}, "
                         f"p={p}): need n >= 1, seq_len >= 12, n_symbols >= 1, n_first >= 0 and 0 < p <= 1")
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g).clamp_min(1e-12)
    geometric = (u.log() / math.log1p(-p)).floor().long() if p < 1 else torch.zeros(n, dtype=torch.long)
    L = (4 + geometric).clamp(max=seq_len - 8)  # (n,) random-part lengths
    a = torch.randint(1, n_symbols + 1, (n, seq_len), generator=g)  # (n, seq_len); a row uses its first L
    j = torch.arange(1, seq_len + 1)  # (seq_len,) positions after the first token
    k = (j - L[:, None] - 1) % (L[:, None] + 1)  # (n, seq_len) place in the repeated [sep, copy] cycle
    copied = a.gather(1, (k - 1).clamp(min=0)) + n_symbols  # (n, seq_len) b_k, used where k >= 1
    body = torch.where(k == 0, 2 * n_symbols + 1, copied)  # the copy part: sep, b_1..b_L, sep, ...
    body = torch.where(j <= L[:, None], a, body)  # the random part a_1..a_L first
    first = (torch.randint(2 * n_symbols + 2, 2 * n_symbols + 2 + n_first, (n, 1), generator=g) if n_first
             else torch.zeros(n, 1, dtype=torch.long))
    return torch.cat([first, body], dim=1)


TASKS = ("copy", "induction")  # synthetic tasks: ready-made rows instead of a token stream, no tokenizer


def task_rows(task: str, n: int, seq_len: int, vocab_size: int, seed: int) -> torch.Tensor:
    """`n` rows of a synthetic task for a model with `vocab_size` ids (the vocabulary fixes n_symbols)."""
    if task == "copy":
        return copy_task(n, seq_len, (vocab_size - 2) // 2, seed=seed)
    if task == "induction":
        return induction_task(n, seq_len, (vocab_size - 2 - INDUCTION_FIRST) // 2, seed=seed)
    raise ValueError(f"unknown task {task!r}; the tasks are {TASKS}")


class CopyTokenizer:
    """Text face of the copy tasks' ids, so widgets and prompts work on copy models: symbol i of the random
    part is "a{i}", its copy is "b{i}", the separator "|", <bos> is id 0, and induction_task's first
    tokens are "f1".."f{n_first}". Same methods as TextTokenizer.

        tok = CopyTokenizer(); tok.encode("a3 a17 | b3") -> [3, 17, 129, 67]
        CopyTokenizer(n_first=16).encode("f2 a3 a17 | b3") -> [131, 3, 17, 129, 67]"""

    def __init__(self, n_symbols: int = 64, n_first: int = 0):
        self.n, self.bos_id, self.vocab_size = n_symbols, 0, 2 * n_symbols + 2 + n_first
        self.words = [BOS] + [f"a{i}" for i in range(1, self.n + 1)] + [f"b{i}" for i in range(1, self.n + 1)] + ["|"]
        self.words += [f"f{i}" for i in range(1, n_first + 1)]
        self.ids = {w: i for i, w in enumerate(self.words)}

    def encode(self, text: str) -> list[int]:
        unknown = [w for w in text.split() if w not in self.ids]
        if unknown:
            n_first = len(self.words) - 2 * self.n - 2
            firsts = f", first tokens f1..f{n_first}" if n_first else ""
            raise ValueError(f"the copy task has no token {unknown[0]!r}: write symbols a1..a{self.n}, their copies "
                             f"b1..b{self.n}{firsts} and the separator |, separated by spaces (e.g. 'a3 a17 | b3')")
        return [self.ids[w] for w in text.split()]

    def decode(self, ids) -> str:
        return " ".join(self.words[int(i)] for i in ids)
