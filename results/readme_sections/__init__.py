"""The tables of results/README.md, by the records they come from; ``results/readme_tables.py`` writes them into
their marked blocks."""
