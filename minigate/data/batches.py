"""Batches that always start with <bos>.

A training example is `bos` followed by a random window of the token stream, the target is the same
window shifted by one: x = [bos, t1 .. t_{L-1}], y = [t1 .. t_L] for seq_len L. So every sequence starts
with <bos> (where the paper's attention sinks sit) and every position has a target. Evaluation uses
fixed, non-overlapping windows instead, so every validation token is scored once. A synthetic task
(tasks.py) comes as ready-made rows (2-d): x = row[:-1], y = row[1:].
"""

from __future__ import annotations

import torch


def with_bos(windows: torch.Tensor, bos_id: int) -> torch.Tensor:
    """(n, L) token windows -> (n, L + 1): bos_id, then the window. sample_batch, eval_batches and
    ablation.chunks build their rows with it."""
    return torch.cat([torch.full((windows.shape[0], 1), bos_id, dtype=windows.dtype), windows], dim=1)


def check_length(tokens: torch.Tensor, seq_len: int, what: str):
    if seq_len < 2:
        raise ValueError(f"seq_len={seq_len}: a sequence needs <bos> and at least one text token")
    if tokens.numel() == 0:
        raise ValueError(f"the {what} corpus is empty (0 tokens); check the corpus name and its source")
    if tokens.dim() == 2:  # a task's ready-made rows (see copy_task)
        if tokens.shape[1] != seq_len + 1:
            raise ValueError(f"the {what} rows have {tokens.shape[1]} tokens, but seq_len={seq_len} needs "
                             f"rows of seq_len + 1 = {seq_len + 1} (input and shifted target)")
        return
    if tokens.dim() != 1:
        raise ValueError(f"{what} tokens must be one 1-d tensor of ids (a token stream) or a 2-d tensor of "
                         f"rows (batch, seq_len + 1), got shape {tuple(tokens.shape)}")
    if tokens.numel() < seq_len:
        raise ValueError(f"the {what} corpus has {tokens.numel()} tokens, but one sequence of "
                         f"seq_len={seq_len} needs {seq_len}; use a larger corpus or a smaller seq_len")


def sample_batch(tokens: torch.Tensor, batch_size: int, seq_len: int, bos_id: int,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random training windows: x = [bos, window[:-1]], y = window, both (batch, seq_len).
    The same generator state gives the same batch. Rows of a task (2-d, see copy_task): x = row[:-1],
    y = row[1:] for random rows."""
    check_length(tokens, seq_len, "training")
    if tokens.dim() == 2:
        rows = tokens[torch.randint(0, tokens.shape[0], (batch_size,), generator=generator)]
        return rows[:, :-1], rows[:, 1:]
    starts = torch.randint(0, tokens.numel() - seq_len + 1, (batch_size,), generator=generator)
    y = torch.stack([tokens[s: s + seq_len] for s in starts.tolist()]).long()
    return with_bos(y[:, :-1], bos_id), y


def eval_batches(tokens: torch.Tensor, batch_size: int, seq_len: int, bos_id: int,
                 max_batches: int | None = None):
    """Fixed evaluation batches: the corpus cut into non-overlapping windows of seq_len tokens (the
    tail that does not fill a window is dropped), each as x = [bos, window[:-1]], y = window."""
    check_length(tokens, seq_len, "validation")
    if tokens.dim() == 2:  # a task's rows, in order
        for b, i in enumerate(range(0, tokens.shape[0], batch_size)):
            if max_batches is not None and b >= max_batches:
                break
            yield tokens[i: i + batch_size, :-1], tokens[i: i + batch_size, 1:]
        return
    n = tokens.numel() // seq_len
    windows = tokens[: n * seq_len].view(n, seq_len)
    for b, i in enumerate(range(0, n, batch_size)):
        if max_batches is not None and b >= max_batches:
            break
        y = windows[i: i + batch_size].long()
        yield with_bos(y[:, :-1], bos_id), y
