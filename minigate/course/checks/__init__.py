"""Graded checks with hints for the course's exercises: `my_fn = checks.<exercise>(my_fn)`.

engine.py holds check() (its docstring says what a check prints, returns and raises) and grading mode;
lessonNN.py holds lesson NN's exercises, each with its reference and its typical mistakes (the private `_name`
functions with switches, which the tests use too); grade.py scores learners' notebooks
(`python -m minigate.course grade`). Every exercise is re-exported here under its own name."""

from .engine import (GRADING_ENV, NOT_ATTEMPTED_RE, PASSED_RE, Mismatch, check, grading, not_attempted_message,
                     not_implemented_notice)
from .lesson01 import (_attention, _null_attention, attention_with_null, causal_attention,
                       reference_attention_with_null, reference_causal_attention)
from .lesson02 import (_gate_params, _split, g1_gate, gate_param_count, gated_output, reference_g1_gate,
                       reference_gate_param_count, reference_gated_output, reference_split_q_proj, split_q_proj)
from .lesson03 import _next_token_loss, _schedule, lr_schedule, next_token_loss, reference_next_token_loss
from .lesson04 import (_bos_share_by_part, _f_attn_m_act, bos_share_by_part, f_attn_m_act, reference_bos_share_by_part,
                       reference_f_attn_m_act)
from .lesson05 import (_first_rest_ratio, _read_gates, first_rest_ratio, read_gates, reference_first_rest_ratio,
                       reference_read_gates)
from .lesson06 import (_gate_override, _rank_layers, gate_override, rank_layers, reference_gate_override,
                       reference_rank_layers)
from .lesson07 import (T4_PEAK, _paper_1b_configs, _param_count, _t4_minutes, param_count, reference_param_count,
                       reference_t4_minutes, t4_minutes)
from .lesson08 import (_loss_spikes, _qwen3_next_q_proj, loss_spikes, qwen3_next_q_proj, reference_loss_spikes,
                       reference_qwen3_next_q_proj)

EXERCISES = ("causal_attention", "attention_with_null",  # lesson 01
             "g1_gate", "gated_output", "gate_param_count", "split_q_proj",  # 02
             "lr_schedule", "next_token_loss",  # 03
             "f_attn_m_act", "bos_share_by_part",  # 04
             "read_gates", "first_rest_ratio",  # 05
             "gate_override", "rank_layers",  # 06
             "param_count", "t4_minutes",  # 07
             "loss_spikes", "qwen3_next_q_proj")  # 08

__all__ = [
    "EXERCISES", "GRADING_ENV", "NOT_ATTEMPTED_RE", "PASSED_RE", "T4_PEAK", "Mismatch", "check", "grading",
    "not_attempted_message", "not_implemented_notice",
    "causal_attention", "attention_with_null", "g1_gate", "gated_output", "gate_param_count", "split_q_proj",
    "lr_schedule", "next_token_loss", "f_attn_m_act", "bos_share_by_part", "read_gates", "first_rest_ratio",
    "gate_override", "rank_layers", "param_count", "t4_minutes", "loss_spikes", "qwen3_next_q_proj",
    "reference_attention_with_null", "reference_bos_share_by_part", "reference_causal_attention",
    "reference_f_attn_m_act", "reference_first_rest_ratio", "reference_g1_gate", "reference_gate_override",
    "reference_gate_param_count", "reference_gated_output", "reference_loss_spikes", "reference_next_token_loss",
    "reference_param_count", "reference_qwen3_next_q_proj", "reference_rank_layers", "reference_read_gates",
    "reference_split_q_proj", "reference_t4_minutes",
    "_attention", "_bos_share_by_part", "_f_attn_m_act", "_first_rest_ratio", "_gate_override", "_gate_params",
    "_loss_spikes", "_next_token_loss", "_null_attention", "_paper_1b_configs", "_param_count", "_qwen3_next_q_proj",
    "_rank_layers", "_read_gates", "_schedule", "_split", "_t4_minutes",
]
