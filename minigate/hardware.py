"""Hardware figures the course projects run times from, for the machines learners use but the tests never see.

Read by `python -m minigate.bench ablation` and by lesson 07's projection of a sweep's run time on a T4.
"""

T4_PEAK = 65e12  # FLOP/s, a T4's fp16 tensor cores (NVIDIA's datasheet): projecting a sweep's time on a free Colab T4
