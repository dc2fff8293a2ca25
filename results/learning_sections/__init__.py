"""The sections of ``results/fig6_learning.py``'s learning.md and grid.md (Figs. 6, 9 and 10), its runs.csv rows and
its figures, each from the training runs' summaries."""
