"""Plain helpers shared by the test modules (fixtures live in conftest.py): the repository's paths and the
tiny training config, the command line in this process and in a process of its own, servers and
training runs that a test starts and waits for, and the tiny offline models (a character BERT, subword
models, LAC-small) built from random weights. A test module imports from here, never from another."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, NamedTuple

import pytest

from nerkit.ending import stop_child

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
TINY_TRAIN = FIXTURES / "tiny_train.bio"
TINY_DEV = FIXTURES / "tiny_dev.bio"


def tiny_raw_config() -> dict:
    """A config dict for a model that trains in a second or two on the tiny fixture corpus."""
    return {
        "data": {"train": str(TINY_TRAIN), "dev": str(TINY_DEV), "max_len": 250},
        "embeddings": {"char_dim": 16, "bichar_dim": 8, "dropout": 0.0},
        "encoder": {"name": "bilstm", "hidden_size": 16},
        "train": {"epochs": 6, "batch_size": 8, "lr": 0.02, "patience": 0, "seed": 1, "device": "cpu"},
    }


def training_chars() -> list[str]:
    """The tiny training corpus's characters, sorted."""
    from nerkit.data.corpus import read_corpus

    return sorted({c for s in read_corpus(TINY_TRAIN).sentences for c in s.tokens})


def write_loop_config(directory: Path) -> Path:
    """The tiny config as a file for `nerkit bench loop`: two epochs a round, the tiny dev set
    standing in as the test set the loop scores."""
    import yaml

    raw = tiny_raw_config()
    raw["data"]["test"] = str(TINY_DEV)
    raw["train"]["epochs"] = 2
    path = directory / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def build_pipeline(config, scheme: str = "bio", seed: int = 0):
    """An untrained Pipeline for `config`, with the tiny training corpus's vocabulary and types."""
    import torch

    import nerkit.training.loop as train_module
    from nerkit.data.corpus import read_corpus
    from nerkit.data.splits import Splits

    torch.manual_seed(seed)
    corpus = read_corpus(FIXTURES / "tiny_train.bio")
    return train_module.build_pipeline(config, Splits(corpus.sentences, [], None, corpus.types, scheme, {}))


def parse_jsonl(text: str) -> list[dict]:
    return [json.loads(line) for line in text.split("\n") if line]  # not splitlines(): U+2028 is in a text


# ----------------------------------------------------------------------- the command line

class CliRun(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def run_cli(monkeypatch, capfd, *args, stdin: bytes | None = None) -> CliRun:
    """`nerkit ARGS` in this process through the real entry point (`main`, which maps a UserError to
    exit code 2, as typer's own CliRunner would not): exit code, stdout and stderr."""
    import io

    from nerkit.cli.app import main

    monkeypatch.setattr(sys, "argv", ["nerkit", *map(str, args)])
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    with pytest.raises(SystemExit) as info:
        main()
    out, err = capfd.readouterr()
    return CliRun(info.value.code or 0, out, err)


def nerkit_command(*args) -> list[str]:
    """The command that runs `nerkit ARGS` in a process of its own, as a user would."""
    return [sys.executable, "-m", "nerkit", *map(str, args)]


def run_nerkit(*args, cwd: Path = REPO, timeout: float = 300, env: dict | None = None,
               text: bool = True) -> subprocess.CompletedProcess:
    """`python -m nerkit ARGS` in a process of its own, its output captured; a warning is an error
    there as it is here, unless `env` (the whole environment) says otherwise."""
    env = {**os.environ, "PYTHONWARNINGS": "error"} if env is None else env
    return subprocess.run(nerkit_command(*args), cwd=cwd, capture_output=True, text=text, timeout=timeout, env=env)


# ----------------------------------------------------------------------- processes that serve on a port

def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(process, url: str, seconds: float, log: Path) -> None:
    """Poll `url` until it answers 200, failing with the process's log if the process ends first or
    `seconds` pass: a server started by a test is up before the test talks to it."""
    import httpx

    deadline = time.monotonic() + seconds
    while True:
        output = log.read_text(encoding="utf-8", errors="replace")[-3000:] if log.exists() else ""
        assert process.poll() is None, f"{url}: the server ended ({process.returncode}):\n{output}"
        assert time.monotonic() < deadline, f"no answer from {url} after {seconds} s:\n{output}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)


def stop(process, seconds: float = 30) -> None:
    """SIGTERM, then SIGKILL if the process has not ended `seconds` later."""
    stop_child(process, seconds)


class Server(NamedTuple):
    process: subprocess.Popen
    url: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


SERVER_STARTUP = 120  # seconds a server may take to start on a busy machine


@contextmanager
def serving(model_dir: Path, log_dir: Path, *options: str) -> Iterator[Server]:
    """`python -m nerkit serve` on a free port of 127.0.0.1, ready (its /health answers); SIGTERM,
    then SIGKILL if it has not ended 30 s later, when the block ends."""
    port = free_port()
    log = log_dir / f"serve-{port}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(nerkit_command("serve", "--model", model_dir, "--host", "127.0.0.1",
                                                  "--port", port, "--threads", "1", *options),
                                   cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    server = Server(process, f"http://127.0.0.1:{port}", log)
    try:
        wait_until_up(process, f"{server.url}/health", SERVER_STARTUP, log)
        yield server
    finally:
        stop(process)


# ----------------------------------------------------------------------- training runs in a process

def checkpoint_step(out: Path) -> int:
    """The step of the run directory's checkpoint; -1 before one is written (or while it is replaced)."""
    try:
        return json.loads((out / "checkpoint" / "state.json").read_text(encoding="utf-8"))["progress"]["step"]
    except (FileNotFoundError, ValueError, KeyError):
        return -1


def wait_for_step(process: subprocess.Popen, out: Path, step: int, timeout: float = 120) -> None:
    """Poll the checkpoint until it has reached `step` (the run goes on meanwhile); fails if the run
    ends first, with its stderr, or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while checkpoint_step(out) < step:
        if process.poll() is not None:
            pytest.fail(f"the run ended ({process.returncode}) before step {step}:\n{process.communicate()[1]}")
        if time.monotonic() >= deadline:
            pytest.fail("the run did not reach the step in time")
        time.sleep(0.002)


# ----------------------------------------------------------------------- a tiny character BERT

# A tiny nested corpus: ORG 中华人民共和国国务院 holds LOC 中华人民共和国, which holds LOC 中华.
NESTED_SENTENCES = [("中华人民共和国国务院总理张三", [(0, 10, "ORG"), (0, 7, "LOC"), (0, 2, "LOC"), (12, 14, "PER")]),
                    ("李四在北京", [(0, 2, "PER"), (3, 5, "LOC")]),
                    ("北京大学的张三", [(0, 4, "ORG"), (0, 2, "LOC"), (5, 7, "PER")])]


def train_nested_span_model(root: Path) -> tuple[Path, dict]:
    """A span-head model trained on NESTED_SENTENCES (each four times, dev the same) to dev F1 1.0
    in a few seconds: its directory and training metrics. Its scores are the head's own, at
    span.threshold (span.choose_threshold=false): what the tests of a model's own scores read."""
    from nerkit.config import build_config
    from nerkit.training.loop import train

    records = [{"text": t, "entities": [{"start": s, "end": e, "type": k} for s, e, k in ents]}
               for t, ents in NESTED_SENTENCES]
    path = root / "nested.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records) * 4, encoding="utf-8")
    config = build_config(tiny_raw_config(), "<tiny>", [f"data.train={path}", f"data.dev={path}", "model.head=span",
                                                        "span.size=16", "span.max_width=12", "train.epochs=30",
                                                        "train.lr=0.01", "span.choose_threshold=false"])
    return root / "model", train(config, out=root / "model", progress_bar=False)


LM_CHARS = list("我爱北京天安门中国人民银行上海市长江大桥的是在了和有") + list("abcxyz0123456789，。！") + ["ａ"]
LM_VOCAB = ["[PAD]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + LM_CHARS + ["##" + c for c in "北京上海"]


def fixture_lm_vocab() -> list[str]:
    """A BERT vocabulary with every character of the tiny training and dev corpora."""
    from nerkit.data.corpus import read_corpus

    chars = training_chars() + [c for s in read_corpus(TINY_DEV).sentences for c in s.tokens]
    return ["[PAD]", "[unused1]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(chars))


def bert_config(vocab_size: int = len(LM_VOCAB), max_positions: int = 16, layers: int = 2):
    from transformers import BertConfig

    return BertConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=layers, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=max_positions, type_vocab_size=2)


def write_lm(directory, vocab=LM_VOCAB, lower=True, weights="safetensors", seed=0, config=None, prefix=""):
    """A tiny random BertModel as a Hugging Face directory; returns the directory."""
    import torch
    from safetensors.torch import save_file
    from transformers import BertModel

    torch.manual_seed(seed)
    config = config or bert_config(len(vocab))
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    (directory / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": lower}), encoding="utf-8")
    state = {prefix + k: v.contiguous() for k, v in BertModel(config).state_dict().items()}  # with its pooler
    if weights == "safetensors":
        save_file(state, str(directory / "model.safetensors"))
    else:
        torch.save(state, directory / "pytorch_model.bin")
    return directory


# ----------------------------------------------------------------------- tiny subword models

SUBWORD_TEXTS = ["张三 在北京大学读书。", "Ａ１ｂ２ 😀 café Hello world 2024年", "e\u0301 上海\t新华社  记者", "  "]


def subword_corpus_text() -> list[str]:
    from nerkit.data.corpus import read_corpus

    return [s.text for s in read_corpus(FIXTURES / "tiny_train.bio").sentences] + SUBWORD_TEXTS


def build_tokenizer(kind: str):
    """A fast tokenizer of `kind` (wordpiece, unigram, bytelevel or xlnet) trained on the fixtures."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=specials)
        template, names = "[CLS] $A [SEP]", ("[CLS]", "[SEP]")
        extra = dict(pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    elif kind == "bytelevel":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        template, names = "<s> $A </s>", ("<s>", "</s>")
        extra = dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>",
                     cls_token="<s>", sep_token="</s>")
    else:  # unigram (XLM-R) and xlnet: SentencePiece-style
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        if kind == "unigram":
            specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
            template, names = "<s> $A </s>", ("<s>", "</s>")
            extra = dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                         mask_token="<mask>", cls_token="<s>", sep_token="</s>")
        else:
            specials = ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>"]
            template, names = "$A <sep> <cls>", ("<sep>", "<cls>")
            extra = dict(bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
                         mask_token="<mask>", cls_token="<cls>", sep_token="<sep>")
        trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=specials, unk_token="<unk>")
    tok.train_from_iterator(subword_corpus_text(), trainer)
    tok.post_processor = processors.TemplateProcessing(single=template,
                                                       special_tokens=[(n, tok.token_to_id(n)) for n in names])
    if kind == "bytelevel":
        tok.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **extra)


def build_model(kind: str, vocab_size: int, pad_id: int):
    """A tiny random model of `kind` (see build_tokenizer) for a vocabulary of `vocab_size`."""
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "xlnet":
        config = transformers.XLNetConfig(vocab_size=vocab_size, d_model=16, n_layer=2, n_head=2, d_inner=32,
                                          pad_token_id=pad_id)
        return transformers.XLNetModel(config)
    if kind == "wordpiece":
        config = transformers.BertConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=2,
                                         num_attention_heads=2, intermediate_size=32, max_position_embeddings=64,
                                         pad_token_id=pad_id)
        return transformers.BertModel(config, add_pooling_layer=False)
    cls = transformers.XLMRobertaConfig if kind == "unigram" else transformers.RobertaConfig
    config = cls(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=32, max_position_embeddings=66, pad_token_id=pad_id)
    model_cls = transformers.XLMRobertaModel if kind == "unigram" else transformers.RobertaModel
    return model_cls(config, add_pooling_layer=False)


def write_subword_lm(kind: str, directory: Path) -> Path:
    """build_model and build_tokenizer's `kind` saved as a Hugging Face directory; returns it."""
    tokenizer = build_tokenizer(kind)
    build_model(kind, len(tokenizer), tokenizer.pad_token_id).save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


# ----------------------------------------------------------------------- a small random LAC

LAC_CHARS = list("张三在北京大学读书李明去了上海中国人民银行的是") + ["Ａ", "a", "。", ".", "OOV"]
LAC_TAGS = ["PER-B", "PER-I", "O"]


def small_lac_config():
    from nerkit.pretrained.lac import LACConfig

    return LACConfig(vocab_size=40, embedding_dim=4, hidden_size=4, num_layers=2, num_tags=3)


def random_paddle_tensors(config, seed: int = 0) -> dict:
    import numpy as np

    from nerkit.pretrained.paddle import paddle_shapes

    rng = np.random.default_rng(seed)
    return {name: rng.normal(0, 0.7, shape).astype(np.float32) for name, shape in paddle_shapes(config).items()}


def small_tagger(seed: int = 0) -> tuple:
    """A LACTagger of small_lac_config() with random weights, and those weights as Paddle's tensors."""
    from nerkit.pretrained.lac import LACTagger
    from nerkit.pretrained.paddle import paddle_state

    config = small_lac_config()
    tensors = random_paddle_tensors(config, seed)
    tagger = LACTagger(config)
    tagger.load_state_dict(paddle_state(tensors, config))
    return tagger.eval(), tensors


def small_vocab(fold: bool = True):
    from nerkit.pretrained.lac import LACVocab

    return LACVocab({c: i for i, c in enumerate(LAC_CHARS)}, fold=fold)


# ----------------------------------------------------------------------- user errors

def read_error(path, fmt: str = "auto", **kwargs):
    """The CorpusError that reading PATH raises (read_corpus's options as keywords)."""
    import pytest

    from nerkit.data.corpus import read_corpus
    from nerkit.errors import CorpusError

    with pytest.raises(CorpusError) as info:
        read_corpus(path, fmt=fmt, **kwargs)
    return info.value


def assert_one_error_line(result, where: str, words: str) -> None:
    """Exit code 2 and one line on stderr, `nerkit: error: WHERE: ...`, holding `words` and a fix."""
    assert result.returncode == 2 and result.stdout == "", result
    assert result.stderr.startswith(f"nerkit: error: {where}: ") and result.stderr.count("\n") == 1, result.stderr
    assert words in result.stderr and "; " in result.stderr and "Traceback" not in result.stderr
