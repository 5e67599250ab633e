"""Figures for the lessons: each function takes tidy results (from analysis.py, gate_analysis.py, ablation.py or a
training History) and returns a matplotlib Figure with titles, axis labels and colorbars. One module per topic:

- sinks.py: the attention sink and massive activations (attention maps, first-token shares, M-Act, residual maps);
- gates.py: gate scores and per-head tables, and what closing the gates costs (ablation sweeps, paired costs);
- training.py: loss curves and what a training callback records;
- _style.py: what they share (COLORS, one per variant's name; ticks, legends, wrapped labels).

    fig = plots.first_token_share({"baseline": sink_b, "headwise": sink_h})
"""

from ._style import COLORS
from .gates import (BAR_COLORS, cost_bars, gate_by_type, gate_dimension_classes, gate_distribution,
                    gate_first_vs_rest, gate_head_means, gate_layer_quantiles, gate_token_matrix, head_table,
                    head_writes_and_looks, layer_ablation, sweep_curve)
from .sinks import attention_maps, first_token_excess_map, first_token_share, m_act_per_layer, residual_map
from .training import loss_curves, training_metric, training_metrics

__all__ = ["BAR_COLORS", "COLORS", "attention_maps", "cost_bars", "first_token_excess_map",
           "first_token_share", "gate_by_type", "gate_dimension_classes", "gate_distribution", "gate_first_vs_rest",
           "gate_head_means", "gate_layer_quantiles", "gate_token_matrix", "head_table", "head_writes_and_looks",
           "layer_ablation", "loss_curves", "m_act_per_layer", "residual_map", "sweep_curve",
           "training_metric", "training_metrics"]
