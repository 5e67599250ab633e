"""Hardware figures the course projects run times from, for the machines learners use but the tests never see.

Lesson 07's T4 budget (`minigate.course.checks`) and `python -m minigate.bench ablation` both read them; they sit
here, in the library below both, because the checks and the benchmarks never import each other.
"""

T4_PEAK = 65e12  # FLOP/s, a T4's fp16 tensor cores (NVIDIA's datasheet): projecting a sweep's time on a free Colab T4
