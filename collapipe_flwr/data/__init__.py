"""Get the datasets into the layout docs/data.md describes, and check a data folder holds them
(``python -m collapipe_flwr.data check|prepare``, :mod:`collapipe_flwr.data.cli`).

Modules: ``layout`` (the files each task's config names), ``check`` (reading them with the tasks' own
readers), ``files`` (writing into a data folder safely), ``from_folder`` (``prepare --from``), ``hub``
(``prepare --from-hub``) with ``hub_lines`` (Hub records -> the layout's lines), ``cli`` (the command).
"""

from collapipe_flwr.data.check import TaskReport, check_task, default_check_dir, run_check
from collapipe_flwr.data.cli import main
from collapipe_flwr.data.files import write_lines
from collapipe_flwr.data.from_folder import prepare_from
from collapipe_flwr.data.hub import VOCAB_REPO, prepare_from_hub
from collapipe_flwr.data.hub_lines import bio_lines, moses_lines, parallel_lines, title_lines
from collapipe_flwr.data.layout import FileGroup, file_groups, task_names, task_spec
from collapipe_flwr.errors import DataFormatError

__all__ = [
    "VOCAB_REPO",
    "DataFormatError",
    "FileGroup",
    "TaskReport",
    "bio_lines",
    "check_task",
    "default_check_dir",
    "file_groups",
    "main",
    "moses_lines",
    "parallel_lines",
    "prepare_from",
    "prepare_from_hub",
    "run_check",
    "task_names",
    "task_spec",
    "title_lines",
    "write_lines",
]
