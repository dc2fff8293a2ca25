"""Generate text from a saved causal-LM run on the un-split Hugging Face model (docs/hf_export.md).

    python -m collapipe_flwr.apps.generate RUN_FOLDER --prompt TEXT [--prompt TEXT ...] [--max-new-tokens N]
        [--greedy | --temperature T --top-p P --seed S] [--from merged|adapters] [--data-dir DIR] [--device cpu]

RUN_FOLDER is a LoRA causal-LM run (or its ``model/`` folder). ``--from merged`` (the default) loads
``model/merged/`` with ``AutoModelForCausalLM.from_pretrained`` alone; ``--from adapters`` loads the base
(the run's ``model.hf_folder``; for a from-scratch base the model its config builds, which needs the data the
run trained on) and ``peft.PeftModel.from_pretrained(base, model/peft)``. Greedy unless ``--temperature`` or
``--top-p`` is given. Each prompt's continuation goes to stdout, one a line; what was loaded to stderr.
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
from collapipe_flwr.model_store import load_model, model_dir_of, read_meta

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
    parser.add_argument("--from", dest="source", choices=SOURCES, default="merged", help="default: merged")
    parser.add_argument("--data-dir", default="", help="--from adapters of a from-scratch base: the run's data")
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


def load_adapters(model_dir: Path, data_dir: str) -> tuple[Any, Any]:
    """(base + ``model/peft`` as a PeftModel, the run's tokenizer); the base from the adapters' base folder, or
    rebuilt from the run's config (a from-scratch base)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from collapipe_flwr.models.hf.adapter_checks import check_adapter_config, read_adapter_config
    from collapipe_flwr.models.hf.peft_export import ADAPTER_CONFIG, unsplit_model

    adapters = model_dir / "peft"
    saved = read_adapter_config(adapters / ADAPTER_CONFIG)
    base_name = saved.get("base_model_name_or_path")
    if base_name:
        if not isinstance(base_name, str) or not Path(base_name).is_dir():
            raise ConfigError(f"the base {base_name} of {adapters} is not a folder here; use --from merged")
        _complete_weights(Path(base_name))
        base = _hf_errors(base_name, lambda: AutoModelForCausalLM.from_pretrained(base_name, local_files_only=True))
    else:
        _, _, split = load_model(model_dir, data_dir=data_dir or None)
        base = unsplit_model(*split.parts())
    check_adapter_config(adapters / ADAPTER_CONFIG, saved, base)  # names only, ranks bounded: before peft allocates
    model = _hf_errors(str(adapters), lambda: PeftModel.from_pretrained(base, str(adapters)))
    tokenizer_dir = str(model_dir / "tokenizer")
    return model, _hf_errors(f"the tokenizer of {tokenizer_dir}", lambda: AutoTokenizer.from_pretrained(tokenizer_dir))


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
    model_dir = causal_lm_dir(args.folder)
    from collapipe_flwr.models.hf.generation import check_lengths, continuations
    from collapipe_flwr.models.hf.loading import quiet_transformers

    with quiet_transformers():  # no progress bars: stderr says what was loaded, stdout holds the texts alone
        model, tokenizer = (
            load_merged(model_dir) if args.source == "merged" else load_adapters(model_dir, args.data_dir)
        )
    check_lengths(model, tokenizer, args.prompt, sampling)
    model.to(device)
    print(f"generating from {model_dir} ({args.source}) on {device}: {sampling.describe()}", file=sys.stderr)
    texts = continuations(model, tokenizer, args.prompt, sampling)
    for text in texts:
        print(text, flush=True)
    return texts


if __name__ == "__main__":
    main()
