"""What the scripts of results/ share to read kept records and write tables and figures.

A script imports it as ``from reportlib import ...``: run as ``python results/<name>.py`` results/ is the first
entry of ``sys.path``; a test loads a script through ``tests/results_scripts.py``, which puts it there too.

- :mod:`reportlib.stats`: mean +- sd over seeds, as numbers and as a table's text;
- :mod:`reportlib.records`: reading kept records (rounds.jsonl, plain or gzip'd; JSON; CSV), and a record's modelled
  round as the typed ``ModelledRound``;
- :mod:`reportlib.markdown`: markdown table rows and headers, writing a generated file, and reading back the
  ``name: value`` files and markdown tables the scripts keep;
- :mod:`reportlib.plots`: matplotlib on the headless backend, and saving a figure.
- :mod:`reportlib.verdict`: the claims table's one verdict rule on paired gains, and
  :mod:`reportlib.paper_figures`: the paper's figures it judges against.

Written by hand and kept small (the standard library, numpy and matplotlib, and the package's own ``ModelledRound``):
only what two scripts or more would otherwise each write again; a helper one script needs stays in that script.
"""
