"""`nerkit distill` (nerkit.tools.distill, nerkit.training.distill, nerkit.training.distill_cache):
the soft loss against the CRF's exact marginals (zero when they are equal, its gradient against
finite differences), several teachers' targets (their averaged marginals and the best valid path
over them, against brute force), a student that reaches its teacher's tags, resume after a kill, the teacher
cache (reused, rebuilt when the teacher or the text changes, continued after a cut build), the
lines overlapping dev taken out, and the student as an ordinary model directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import FIXTURES, REPO, TINY_DEV, TINY_TRAIN, tiny_raw_config

from nerkit.config import build_config
from nerkit.data.corpus import read_corpus
from nerkit.errors import UserError
from nerkit.model.crf import CRF

TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def crf_inputs(seed: int = 0):
    torch.manual_seed(seed)
    crf = CRF(TAGS).double()
    emissions = torch.randn(3, 6, len(TAGS), dtype=torch.float64)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] + [0] * 5], dtype=torch.bool)
    return crf, emissions, mask


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_soft_loss_is_zero_for_equal_marginals_and_positive_otherwise(temperature):
    crf, emissions, mask = crf_inputs()
    targets = crf.marginals(emissions, mask, temperature)
    assert crf.posterior_kl(emissions, mask, targets, temperature).abs().item() < 1e-10
    other = emissions + torch.randn_like(emissions)
    assert crf.posterior_kl(other, mask, targets, temperature).item() > 1e-3
    # the marginals of the differentiable forward-backward are the no-grad ones
    assert torch.allclose(crf.log_marginals(emissions, mask, temperature).exp()[mask], targets[mask])


def test_soft_loss_gradient_matches_finite_differences():
    crf, emissions, mask = crf_inputs(1)
    targets = crf.marginals(torch.randn_like(emissions), mask, 1.5)
    emissions.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda e: crf.posterior_kl(e, mask, targets, 1.5), (emissions,))


def test_soft_loss_has_no_gradient_along_the_offset_every_tag_of_a_position_shares():
    # Adding one number to every tag's emission at a position changes no path's probability, so the
    # exact gradient summed over a position's tags is 0. A long window of large emissions (what a
    # distilled student had when it diverged) in float32 gave that sum a size like the gradient's own.
    torch.manual_seed(0)
    crf = CRF(["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"])
    emissions = 10 * torch.randn(4, 250, 7)
    mask = torch.ones(4, 250, dtype=torch.bool)
    targets = crf.marginals(emissions + 3 * torch.randn_like(emissions), mask).to(torch.float16)
    emissions.requires_grad_(True)
    crf.posterior_kl(emissions, mask, targets).backward()
    along_offset = emissions.grad.sum(2)  # (B, T): the gradient along each position's shared offset
    assert along_offset.abs().max() < 1e-6 * emissions.grad.abs().max()  # float32 rounding of the gradient itself; was 7e-2


# ------------------------------------------------------------------------------ end to end


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    from nerkit.training.loop import train

    out = tmp_path_factory.mktemp("teacher") / "model"
    train(build_config(tiny_raw_config(), "<teacher>", ["train.epochs=8"]), out=out)
    return out


def lines_of(path: Path) -> list[str]:
    return [s.text for s in read_corpus(path).sentences]


def student_config(tmp_path: Path, *sets: str):
    return build_config(tiny_raw_config(), "<student>", [f"distill.cache={tmp_path / 'cache'}", "train.epochs=2",
                                                         *sets])


def write_text(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def brute_best_valid_path(log_marginals: torch.Tensor, tags: list[str]) -> list[int]:
    """Among every tag sequence the scheme allows, the one of the largest summed log marginal."""
    import itertools

    from nerkit.model.crf import allowed_transitions

    start_ok, trans_ok, end_ok = allowed_transitions(tags)
    best, best_score = None, float("-inf")
    for path in itertools.product(range(len(tags)), repeat=len(log_marginals)):
        if not (start_ok[path[0]] and end_ok[path[-1]] and all(trans_ok[a, b] for a, b in zip(path, path[1:]))):
            continue
        total = sum(log_marginals[t, k].item() for t, k in enumerate(path))
        if total > best_score:
            best, best_score = list(path), total
    return best


@pytest.mark.parametrize("seed", range(5))
def test_several_teachers_average_their_marginals_and_take_the_best_valid_path(seed, tmp_path):
    """Two teachers, their tags in other orders than the student's: the targets are the mean of their
    marginals in the student's order, and the hard target the valid path of the largest summed log
    averaged marginal (brute force over every sequence), not a per-position argmax; one teacher
    alone keeps its own best path."""
    from nerkit.training.distill import combined_targets
    from nerkit.training.distill_cache import TeacherTargets

    generator = torch.Generator().manual_seed(seed)
    offsets = [0, 4, 5, 8]  # three sequences of 4, 1 and 3 characters
    orders = [[2, 0, 4, 1, 3], [4, 3, 2, 1, 0]]  # teacher column -> student tag

    def teacher(order):
        marginals = torch.softmax(3 * torch.randn(offsets[-1], len(TAGS), generator=generator), -1)
        paths = torch.randint(len(TAGS), (offsets[-1],), generator=generator)  # a teacher's own best paths
        return TeacherTargets([TAGS[k] for k in order], marginals.to(torch.float16), paths, offsets, "k", tmp_path, 0)

    teachers = [teacher(order) for order in orders]
    marginals, paths, got_offsets = combined_targets([[t] for t in teachers], TAGS)
    assert got_offsets == offsets
    in_student_order = [t.marginals.float()[:, [t.tags.index(tag) for tag in TAGS]] for t in teachers]
    expected = (in_student_order[0] + in_student_order[1]) / 2
    assert torch.allclose(marginals.float(), expected, atol=1e-3)
    for a, b in zip(offsets, offsets[1:]):
        assert paths[a:b].tolist() == brute_best_valid_path(expected[a:b].clamp(min=1e-12).log(), TAGS)
    _, alone, _ = combined_targets([[teachers[1]]], TAGS)
    assert alone.tolist() == [TAGS.index(teachers[1].tags[k]) for k in teachers[1].paths.tolist()]


def test_lines_overlapping_dev_are_excluded_and_recorded(teacher, tmp_path):
    from nerkit.tools.distill import distill

    dev = lines_of(FIXTURES / "tiny_dev.bio")
    train_only = [line for line in lines_of(TINY_TRAIN) if line not in dev][:20]
    text = write_text(tmp_path / "新闻.txt", train_only + dev[:3])  # a file name as users have them
    result = distill(student_config(tmp_path, "train.epochs=1"), [teacher], [text], tmp_path / "student")
    record = result["distillation"]["texts"][0]
    assert record["lines"] == 23 and record["lines_excluded"] >= 3
    assert record["lines_used"] == 23 - record["lines_excluded"]
    written = (tmp_path / "student" / "nerkit.json").read_text(encoding="utf-8")
    assert "新闻.txt" in written  # readable as written, not \\u-escaped
    meta = json.loads(written)
    assert meta["distilled_from"]["texts"][0]["lines_excluded"] == record["lines_excluded"]
    assert meta["distilled_from"]["teachers"][0]["path"] == str(teacher)


def test_text_limit_reads_the_first_lines_of_each_text(teacher, tmp_path):
    from nerkit.tools.distill import distill

    dev = lines_of(FIXTURES / "tiny_dev.bio")
    text = write_text(tmp_path / "text.txt", [line for line in lines_of(TINY_TRAIN) if line not in dev][:20])
    config = student_config(tmp_path, "train.epochs=1", "distill.text_limit=7")
    result = distill(config, [teacher], [text], tmp_path / "student")
    record = result["distillation"]
    assert record["texts"][0]["lines"] == 7 and record["texts"][0]["lines_used"] == 7
    assert record["options"]["text_limit"] == 7


def test_cache_is_reused_and_rebuilt_when_teacher_or_text_changes(teacher, tmp_path):
    import shutil

    from nerkit.inference.pipeline import Pipeline
    from nerkit.tools.distill import distill

    text = write_text(tmp_path / "text.txt", lines_of(TINY_TRAIN)[:30])
    config = student_config(tmp_path, "train.epochs=1")
    first = distill(config, [teacher], [text], tmp_path / "a")["cache"][0]
    assert first["scored"] > 0 and first["bytes"] > 0
    again = distill(config, [teacher], [text], tmp_path / "b")["cache"][0]
    assert again["scored"] == 0 and again["cache"] == first["cache"]  # no teacher forward the second time
    write_text(text, lines_of(TINY_TRAIN)[:31])
    changed_text = distill(config, [teacher], [text], tmp_path / "c")["cache"][0]
    assert changed_text["scored"] > 0 and changed_text["cache"] != first["cache"]
    other = tmp_path / "teacher2"
    shutil.copytree(teacher, other)
    pipe = Pipeline.load(other)
    with torch.no_grad():
        pipe.model.head.emission.bias.add_(0.1)
    pipe.write_weights(other)
    changed_teacher = distill(config, [other], [text], tmp_path / "d")["cache"][0]
    assert changed_teacher["scored"] > 0 and changed_teacher["cache"] != changed_text["cache"]


def test_cut_cache_build_continues_where_it_stopped(teacher, tmp_path):
    from nerkit.inference.pipeline import Pipeline
    from nerkit.training.distill_cache import MANIFEST, TargetOptions, cached_targets

    pipe = Pipeline.load(teacher)
    units = [list(line) for line in lines_of(TINY_TRAIN)]
    options = TargetOptions(window=0, temperature=1.0)
    whole = cached_targets(pipe, teacher, "t", "x", units, options, tmp_path, shard_units=16)
    shards = sorted(whole.directory.glob("shard-*.safetensors"))
    assert len(shards) == -(-len(units) // 16)
    shards[-1].unlink()  # a build killed before its last shard was in place
    (whole.directory / MANIFEST).write_text((whole.directory / MANIFEST).read_text())
    again = cached_targets(pipe, teacher, "t", "x", units, options, tmp_path, shard_units=16)
    assert again.scored == len(units) - 16 * (len(shards) - 1)
    assert torch.equal(again.marginals, whole.marginals) and torch.equal(again.paths, whole.paths)
    assert whole.marginals.dtype == torch.float16
    assert torch.allclose(whole.marginals.float().sum(1), torch.ones(len(whole.marginals)), atol=1e-2)


def test_a_cache_key_with_marginals_is_the_one_caches_had_before_the_options_were_typed():
    """TargetOptions keys a cache with marginals by the dict the options were (issue 56): caches
    built before it are still found; one without marginals gets a key of its own."""
    import hashlib

    from nerkit.training.distill_cache import TargetOptions, cache_key

    before = json.dumps({"format": 1, "window": 250, "temperature": 2.0, "lines_sha256": "abc"}, sort_keys=True)
    assert cache_key("t", "x", TargetOptions(250, 2.0, "abc")) == hashlib.sha256(f"t\nx\n{before}".encode()).hexdigest()
    assert cache_key("t", "x", TargetOptions(250, 2.0, "abc", marginals=False)) != cache_key("t", "x", TargetOptions(250, 2.0, "abc"))
    assert cache_key("t", "x", TargetOptions(250, 2.0, "abc", marginals=False)) == \
        cache_key("t", "x", TargetOptions(250, 1.0, "abc", marginals=False))  # a best path has no temperature


def test_one_teachers_hard_targets_compute_and_cache_no_marginals(teacher, tmp_path, monkeypatch):
    """Issue 56: with one teacher and hard targets the marginals were computed, stored and keyed,
    never read. Now the teacher's forward-backward is not run and the cache holds its paths alone;
    soft targets (or several teachers) still get them, in a cache of their own."""
    from nerkit.tools.distill import distill
    from nerkit.training.distill_cache import MANIFEST

    def no_marginals(*args, **kwargs):
        raise AssertionError("the teacher's marginals were computed")

    text = write_text(tmp_path / "text.txt", lines_of(TINY_TRAIN)[:30])
    with monkeypatch.context() as patch:
        patch.setattr(CRF, "marginals", no_marginals)
        hard = distill(student_config(tmp_path, "train.epochs=1"), [teacher], [text], tmp_path / "hard")
    cache = Path(hard["cache"][0]["cache"])
    manifest = json.loads((cache / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["marginals_dtype"] is None and manifest["options"]["marginals"] is False
    from safetensors.torch import load_file

    assert all("marginals" not in load_file(str(p)) for p in cache.glob("shard-*.safetensors"))
    assert set(hard["distillation"]["options"]) == {"targets", "temperature", "weight", "ratio", "text_limit"}
    soft = distill(student_config(tmp_path, "train.epochs=1", "distill.targets=soft"), [teacher], [text],
                   tmp_path / "soft")["cache"][0]
    assert soft["scored"] > 0 and soft["cache"] != str(cache)
    manifest = json.loads((Path(soft["cache"]) / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["marginals_dtype"] == "float16" and "marginals" not in manifest["options"]


@pytest.mark.slow  # trains a student for several seconds
@pytest.mark.parametrize("targets", ["soft", "hard"])
def test_student_reaches_its_teachers_tags(teacher, tmp_path, targets):
    from nerkit.inference.pipeline import Pipeline
    from nerkit.tools.distill import distill

    dev = set(lines_of(FIXTURES / "tiny_dev.bio"))
    lines = [line for line in lines_of(TINY_TRAIN) if line not in dev]
    text = write_text(tmp_path / "text.txt", lines)
    # a few gold sentences; the teacher's targets teach the rest (no dropout: what is tested is the
    # distillation, not how one random stream of dropout masks happens to fall on 52 lines)
    config = student_config(tmp_path, "data.limit=8", "train.epochs=25", "distill.ratio=4", "distill.weight=2",
                            f"distill.targets={targets}", "encoder.dropout=0")
    distill(config, [teacher], [text], tmp_path / "student")
    teacher_spans = Pipeline.load(teacher).predict(lines)
    student_spans = Pipeline.load(tmp_path / "student").predict(lines)
    agree = sum(a == b for a, b in zip(teacher_spans, student_spans)) / len(lines)
    assert agree == 1.0, agree
    # metrics.jsonl keeps the two losses apart: the epoch's loss is their mean over its batches
    records = [json.loads(line) for line in (tmp_path / "student" / "metrics.jsonl").read_text().splitlines()]
    steps = records[1]["step"] - records[0]["step"]  # gold batches g and 4 g unlabelled ones (ratio 4)
    for r in records:
        assert r["loss"] == pytest.approx((r["gold_loss"] * steps / 5 + r["distill_loss"] * 4 * steps / 5) / steps)
    assert records[-1]["distill_loss"] < records[0]["distill_loss"]


def test_its_own_training_text_leaves_the_students_vocabulary_as_gold_alone_makes_it(teacher, tmp_path):
    """A training sentence read again as text is counted once: with bigrams kept from two sightings,
    counting it twice kept every bigram seen once (MSRA's own-text student had 15.8 M parameters, the gold-only BiLSTM 8.1 M)."""
    from nerkit.tools.distill import distill

    sets = ["train.epochs=1", "embeddings.min_freq=2", "embeddings.bichar_min_freq=2"]
    dev = set(lines_of(FIXTURES / "tiny_dev.bio"))
    own = write_text(tmp_path / "own.txt", [line for line in lines_of(TINY_TRAIN) if line not in dev])
    distill(student_config(tmp_path, *sets), [teacher], [own], tmp_path / "own")
    plain = build_config(tiny_raw_config(), "<plain>", sets)
    from nerkit.training.loop import train

    train(plain, out=tmp_path / "plain")
    vocab = json.loads((tmp_path / "plain" / "vocab.json").read_text(encoding="utf-8"))
    assert json.loads((tmp_path / "own" / "vocab.json").read_text(encoding="utf-8")) == vocab
    other = write_text(tmp_path / "other.txt", ["新的文字里有新的字新的词"] * 2)  # new text still counts
    distill(student_config(tmp_path, *sets), [teacher], [other], tmp_path / "other")
    assert json.loads((tmp_path / "other" / "vocab.json").read_text(encoding="utf-8")) != vocab


def test_a_teacher_with_other_tags_or_an_onnx_export_is_refused(teacher, tmp_path):
    from nerkit.tools.distill import distill

    text = write_text(tmp_path / "text.txt", lines_of(TINY_TRAIN)[:5])
    with pytest.raises(UserError, match="tags") as info:
        distill(student_config(tmp_path, "data.scheme=bioes"), [teacher], [text], tmp_path / "s1")
    assert "data.scheme" in info.value.fix
    onnx = tmp_path / "export"
    onnx.mkdir()
    (onnx / "model.onnx").write_bytes(b"onnx")
    with pytest.raises(UserError, match="ONNX"):
        distill(student_config(tmp_path), [onnx], [text], tmp_path / "s2")
    with pytest.raises(UserError, match="no such model directory"):  # before the corpus (missing too) is read
        distill(student_config(tmp_path, "data.train=/nonexistent/train.bio"), [tmp_path / "typo"], [text],
                tmp_path / "s5")
    with pytest.raises(UserError, match="student has model.head: span"):
        distill(student_config(tmp_path, "model.head=span"), [teacher], [text], tmp_path / "s3")
    from nerkit.training.loop import train

    span_teacher = tmp_path / "span-teacher"
    train(build_config(tiny_raw_config(), "<span>", ["train.max_steps=1", "model.head=span"]), out=span_teacher)
    with pytest.raises(UserError, match="cannot teach"):
        distill(student_config(tmp_path), [span_teacher], [text], tmp_path / "s4")



def test_a_teacher_of_other_types_is_refused_in_one_short_line_naming_them():
    """Issue 55: a teacher of other types was refused with every one of its tags on one line (72 of
    them, about 1,000 characters) and the advice to set data.scheme, which cannot help. The types
    that differ are named, a few of them, and the advice is about types; a teacher of the same
    types in another scheme is told data.scheme."""
    from nerkit.data.tags import scheme_tags
    from nerkit.training.distill import check_tags

    medical = [f"T{i:02d}" for i in range(24)]
    with pytest.raises(UserError) as info:
        check_tags(scheme_tags(medical + ["PER"], "bio"), scheme_tags(["LOC", "ORG", "PER"], "bio"), "runs/t")
    line = str(info.value)
    assert "T00, T01, T02, T03, T04 and 19 more" in line and "LOC, ORG not the teacher's" in line
    assert "PER" not in line and "B-" not in line and "\n" not in line and len(line) < 250
    assert "data.scheme" not in line and "types" in info.value.fix
    with pytest.raises(UserError) as info:
        check_tags(scheme_tags(["PER"], "bio"), scheme_tags(["PER"], "bioes"), "runs/t")
    assert "BIO, the student's corpus in BIOES" in str(info.value) and "data.scheme: bio" in info.value.fix

@pytest.mark.slow  # runs the command line and `nerkit predict`
def test_cli_student_is_an_ordinary_model_directory(teacher, tmp_path, nerkit, write_file):
    config = write_file(json.dumps(tiny_raw_config()), "student.yaml")  # JSON is YAML
    dev = set(lines_of(FIXTURES / "tiny_dev.bio"))
    text = write_text(tmp_path / "text.txt", [line for line in lines_of(TINY_TRAIN) if line not in dev][:20])
    out = tmp_path / "student"
    result = nerkit("distill", "--teacher", teacher, "--text", text, "--config", config, "--out", out,
                    "--set", "train.epochs=2", "--set", f"distill.cache={tmp_path / 'cache'}")
    assert json.loads(result.stdout)["unlabelled_sequences"] == 20
    predicted = nerkit("predict", text, "--model", out)
    assert len(predicted.stdout.splitlines()) == 20


# Runs `nerkit distill` and sends itself signal SIG right after its checkpoint N is in place.
KILLED = r"""
import os, signal, sys
n, sig = int(sys.argv[1]), getattr(signal, sys.argv[2])
sys.argv = ["nerkit", *sys.argv[3:]]
import nerkit.training.loop as T
calls = [0]
save = T.save_checkpoint
def patched(out, *args, **kwargs):
    save(out, *args, **kwargs)
    calls[0] += 1
    if calls[0] == n:
        os.kill(os.getpid(), sig)
T.save_checkpoint = patched
from nerkit.cli.app import main
main()
"""


@pytest.mark.slow  # starts and kills a process
def test_resume_after_a_kill_gives_the_same_student(teacher, tmp_path, write_file):
    from nerkit.tools.distill import distill

    config_file = write_file(json.dumps(tiny_raw_config()), "student.yaml")
    text = write_text(tmp_path / "text.txt", lines_of(TINY_TRAIN)[:40])
    sets = [f"distill.cache={tmp_path / 'cache'}", "train.epochs=3", "train.checkpoint_every=4",
            "embeddings.dropout=0.3"]
    args = ["distill", "--teacher", teacher, "--text", text, "--config", config_file, "--out", tmp_path / "killed"]
    args += [a for s in sets for a in ("--set", s)]
    killed = subprocess.run([sys.executable, "-c", KILLED, "3", "SIGKILL", *map(str, args)], cwd=REPO,
                            capture_output=True, text=True, timeout=180)
    assert killed.returncode == -9, killed.stderr
    assert not (tmp_path / "killed" / "metrics.json").exists()
    config = build_config(tiny_raw_config(), "<student>", sets)
    distill(config, [teacher], [text], tmp_path / "killed", resume=True)
    distill(config, [teacher], [text], tmp_path / "whole")
    for name in ("model.safetensors", "last/model.safetensors"):
        assert (tmp_path / "killed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


@pytest.mark.slow  # starts two processes
def test_a_stopped_student_names_nerkit_distill_to_go_on(teacher, tmp_path, write_file):
    """SIGTERM and train.max_steps both say how to continue: `nerkit train --resume`, which refuses a
    distilled run, was named before."""
    config_file = write_file(json.dumps(tiny_raw_config()), "student.yaml")
    text = write_text(tmp_path / "text.txt", lines_of(TINY_TRAIN)[:40])
    args = ["distill", "--teacher", teacher, "--text", text, "--config", config_file,
            "--set", f"distill.cache={tmp_path / 'cache'}", "--set", "train.checkpoint_every=4"]
    stopped = subprocess.run([sys.executable, "-c", KILLED, "1", "SIGTERM", *map(str, args), "--out",
                              str(tmp_path / "stopped")], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert stopped.returncode == 143, stopped.stderr
    assert "Continue with: the same `nerkit distill` command with --resume" in stopped.stderr.splitlines()[-1]
    limited = subprocess.run([sys.executable, "-m", "nerkit", *map(str, args), "--out", str(tmp_path / "limited"),
                              "--set", "train.max_steps=3"], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert limited.returncode == 0, limited.stderr
    assert "continue with: the same `nerkit distill` command with --resume --set train.max_steps=6" in limited.stderr
    assert "nerkit train" not in stopped.stderr + limited.stderr


# ------------------------------------------------------------------------------ in a bench matrix
# `nerkit bench` runs whose `teachers:` name other runs: trained after them through `distill()`.


def write_yaml(path: Path, data) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def bench_matrix(tmp_path: Path, runs: list[dict]) -> Path:
    """A matrix of `runs` over the tiny config (its distillation cache in tmp_path)."""
    raw = tiny_raw_config()
    raw["train"]["epochs"] = 2
    raw["distill"] = {"cache": str(tmp_path / "cache")}
    config = write_yaml(tmp_path / "tiny.yaml", raw)
    return write_yaml(tmp_path / "matrix.yaml", {"predict_batch_size": 8, "runs": [
        {"dataset": "tiny", "config": str(config), **run} for run in runs]})


def read_records(out: Path) -> dict[str, dict]:
    return {r["name"]: r for r in map(json.loads, (out / "results.jsonl").read_text(encoding="utf-8").splitlines())}


@pytest.fixture(scope="module")
def distill_bench(tmp_path_factory):
    """Through the CLI with --jobs 2: teacher `t`, its students `s` (a text) and `own` (its training
    split's text, dev carved from the training file), teacher `broken` (its training file is
    missing) and its student `orphan`."""
    from helpers import run_nerkit

    root = tmp_path_factory.mktemp("distill-bench")
    text = write_text(root / "text.txt", lines_of(TINY_TRAIN)[:20])
    matrix = bench_matrix(root, [
        {"name": "orphan", "teachers": ["broken"], "text": [str(text)]},
        {"name": "s", "teachers": ["t"], "text": [str(text)], "overrides": ["distill.targets=hard"]},
        {"name": "t"},
        {"name": "broken", "overrides": ["data.train=/nonexistent/train.bio"]},
        {"name": "own", "teachers": ["t"], "train_text": True,
         "overrides": ["data.dev=null", "data.dev_split=0.3", f"data.test={TINY_DEV}"]},
    ])
    out = root / "out"
    result = run_nerkit("bench", "--matrix", matrix, "--out", out, "--jobs", "2")
    return matrix, out, text, result


@pytest.mark.slow  # trains five runs in processes of their own
def test_a_student_trains_after_its_teacher_and_names_it_and_its_text(distill_bench):
    from nerkit.data.stats import sha256_file

    _, out, text, result = distill_bench
    records = read_records(out)
    assert result.returncode == 1, result.stderr  # broken and orphan failed
    assert records["t"]["status"] == "ok" and "teachers" not in records["t"]
    student = records["s"]
    assert student["status"] == "ok", student.get("error")
    assert student["teachers"] == ["t"] and student["text"] == [str(text)]
    read = student["distilled_from"]["texts"][0]
    assert read["sha256"] == sha256_file(text) and read["lines"] == 20
    assert read["lines_used"] + read["lines_excluded"] == 20
    assert student["distilled_from"]["options"]["targets"] == "hard"
    assert student["distilled_from"]["teachers"][0]["path"] == str(out / "runs" / "t")
    meta = json.loads((out / "runs" / "s" / "nerkit.json").read_text(encoding="utf-8"))
    assert meta["distilled_from"] == student["distilled_from"]  # the record is the model directory's
    assert student["test"] is None and 0 <= student["dev"]["f1"] <= 1


@pytest.mark.slow
def test_a_student_of_a_failed_teacher_is_recorded_failed_with_the_reason(distill_bench):
    _, out, _, _ = distill_bench
    records = read_records(out)
    assert records["broken"]["status"] == "failed" and "/nonexistent/train.bio" in records["broken"]["error"]
    orphan = records["orphan"]
    assert orphan["status"] == "failed" and orphan["failed_teachers"] == ["broken"]
    assert "teacher broken failed" in orphan["error"]
    assert not (out / "runs" / "orphan").exists()  # never started


@pytest.mark.slow
def test_train_text_is_the_training_split_and_never_dev_or_test(distill_bench):
    from nerkit.config import load_config
    from nerkit.data.splits import read_splits

    matrix, out, _, _ = distill_bench
    record = read_records(out)["own"]
    assert record["status"] == "ok", record.get("error")
    splits = read_splits(load_config(matrix.parent / "tiny.yaml", record["overrides"]))
    written = (out / "texts" / "own.train.txt").read_text(encoding="utf-8").splitlines()
    assert written == [s.text for s in splits.train]
    # the dev sentences carved from the training file and the test sentences (less the texts that
    # the training split repeats) are not in it
    held_out = {s.text for s in splits.dev + splits.test} - {s.text for s in splits.train}
    assert len(held_out) > 5 and not held_out & set(written)
    assert len(written) < len(read_corpus(TINY_TRAIN).sentences)  # the carve took sentences out
    read = record["distilled_from"]["texts"][0]
    assert read["path"] == str(out / "texts" / "own.train.txt") and read["lines"] == len(written)


@pytest.mark.slow
def test_resume_skips_a_recorded_teacher_and_student(distill_bench, tmp_path):
    import shutil

    from helpers import run_nerkit

    matrix, out, _, _ = distill_bench
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    kept = [copy / "runs" / n / "model.safetensors" for n in ("t", "s", "own")]
    before = {p: p.stat().st_mtime_ns for p in kept}
    result = run_nerkit("bench", "--matrix", matrix, "--out", copy, "--resume", "--jobs", "2")
    assert result.returncode == 1, result.stderr
    assert {p: p.stat().st_mtime_ns for p in kept} == before
    assert result.stderr.count("skipped, recorded as ok") == 3
    assert read_records(copy)["orphan"]["failed_teachers"] == ["broken"]  # its teacher ran again, failed again


def fake_execute(calls: list):
    """`runner.execute` that records the order runs start and end in; runs named `bad*` fail."""
    import nerkit.tools.bench.runner as runner

    def execute(run, out, predict_batch_size, base, previous=None):
        calls.append(f"start {run.name}")
        record = {**runner.run_record(run, base), "status": "ok", "encoder": "bilstm", "test": None,
                  "dev": {"f1": 0.5, "precision": 0.5, "recall": 0.5}, "wall_s": 1.0, "pretrained": False,
                  "train_chars_per_s_steady": 1.0, "predict_chars_per_s": 1.0, "parameters": 1,
                  "epochs": 1, "stopped": None, "peak_rss_mib": 1.0}
        if run.name.startswith("bad"):
            record = {**runner.run_record(run, base), "status": "failed", "error": "broken"}
        calls.append(f"end {run.name}")
        return record
    return execute


def test_with_jobs_a_student_waits_for_its_teachers_and_one_of_a_failed_teacher_is_not_run(tmp_path, monkeypatch):
    import nerkit.tools.bench.runner as runner

    calls: list = []
    monkeypatch.setattr(runner, "execute", fake_execute(calls))
    text = write_text(tmp_path / "text.txt", ["一二", "三四"])
    matrix = bench_matrix(tmp_path, [
        {"name": "student", "teachers": ["t1", "t2"], "text": [str(text)]},
        {"name": "t1"}, {"name": "t2", "teachers": ["t1"], "text": [str(text)]},
        {"name": "bad"}, {"name": "orphan", "teachers": ["bad"], "text": [str(text)]}])
    _, failed = runner.run_bench(matrix, tmp_path / "out", jobs=3)
    assert calls.index("end t1") < calls.index("start t2") < calls.index("end t2") < calls.index("start student")
    assert "start orphan" not in calls and failed == 2
    assert "teacher bad failed" in read_records(tmp_path / "out")["orphan"]["error"]


def test_only_a_student_also_runs_its_teachers_unless_their_models_are_there(tmp_path, monkeypatch):
    import nerkit.tools.bench.runner as runner

    calls: list = []
    monkeypatch.setattr(runner, "execute", fake_execute(calls))
    text = write_text(tmp_path / "text.txt", ["一二", "三四"])
    matrix = bench_matrix(tmp_path, [{"name": "t"}, {"name": "other"},
                                     {"name": "s", "teachers": ["t"], "text": [str(text)]}])
    runner.run_bench(matrix, tmp_path / "out", only=["s"])
    assert calls == ["start t", "end t", "start s", "end s"]
    calls.clear()
    (tmp_path / "out" / "runs" / "t").mkdir(parents=True)
    (tmp_path / "out" / "runs" / "t" / "model.safetensors").write_bytes(b"")
    runner.run_bench(matrix, tmp_path / "out", only=["s"])
    assert calls == ["start s", "end s"]  # t's model from the earlier session teaches


@pytest.mark.parametrize("teachers, line, words", [
    (["nosuch"], 6, "teacher 'nosuch' is no run of the matrix"),
    (["a"], 6, "run a names itself as its teacher"),
    (["b"], 6, "teachers: form a cycle: a -> b -> a"),
])
def test_bad_teachers_is_one_line_naming_the_matrix_file_and_line(tmp_path, monkeypatch, capfd, teachers, line,
                                                                    words):
    from helpers import run_cli

    text = write_text(tmp_path / "text.txt", ["一二", "三四"])
    matrix = bench_matrix(tmp_path, [{"name": "a", "teachers": teachers, "text": [str(text)]},
                                     {"name": "b", "teachers": ["a"], "text": [str(text)]}])
    result = run_cli(monkeypatch, capfd, "bench", "--matrix", matrix, "--out", tmp_path / "out")
    assert result.returncode == 2
    assert result.stderr.startswith(f"nerkit: error: {matrix}:{line}: ") and words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("run, words", [
    ({"text": ["x.txt"]}, "text is for a student"),
    ({"teachers": ["t"]}, "a student needs unlabelled text"),
    ({"teachers": ["t"], "text": ["x.txt"], "nproc": 2}, "trains in one process"),
    ({"teachers": ["t"], "text": "x.txt"}, "must be a list of text files"),
])
def test_a_student_entry_is_checked(tmp_path, run, words):
    from nerkit.tools.bench import load_matrix

    matrix = bench_matrix(tmp_path, [{"name": "t"}, {"name": "s", **run}])
    with pytest.raises(UserError, match=words):
        load_matrix(matrix)


def test_a_distilled_run_resumes_only_under_distillation_and_a_plain_one_only_without(teacher, tmp_path):
    from nerkit.tools.distill import distill
    from nerkit.training.loop import train

    text = write_text(tmp_path / "text.txt", lines_of(TINY_TRAIN)[:10])
    distill(student_config(tmp_path, "train.epochs=1"), [teacher], [text], tmp_path / "student")
    with pytest.raises(UserError, match="started by nerkit distill") as info:
        train(student_config(tmp_path, "train.epochs=2"), out=tmp_path / "student", resume=True)
    assert "nerkit distill" in info.value.fix
    train(student_config(tmp_path, "train.epochs=1"), out=tmp_path / "plain")
    with pytest.raises(UserError, match="started without distillation"):
        distill(student_config(tmp_path, "train.epochs=2"), [teacher], [text], tmp_path / "plain", resume=True)
