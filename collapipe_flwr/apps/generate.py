"""Generate text from a saved causal-LM run on the un-split Hugging Face model (docs/hf_export.md).

    python -m collapipe_flwr.apps.generate RUN_FOLDER --prompt TEXT [--prompt TEXT ...] [--max-new-tokens N]
        [--greedy | --temperature T --top-p P --seed S] [--from merged|adapters] [--round R] [--data-dir DIR]
        [--device cpu]

RUN_FOLDER is a LoRA causal-LM run (or its ``model/`` folder). ``--from merged`` (the default) loads
``model/merged/`` with ``AutoModelForCausalLM.from_pretrained`` alone; ``--from adapters`` loads the base the
adapters name (``model/base/``, models/hf/peft_base.py; for a run saved before it wrote one, the run's
``model.hf_folder`` or the model its config builds, which needs the data the run trained on) and
``peft.PeftModel.from_pretrained(base, model/peft)``. ``--round R`` does the same with round R's adapters,
``model/rounds/R/peft`` (config/round_adapters.py), of a finished run or one still training. Greedy unless
``--temperature`` or ``--top-p`` is given. Each prompt's continuation goes to stdout, one a line; what was
loaded to stderr. A prompt is written as the run wrote its examples (``task.format``, ``task.chat_template``:
models/hf/prompting.py, the function its training and evaluation call): a translation run's ``--prompt`` is the
source sentence and the output its translation.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch

from collapipe_flwr.accelerator import DEVICES, resolve_device
from collapipe_flwr.errors import CollaPipeError, ConfigError, exit_on_user_error
from collapipe_flwr.model_store import MODEL_DIR, load_model, model_dir_of, read_meta

SOURCES = ("merged", "adapters")


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one ``error:`` line and exit code 2 (``exit_on_user_error``)."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message}; see python -m collapipe_flwr.apps.generate --help")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _Parser(prog="python -m collapipe_flwr.apps.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="run folder holding model/ (or the model/ folder itself)")
    parser.add_argument("--prompt", action="append", required=True, help="text to continue (repeat for several)")
    parser.add_argument("--max-new-tokens", type=int, default=20, help="tokens to generate at most (default 20)")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--greedy", action="store_true", help="the most likely token each step (the default)")
    how.add_argument("--temperature", type=float, help="sample at this temperature (> 0)")
    parser.add_argument("--top-p", type=float, help="sample from the top-p nucleus (0 < p <= 1; default 1)")
    parser.add_argument("--seed", type=int, default=0, help="the sampling seed (default 0)")
    parser.add_argument("--from", dest="source", choices=SOURCES, help="default: merged (adapters with --round)")
    parser.add_argument("--round", type=int, help="round R's adapters (model/rounds/R/peft) instead of the final ones")
    parser.add_argument("--data-dir", default="", help="--from adapters of a run saved without model/base: its data")
    parser.add_argument("--device", choices=DEVICES, default="cpu", help="cpu (default), cuda or auto")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    return parser.parse_args(argv)


def sampling_of(args: argparse.Namespace):
    """The Sampling the flags ask for (``--greedy`` and ``--top-p`` together are refused)."""
    from collapipe_flwr.models.hf.generation import Sampling

    if args.greedy and args.top_p is not None:
        raise ConfigError("--greedy takes no --top-p; drop one of them")
    sampled = args.temperature is not None or args.top_p is not None
    temperature = 1.0 if args.temperature is None else args.temperature
    top_p = 1.0 if args.top_p is None else args.top_p
    return Sampling(args.max_new_tokens, not sampled, temperature, top_p, args.seed)


def prompt_format_of(model_dir: Path):
    """How the run wrote its examples (task.format, task.chat_template: models/hf/prompting.py), read from its saved
    config, so a prompt is written as training wrote a source (a run saved before the option: plain text)."""
    from collapipe_flwr.tasks.lm_translation import prompt_format

    return prompt_format(read_meta(model_dir)["config"]["task"])


def causal_lm_dir(folder: str) -> Path:
    """The ``model/`` folder of a saved causal-LM run with LoRA exports (else a one-line ConfigError)."""
    model_dir = model_dir_of(folder)
    meta = read_meta(model_dir)
    name = meta["config"]["task"].get("name")
    if name != "causal_lm":
        raise ConfigError(f"{folder} is a {name} run; generate needs a causal_lm run (task=causal_lm)")
    exports = meta.get("exports") or {}
    if not (exports.get("merged") and exports.get("peft")):
        why = exports.get("skipped") or "it was saved without LoRA or before runs wrote exports"
        raise ConfigError(f"{folder} has no PEFT / merged export ({why}); train with model.lora.enabled=true")
    return model_dir


def round_adapters_dir(folder: str, t: int) -> tuple[Path, Path]:
    """(the ``model/`` folder, round t's adapters ``model/rounds/<t>/peft``) of a run folder (or of its ``model/``
    folder), which a run writes as it trains (config/round_adapters.py): the run need not have finished."""
    from collapipe_flwr.models.hf.peft_export import ADAPTER_CONFIG
    from collapipe_flwr.models.hf.round_adapters import kept_rounds, round_folder

    path = Path(folder).expanduser()
    if not path.is_dir():
        raise ConfigError(f"model folder {path} does not exist; pass the folder of a federated LoRA causal-LM run")
    model_dir = path / MODEL_DIR if (path / MODEL_DIR).is_dir() else path
    adapters = round_folder(model_dir, t)
    if not (adapters / ADAPTER_CONFIG).is_file():
        kept = ", ".join(str(r) for r in kept_rounds(model_dir)) or "none"
        raise ConfigError(
            f"{path} holds no adapters of round {t} (rounds kept: {kept}); pick a kept round, or train with "
            "round_adapters.every=1 (round_adapters.keep: how many stay)"
        )
    return model_dir, adapters


def _hf_errors(what: str, call):
    """``call()``, with any error of the libraries reading a saved folder (a damaged file raises anything from an
    OSError to a SafetensorError or a RuntimeError) as one line naming ``what``."""
    try:
        return call()
    except CollaPipeError:
        raise
    except Exception as err:  # noqa: BLE001 - a saved folder's damage, whatever the library calls it
        first = (str(err).splitlines() or [type(err).__name__])[0][:160]
        raise ConfigError(f"cannot load {what} ({type(err).__name__}: {first}); save the run again") from None


def check_prompts(prompts: Sequence[str]) -> None:
    """Every prompt is text (an argument of invalid UTF-8 reaches Python as lone surrogates), else one line."""
    for number, prompt in enumerate(prompts, 1):
        try:
            prompt.encode("utf-8")
        except UnicodeEncodeError as err:
            code = ord(prompt[err.start])
            byte = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"character U+{code:04X}"
            raise ConfigError(
                f"--prompt number {number} is not valid UTF-8 ({byte} at character {err.start}); pass the prompt "
                "as UTF-8 text"
            ) from None


def _complete_weights(folder: Path) -> None:
    """The folder's safetensors hold every tensor its config.json's model needs, of the right shape (no random
    weights without a word; models/hf/folder_weights.py), else one line naming the first."""
    from collapipe_flwr.models.hf.folder_weights import missing_weights

    missing = _hf_errors(str(folder), lambda: missing_weights(folder))
    if missing:
        raise ConfigError(f"{folder} holds no {missing[0]} ({len(missing)} weights missing); save the run again")


def load_merged(model_dir: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of ``model/merged/``, transformers alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = str(model_dir / "merged")
    _complete_weights(model_dir / "merged")
    model = _hf_errors(folder, lambda: AutoModelForCausalLM.from_pretrained(folder, local_files_only=True))
    return model, _hf_errors(f"the tokenizer of {folder}", lambda: AutoTokenizer.from_pretrained(folder))


def _base(adapters: Path, model_dir: Path, data_dir: str) -> tuple[Any, Path]:
    """(the base the adapters of ``adapters`` load on, the folder of its tokenizer): the folder its
    ``base_model.json`` names (models/hf/peft_base.py); for an export written before that, the folder its
    ``base_model_name_or_path`` names, else the base rebuilt from the run's config (a from-scratch base needs
    the run's data, a packaged one its package)."""
    from transformers import AutoModelForCausalLM

    from collapipe_flwr.models.hf.adapter_checks import read_adapter_config
    from collapipe_flwr.models.hf.peft_base import base_folder
    from collapipe_flwr.models.hf.peft_export import ADAPTER_CONFIG, unsplit_model

    folder = base_folder(adapters)
    if folder is None:
        named = read_adapter_config(adapters / ADAPTER_CONFIG).get("base_model_name_or_path")
        folder = Path(named) if isinstance(named, str) and named and Path(named).is_dir() else None
    if folder is None:
        _, _, split = load_model(model_dir, data_dir=data_dir or None)
        return unsplit_model(*split.parts()), model_dir / "tokenizer"
    _complete_weights(folder)
    base = _hf_errors(str(folder), lambda: AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True))
    return base, folder if (folder / "tokenizer_config.json").is_file() else model_dir / "tokenizer"


def load_adapters(adapters: Path, model_dir: Path, data_dir: str) -> tuple[Any, Any]:
    """(base + the adapters of ``adapters`` as a PeftModel, the run's tokenizer); the base as :func:`_base`
    finds it."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    from collapipe_flwr.models.hf.adapter_checks import check_adapter_config, read_adapter_config
    from collapipe_flwr.models.hf.peft_export import ADAPTER_CONFIG

    saved = read_adapter_config(adapters / ADAPTER_CONFIG)
    base, tokenizer_dir = _base(adapters, model_dir, data_dir)
    check_adapter_config(adapters / ADAPTER_CONFIG, saved, base)  # names only, ranks bounded: before peft allocates
    model = _hf_errors(str(adapters), lambda: PeftModel.from_pretrained(base, str(adapters)))
    tokenizer = _hf_errors(f"the tokenizer of {tokenizer_dir}", lambda: AutoTokenizer.from_pretrained(tokenizer_dir))
    return model, tokenizer


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> list[str]:
    args = parse_args(argv)
    sampling = sampling_of(args)
    check_prompts(args.prompt)
    if args.threads < 0:
        raise ConfigError(f"--threads={args.threads} must be >= 0 (0 = torch's default)")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device, "--device")
    if args.round is not None and args.source == "merged":
        raise ConfigError(f"--round {args.round} reads that round's adapters; drop --from merged")
    source = args.source or ("merged" if args.round is None else "adapters")
    if args.round is None:
        model_dir = causal_lm_dir(args.folder)
        adapters = model_dir / "peft"
    else:
        model_dir, adapters = round_adapters_dir(args.folder, args.round)
    from collapipe_flwr.models.hf.generation import check_lengths, continuations
    from collapipe_flwr.models.hf.loading import quiet_transformers

    with quiet_transformers():  # no progress bars: stderr says what was loaded, stdout holds the texts alone
        model, tokenizer = (
            load_merged(model_dir) if source == "merged" else load_adapters(adapters, model_dir, args.data_dir)
        )
    fmt = prompt_format_of(model_dir)
    check_lengths(model, tokenizer, args.prompt, sampling, fmt)
    model.to(device)
    what = source if args.round is None else f"round {args.round}'s adapters"
    print(
        f"generating from {model_dir} ({what}) on {device}: {sampling.describe()}, prompts as {fmt.describe()}",
        file=sys.stderr,
    )
    texts = continuations(model, tokenizer, args.prompt, sampling, fmt)
    for text in texts:
        print(text, flush=True)
    return texts


if __name__ == "__main__":
    main()
