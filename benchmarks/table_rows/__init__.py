"""The rows of ``benchmarks/run_all.py``'s table: each figure, how it is read from the benchmarks' ``name: value``
lines, its target and the command that measures it alone."""
