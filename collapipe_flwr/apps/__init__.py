"""The commands a user runs: ``collapipe`` (:mod:`.cli`), ``python -m collapipe_flwr.apps.<name>`` for
:mod:`.evaluate`, :mod:`.generate`, :mod:`.simulate` (DSSRA alone) and :mod:`.train_central` (the central
reference). The top layer: nothing in the package imports an app."""
