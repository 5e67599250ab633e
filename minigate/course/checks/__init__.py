"""Graded checks with hints for the course's exercises: `my_fn = checks.<exercise>(my_fn)`.

engine.py holds check() (its docstring says what a check prints, returns and raises) and grading mode;
lessonNN.py holds lesson NN's exercises (its EXERCISES), each with its reference and its typical mistakes (its
MISTAKES: exercise -> [(label, a learner's function that makes the mistake, the hint it earns)], mostly switches of
private `_name` functions, which are not exported: import them from `checks.lessonNN`); grade.py scores learners'
notebooks (`python -m minigate.course grade`). Every exercise and its reference are exported here under their own
names; LESSONS maps a lesson ("01") to its exercises, MISTAKES an exercise to its typical mistakes."""

from . import lesson01, lesson02, lesson03, lesson04, lesson05, lesson06, lesson07, lesson08
from .engine import (GRADING_ENV, NOT_ATTEMPTED_RE, PASSED_RE, Mismatch, check, grading, not_attempted_message,
                     not_implemented_notice)
from .lesson01 import attention_with_null, causal_attention, reference_attention_with_null, reference_causal_attention
from .lesson02 import (g1_gate, head_output_by_part, nonlinear_share, reference_g1_gate, reference_head_output_by_part,
                       reference_nonlinear_share, reference_split_q_proj, split_q_proj)
from .lesson03 import bos_tracker, reference_bos_tracker, reference_sink_head_interval, sink_head_interval
from .lesson04 import (bos_noop_test, bos_share_by_part, locate_massive, reference_bos_noop_test,
                       reference_bos_share_by_part, reference_locate_massive)
from .lesson05 import first_rest_ratio, gate_by_phase, reference_first_rest_ratio, reference_gate_by_phase
from .lesson06 import (forbid_bos, gate_override, predict_bos_cost, reference_forbid_bos, reference_gate_override,
                       reference_predict_bos_cost)
from .lesson07 import first_token_excess, reference_first_token_excess
from .lesson08 import (has_gate, prediction_spread, qwen3_next_q_proj, reference_has_gate, reference_prediction_spread,
                       reference_qwen3_next_q_proj)

_MODULES = (lesson01, lesson02, lesson03, lesson04, lesson05, lesson06, lesson07, lesson08)
LESSONS = {m.__name__[-2:]: m.EXERCISES for m in _MODULES}  # "01" -> ("causal_attention", "attention_with_null")
EXERCISES = tuple(name for names in LESSONS.values() for name in names)
MISTAKES = {name: mistakes for m in _MODULES for name, mistakes in m.MISTAKES.items()}

__all__ = [
    "EXERCISES", "GRADING_ENV", "LESSONS", "MISTAKES", "NOT_ATTEMPTED_RE", "PASSED_RE", "Mismatch", "check",
    "grading", "not_attempted_message", "not_implemented_notice",
    "causal_attention", "attention_with_null", "g1_gate", "head_output_by_part", "split_q_proj", "nonlinear_share",
    "bos_tracker", "sink_head_interval", "locate_massive", "bos_noop_test", "bos_share_by_part",
    "gate_by_phase",
    "first_rest_ratio",
    "gate_override", "predict_bos_cost", "forbid_bos", "first_token_excess", "prediction_spread", "qwen3_next_q_proj",
    "has_gate", "reference_has_gate",
    "reference_attention_with_null", "reference_bos_noop_test", "reference_bos_share_by_part",
    "reference_causal_attention",
    "reference_first_rest_ratio", "reference_first_token_excess", "reference_forbid_bos",
    "reference_g1_gate", "reference_gate_override",
    "reference_head_output_by_part", "reference_nonlinear_share", "reference_locate_massive",
    "reference_prediction_spread", "reference_predict_bos_cost",
    "reference_qwen3_next_q_proj", "reference_gate_by_phase", "reference_bos_tracker",
    "reference_sink_head_interval",
    "reference_split_q_proj",
]
