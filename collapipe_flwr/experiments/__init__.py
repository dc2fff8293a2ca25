"""Sweeps and reports of the paper's experiments (Section VI).

- ``python -m collapipe_flwr.experiments [overrides]`` (``__main__``): the Hydra entry point; each job
  is validated (``job``) and trained through `flwr run` in simulation (``launch``: its command and
  environment ``flower_command``, its console ``console_echo``, its ``status.json`` ``job_status`` and
  ``log_errors``; ``processes``).
- ``python -m collapipe_flwr.experiments.report DIR`` (``report``): reads the job / run folders
  (``runs``), aggregates them (``aggregate``, ``reductions``: pure functions) and writes results.md,
  results.csv (``tables``) and PNG figures (``figures``).

A new training method is one planner module in ``collapipe_flwr/dssra/methods/`` plus its
``conf/method/<name>.yaml`` (docs/baselines.md); nothing here changes: everything in this package reads
the method's name from the run's labels and records, never from a list of methods.
"""
