"""What the scripts of results/ share to read kept records and write tables and figures.

A script imports it as ``from reportlib import ...``: run as ``python results/<name>.py`` results/ is the first
entry of ``sys.path``; a test loads a script through ``tests/results_scripts.py``, which puts it there too.

- :mod:`reportlib.stats`: mean +- sd over seeds;
- :mod:`reportlib.records`: a kept ``*.rounds.jsonl.gz`` record;
- :mod:`reportlib.markdown`: reading the ``name: value`` files and markdown tables the scripts keep;
- :mod:`reportlib.plots`: matplotlib on the headless backend, and saving a figure.
"""
