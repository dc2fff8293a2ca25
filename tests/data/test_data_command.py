"""`python -m collapipe_flwr.data check|prepare` (docs/data.md, "Getting the data").

Every folder here is a tiny fake layout built in tmp_path; nothing is downloaded: the --from-hub path runs
against stand-in `datasets`, `huggingface_hub` and `sacremoses` modules, and its record -> line converters
are checked on hand-made records (the real Hub download is not exercised by any test).
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from collapipe_flwr import data
from collapipe_flwr.tasks.classification import read_titles
from collapipe_flwr.tasks.ner import read_bio
from tests.paths import ROOT

# The layout of docs/data.md, written out by hand (not derived from the configs the command reads).
FAKE = {
    "multi30k/tok/train.lc.norm.tok.en": "a man sleeps .\ntwo dogs run .\nthe kid &apos;s ball .\n",
    "multi30k/tok/train.lc.norm.tok.de": "ein mann schläft .\nzwei hunde rennen .\nder ball des kindes .\n",
    "multi30k/tok/val.lc.norm.tok.en": "a cat .\n",
    "multi30k/tok/val.lc.norm.tok.de": "eine katze .\n",
    "chinese_ner/train.txt": "张 B-PER\n三 I-PER\n在 O\n北 B-LOC\n京 I-LOC\n\n新 B-ORG\n华 I-ORG\n社 I-ORG\n",
    "chinese_ner/val.txt": "李 B-PER\n四 I-PER\n\n",
    "toutiao/train.txt": "上证指数大涨_!_12\n球队夺冠_!_3\n新车上市_!_6\n",
    "toutiao/val.txt": "电竞比赛开幕_!_14\n",
    "bert_base_chinese/vocab.txt": "[PAD]\n[unused1]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n张\n三\n",
}


def make_layout(root: Path, files: dict[str, str] = FAKE) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """main(argv) in-process: (exit code, stdout, stderr); exit_on_user_error's SystemExit(2) included."""
    try:
        code = data.main(list(argv))
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- check
def test_files_come_from_the_task_configs():
    names = {name for task in data.task_names() for g in data.file_groups(data.task_spec(task)) for name in g.names}
    assert names == set(FAKE)
    assert set(data.task_names()) == {"translation", "ner", "classification", "causal_lm"}


def test_check_ok_prints_counts(tmp_path, capsys):
    code, out, err = run(capsys, "check", "--dir", str(make_layout(tmp_path)))
    assert code == 0, out + err
    assert "translation: ok (train 3 pairs, val 1 pairs)" in out
    assert "ner: ok (train 2 sentences, val 1 sentences, vocab 8 tokens)" in out
    assert "classification: ok (train 3 titles, val 1 titles, vocab 8 tokens)" in out
    assert err == ""


def test_check_missing_file_names_it_and_the_fix(tmp_path, capsys):
    make_layout(tmp_path)
    (tmp_path / "chinese_ner/val.txt").unlink()
    (tmp_path / "bert_base_chinese/vocab.txt").unlink()
    code, out, err = run(capsys, "check", "--dir", str(tmp_path))
    assert code == 1
    assert "translation: ok" in out
    assert "ner: missing chinese_ner/val.txt, bert_base_chinese/vocab.txt" in out
    assert "classification: missing bert_base_chinese/vocab.txt" in out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: missing in ")
    assert lines[0].count("bert_base_chinese/vocab.txt") == 1  # shared by two tasks, named once
    assert "chinese_ner/val.txt" in lines[0] and "prepare --dir" in lines[0] and "--from-hub" in lines[0]


def test_check_missing_folder(tmp_path, capsys):
    code, out, err = run(capsys, "check", "--dir", str(tmp_path / "nowhere"))
    assert code == 1
    assert "(does not exist)" in out and "translation: missing multi30k/tok/train.lc.norm.tok.en" in out
    assert err.startswith("error: missing in ")


@pytest.mark.parametrize(
    ("name", "text", "task", "message"),
    [
        ("multi30k/tok/val.lc.norm.tok.de", "eine katze .\nzwei .\n", "translation", "has 1 lines but"),
        ("multi30k/tok/train.lc.norm.tok.en", "a man .\n\nthe kid .\n", "translation", ":2: empty line"),
        ("chinese_ner/train.txt", "张 B-PER\n三 X-PER\n", "ner", ":2: unknown tag 'X-PER'"),
        ("chinese_ner/val.txt", "张B-PER\n", "ner", ":1: expected 'char<SPACE>tag'"),
        ("toutiao/train.txt", "球队夺冠_!_15\n", "classification", ":1: unknown label id '15'"),
        ("toutiao/val.txt", "球队夺冠 3\n", "classification", "no '_!_' separator"),
        ("toutiao/val.txt", "", "classification", "toutiao/val.txt: empty (no titles)"),
        ("bert_base_chinese/vocab.txt", "\n\n", "ner", "bert_base_chinese/vocab.txt: empty (no tokens)"),
        ("bert_base_chinese/vocab.txt", "a\nb\n", "ner", "has no [PAD], [UNK], [CLS], [SEP] line"),
    ],
)
def test_check_bad_file_says_what_is_wrong(tmp_path, capsys, name, text, task, message):
    make_layout(tmp_path, {**FAKE, name: text})
    code, out, err = run(capsys, "check", "--dir", str(tmp_path))
    assert code == 1
    line = next(line for line in out.splitlines() if line.startswith(f"{task}: "))
    assert line.startswith(f"{task}: bad ") and message in line, line
    assert err.startswith("error: 1 malformed file(s)") or err.startswith("error: 2 malformed file(s)"), err
    assert "--force" in err and len(err.strip().splitlines()) == 1


def test_check_only_one_task_and_bad_arguments(tmp_path, capsys):
    make_layout(tmp_path)
    (tmp_path / "toutiao/val.txt").unlink()
    code, out, _ = run(capsys, "check", "--dir", str(tmp_path), "--task", "ner")
    assert code == 0 and "ner: ok" in out and "classification" not in out
    code, _, err = run(capsys, "check", "--task", "nope")
    assert code == 2 and err.startswith("error: --task 'nope' is not a configured task")
    a_file = tmp_path / "toutiao/train.txt"
    code, _, err = run(capsys, "check", "--dir", str(a_file))
    assert code == 2 and err.startswith("error: --dir ") and "is a file" in err


def test_default_check_dir_follows_the_env_variable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if not (ROOT / "data").is_dir():  # no ./data yet (nor data/ beside conf/): where prepare would write
        assert data.default_check_dir({}) == tmp_path / "data"
    (tmp_path / "data").mkdir()
    assert data.default_check_dir({}) == (tmp_path / "data").resolve()
    assert data.default_check_dir({"COLLAPIPE_DATA_DIR": str(tmp_path / "x")}) == (tmp_path / "x").resolve()


def test_check_real_data_folder(data_dir, capsys):
    code, out, err = run(capsys, "check", "--dir", str(data_dir))
    assert code == 0, out + err
    assert "translation: ok (train 29,000 pairs, val 1,014 pairs)" in out
    assert "vocab 21,128 tokens" in out


@pytest.mark.e2e
def test_cli_exit_codes_in_a_subprocess(tmp_path):
    make_layout(tmp_path)
    (tmp_path / "toutiao/train.txt").unlink()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "collapipe_flwr.data", "check", "--dir", str(tmp_path), "--task", "classification"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "classification: missing toutiao/train.txt" in done.stdout
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and done.stderr.startswith("error: missing in ")
    bad = [*cmd[:3], "prepare", "--dir", str(tmp_path / "out"), "--from", str(tmp_path / "absent")]
    done = subprocess.run(bad, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 2 and done.stderr.startswith("error: --from ") and "is not a folder" in done.stderr


# ----------------------------------------------------------------------------- prepare --from
def test_prepare_from_copies_the_needed_files(tmp_path, capsys):
    src = make_layout(tmp_path / "shared")
    (src / "README.md").write_text("not needed\n")
    dest = tmp_path / "work" / "data"
    code, out, err = run(capsys, "prepare", "--dir", str(dest), "--from", str(src))
    assert code == 0, out + err
    assert "copied 9 file(s)" in out and "translation: ok" in out
    for name, text in FAKE.items():
        assert not (dest / name).is_symlink() and (dest / name).read_text(encoding="utf-8") == text
    assert not (dest / "README.md").exists()
    code, out, _ = run(capsys, "prepare", "--dir", str(dest), "--from", str(src))  # again: nothing to do
    assert code == 0 and "copied 0 file(s)" in out and "(9 already there)" in out


def test_prepare_from_link_makes_the_folder_a_symlink(tmp_path, capsys):
    src = make_layout(tmp_path / "shared")
    dest = tmp_path / "data"
    code, out, _ = run(capsys, "prepare", "--dir", str(dest), "--from", str(src), "--link")
    assert code == 0 and f"linked {dest} -> {src}" in out
    assert dest.is_symlink() and dest.resolve() == src.resolve()


def test_prepare_never_writes_through_a_linked_folder(tmp_path, capsys):
    src, other = make_layout(tmp_path / "shared"), make_layout(tmp_path / "other")
    dest = tmp_path / "data"
    assert run(capsys, "prepare", "--dir", str(dest), "--from", str(src), "--link")[0] == 0
    code, out, _ = run(capsys, "prepare", "--dir", str(dest), "--from", str(src), "--link")  # again: a no-op
    assert code == 0 and "already" in out
    code, _, err = run(capsys, "prepare", "--dir", str(dest), "--from", str(other), "--force")
    assert code == 2 and err.startswith(f"error: --dir {dest} is a symlink to ") and f"rm {dest}" in err


def test_prepare_from_link_into_an_existing_folder_links_each_file(tmp_path, capsys):
    src = make_layout(tmp_path / "shared")
    dest = tmp_path / "data"
    (dest / "toutiao").mkdir(parents=True)
    (dest / "toutiao/train.txt").write_text("")  # an empty file may be replaced
    code, out, _ = run(capsys, "prepare", "--dir", str(dest), "--from", str(src), "--link")
    assert code == 0 and "linked 9 file(s)" in out
    for name in FAKE:
        assert (dest / name).is_symlink() and (dest / name).resolve() == (src / name).resolve()


def test_prepare_refuses_to_overwrite_without_force(tmp_path, capsys):
    src = make_layout(tmp_path / "shared")
    dest = tmp_path / "data"
    mine = dest / "chinese_ner/train.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("我 O\n", encoding="utf-8")
    code, out, err = run(capsys, "prepare", "--dir", str(dest), "--from", str(src))
    assert code == 2 and err.startswith(f"error: {mine} already exist(s)") and "--force" in err
    assert mine.read_text(encoding="utf-8") == "我 O\n"
    assert not (dest / "toutiao").exists()  # nothing written when refusing
    code, out, _ = run(capsys, "prepare", "--dir", str(dest), "--from", str(src), "--force")
    assert code == 0 and mine.read_text(encoding="utf-8") == FAKE["chinese_ner/train.txt"]


def test_prepare_from_an_incomplete_source_or_bad_flags(tmp_path, capsys):
    src = make_layout(tmp_path / "shared")
    (src / "toutiao/val.txt").unlink()
    code, _, err = run(capsys, "prepare", "--dir", str(tmp_path / "data"), "--from", str(src))
    assert code == 2 and err.startswith(f"error: --from {src} lacks toutiao/val.txt")
    assert not (tmp_path / "data").exists()
    code, _, err = run(capsys, "prepare", "--dir", str(tmp_path / "data"), "--link")
    assert code == 2 and err.startswith("error: --link needs --from")


def test_prepare_without_a_source_says_what_to_run(tmp_path, capsys):
    dest = make_layout(tmp_path / "data", {k: v for k, v in FAKE.items() if not k.startswith("toutiao/")})
    code, out, err = run(capsys, "prepare", "--dir", str(dest))
    assert code == 1
    assert "classification: missing toutiao/train.txt, toutiao/val.txt" in out
    assert f"prepare --dir {dest} --from <folder in the layout> [--link]" in out and "--from-hub" in out
    assert err.startswith("error: missing in ")


# ----------------------------------------------------------------------------- --from-hub converters
def test_parallel_and_moses_lines():
    rows = [{"en": " Two  dogs.", "de": "Zwei Hunde."}, {"en": "", "de": "leer"}, {"en": "A kid's ball", "de": "Ball"}]
    src, tgt = data.parallel_lines(rows, "en", "de")
    assert src == ["Two dogs.", "A kid's ball"] and tgt == ["Zwei Hunde.", "Ball"]

    def tokenize(text: str) -> str:  # a stand-in for sacremoses' MosesTokenizer
        return text.replace(".", " .").replace("'", " &apos;")

    assert data.moses_lines(src, str.strip, tokenize) == ["two dogs .", "a kid &apos;s ball"]


def test_bio_lines_round_trip_through_the_ner_reader(tmp_path):
    names = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]  # peoples_daily_ner's ClassLabel order
    rows = [
        {"tokens": ["张", "三", " ", "去", "北", "京"], "ner_tags": [1, 2, 0, 0, 5, 6]},
        {"tokens": [], "ner_tags": []},
        {"tokens": ["新", "华", "社"], "ner_tags": [3, 4, 4]},
    ]
    lines = data.bio_lines(rows, names)
    assert lines == ["张 B-PER", "三 I-PER", "去 O", "北 B-LOC", "京 I-LOC", "", "新 B-ORG", "华 I-ORG", "社 I-ORG", ""]
    data.write_lines(tmp_path / "ner.txt", lines)
    sentences = read_bio(tmp_path / "ner.txt")
    assert [s.tags for s in sentences] == [("B-PER", "I-PER", "O", "B-LOC", "I-LOC"), ("B-ORG", "I-ORG", "I-ORG")]
    with pytest.raises(data.DataFormatError, match="B-MISC"):
        data.bio_lines(rows, [*names[:6], "B-MISC"])


def test_title_lines_map_tnews_codes_to_toutiao_ids(tmp_path):
    names = [str(code) for code in (100, 101, 102, 103, 104, 106, 107, 108, 109, 110, 112, 113, 114, 115, 116)]
    rows = [
        {"sentence": "上证指数 大涨", "label": names.index("114")},
        {"sentence": "电竞比赛\n开幕", "label": names.index("116")},
        {"sentence": "无标签", "label": -1},  # the unlabelled TNEWS test split
        {"sentence": "  ", "label": 0},
    ]
    lines = data.title_lines(rows, names)
    assert lines == ["上证指数 大涨_!_12", "电竞比赛 开幕_!_14"]
    data.write_lines(tmp_path / "t.txt", lines)
    assert [t.label for t in read_titles(tmp_path / "t.txt")] == [12, 14]
    with pytest.raises(data.DataFormatError, match="105"):
        data.title_lines([{"sentence": "x", "label": 0}], ["105"])


# ----------------------------------------------------------------------------- --from-hub, stand-in libraries
class _Split(list):
    def __init__(self, rows, features):
        super().__init__(rows)
        self.features = features


def _stand_ins(tmp_path: Path, calls: list) -> dict[str, types.ModuleType]:
    tags = types.SimpleNamespace(feature=types.SimpleNamespace(names=["O", "B-PER", "I-PER", "B-ORG", "I-ORG"]))
    tnews = types.SimpleNamespace(names=["100", "101", "102", "103"])
    rows = {
        "bentrevett/multi30k": ([{"en": "A Dog's bone.", "de": "Ein Knochen."}], {}),
        "peoples_daily_ner": ([{"tokens": ["张", "三"], "ner_tags": [1, 2]}], {"ner_tags": tags}),
        "clue/clue": ([{"sentence": "球队夺冠", "label": 3}, {"sentence": "?", "label": -1}], {"label": tnews}),
    }

    def load_dataset(path, name=None, split=None, revision=None):
        calls.append((path, name, split, revision))
        if path == "peoples_daily_ner" and revision is None:
            raise RuntimeError("Dataset scripts are no longer supported, but found peoples_daily_ner.py")
        return _Split(*rows[path])

    def hf_hub_download(repo_id, filename):
        calls.append((repo_id, filename))
        path = tmp_path / "hub_cache" / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n张\n")
        return str(path)

    class Normalizer:
        def __init__(self, lang):
            self.lang = lang

        def normalize(self, text):
            return text

    class Tokenizer(Normalizer):
        def tokenize(self, text, return_str, escape):
            assert return_str and escape
            return text.replace(".", " .").replace("'", " &apos;")

    return {
        "datasets": types.SimpleNamespace(load_dataset=load_dataset),
        "huggingface_hub": types.SimpleNamespace(hf_hub_download=hf_hub_download),
        "sacremoses": types.SimpleNamespace(MosesPunctNormalizer=Normalizer, MosesTokenizer=Tokenizer),
    }


def test_prepare_from_hub_with_stand_in_libraries(tmp_path, capsys, monkeypatch):
    calls: list = []
    for name, module in _stand_ins(tmp_path, calls).items():
        monkeypatch.setitem(sys.modules, name, module)
    dest = tmp_path / "data"
    code, out, err = run(capsys, "prepare", "--dir", str(dest), "--from-hub")
    assert code == 0, out + err
    assert (dest / "multi30k/tok/train.lc.norm.tok.en").read_text() == "a dog &apos;s bone .\n"
    assert (dest / "multi30k/tok/val.lc.norm.tok.de").read_text() == "ein knochen .\n"
    assert (dest / "chinese_ner/train.txt").read_text() == "张 B-PER\n三 I-PER\n\n"
    assert (dest / "toutiao/val.txt").read_text() == "球队夺冠_!_3\n"
    assert "translation: ok" in out and "ner: ok" in out and "classification: ok" in out
    assert ("clue/clue", "tnews", "validation", None) in calls
    assert ("peoples_daily_ner", None, "train", "refs/convert/parquet") in calls  # the parquet-export fallback
    assert [c for c in calls if len(c) == 2] == [(data.VOCAB_REPO, "vocab.txt")]  # the shared vocab once
    code, _, err = run(capsys, "prepare", "--dir", str(dest), "--from-hub")  # the files exist now
    assert code == 2 and "already exist(s)" in err and "--force" in err


def test_prepare_from_hub_without_the_libraries(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    code, _, err = run(capsys, "prepare", "--dir", str(tmp_path / "data"), "--from-hub")
    assert code == 2 and err.startswith("error: --from-hub needs the datasets package") and "pip install" in err
