"""The parts of ``benchmarks/pipeline_overhead.py``: the benchmark's model and plain reference, the fair figures,
the two-device machine figures, the CPU quota figure, and the step's bound from its own compute."""
