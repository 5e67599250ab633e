"""Hardware figures the course projects run times from, for the machines learners use but the tests never see.

`python -m minigate.bench ablation` and lesson 07's projection of its run time on a T4 read them; they sit here, in
the library, so that code outside the benchmarks can read them too.
"""

T4_PEAK = 65e12  # FLOP/s, a T4's fp16 tensor cores (NVIDIA's datasheet): projecting a sweep's time on a free Colab T4
