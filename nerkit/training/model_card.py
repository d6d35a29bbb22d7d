"""The model card: README.md in a model directory, written when training finishes, as Hugging Face
and spaCy users expect one. It says what the model was trained on (the data files, their sizes and
checksums), how well it does (the scores of metrics.json), the config's key choices, and the licence
of every pretrained part (language models, vectors, the lexicon), which the weights fall under."""

from __future__ import annotations

import os
from pathlib import Path

from nerkit.config import Config
from nerkit.data.splits import Splits
from nerkit.files import atomic_write_text
from nerkit.model.encoders import ENCODERS
from nerkit.pretrained.licences import JIEBA_LICENCE, file_terms, model_terms
from nerkit.training.build import vector_files
from nerkit.version import __version__

MODEL_CARD = "README.md"


def write_model_card(out: Path, config: Config, metrics: dict, splits: Splits) -> None:
    """Write OUT/README.md from the finished run (its lm/ already written, whose terms it reads)."""
    parts = ["---", "library_name: nerkit", "language: zh", "tags: [token-classification, named-entity-recognition]",
             "---", "",
             f"# {config.encoder.name} NER model ({', '.join(splits.types)})", "",
             f"Trained with nerkit {__version__} (`nerkit train`); use it with `nerkit predict --model DIR`, "
             "`nerkit serve DIR` or `nerkit.load(DIR)`. The whole resolved config is `config.yaml`, every "
             "figure `metrics.json`.", ""]
    for section in (_scores(metrics), _data(config, splits), _choices(config), _licences(out, config)):
        parts += section + [""]
    atomic_write_text(out / MODEL_CARD, "\n".join(parts))


def _scores(metrics: dict) -> list[str]:
    lines = ["## Scores", "", "Entity-level, exact match (as conlleval). Test is scored once, with the epoch "
             f"dev chose ({metrics.get('best_epoch')} of {metrics.get('epochs')}, stopped by {metrics.get('stopped')}).",
             "", "| split | precision | recall | F1 |", "|---|---|---|---|"]
    per_type: dict = {}
    for split in ("dev", "test"):
        if split in metrics:
            m = metrics[split]
            lines.append(f"| {split} | {100 * m['precision']:.2f} | {100 * m['recall']:.2f} | {100 * m['f1']:.2f} |")
            per_type = m.get("per_type", per_type)
    if per_type:
        lines += ["", "Per type, on the last split above:", "", "| type | precision | recall | F1 | support |",
                  "|---|---|---|---|---|"]
        lines += [f"| {t} | {100 * m['precision']:.2f} | {100 * m['recall']:.2f} | {100 * m['f1']:.2f} | {m['support']} |"
                  for t, m in per_type.items()]
    return lines


def _data(config: Config, splits: Splits) -> list[str]:
    dc = config.data
    sizes = {"train": len(splits.train), "dev": len(splits.dev), "test": len(splits.test or [])}
    lines = ["## Data", "", f"Tag scheme {splits.scheme.upper()}, entity types {', '.join(splits.types)}.", "",
             "| split | file | bytes | sentences | sha256 |", "|---|---|---|---|---|"]
    for split, path in (("train", dc.train), ("dev", dc.dev), ("test", dc.test)):
        if path:
            size = f"{os.path.getsize(path):,}" if os.path.isfile(path) else "?"
            lines.append(f"| {split} | `{Path(path).name}` | {size} | {sizes[split]:,} | "
                         f"`{splits.checksums.get(split, '?')}` |")
        elif split == "dev":
            lines.append(f"| dev | carved from train (data.dev_split {dc.dev_split}, seed {dc.split_seed}) | | "
                         f"{sizes['dev']:,} | |")
    return lines


def _choices(config: Config) -> list[str]:
    emb, tc = config.embeddings, config.train
    lm = [f"`{Path(s.path).name}` ({'fine-tuned' if s.finetune else 'frozen'}, layers {s.layers})"
          for s in emb.lm_sources()]
    lines = ["## Configuration", "",
             f"- encoder: `{config.encoder.name}`; tag scheme: {config.data.scheme}",
             f"- tables: characters {emb.char_dim}, bigrams {emb.bichar_dim}"
             + (f", lexicon words {emb.word_dim}" if ENCODERS[config.encoder.name].uses_lattice else ""),
             f"- language model: {', '.join(lm) if lm else 'none'}",
             f"- training: {tc.epochs} epochs, batch {tc.batch_size}, learning rate {tc.lr:g}, seed {tc.seed}"]
    if ENCODERS[config.encoder.name].uses_lattice:
        lines.append(f"- lexicon: `{config.lexicon.source}`")
    return lines


def _licences(out: Path, config: Config) -> list[str]:
    """Every pretrained part and its licence: the LMs as lm/ carries them, vector files, the lexicon."""
    rows = [("language model", t["model"], t["licence"] + (f"; {t['terms']}" if t["terms"] and t["terms"] != t["licence"]
                                                            else "")) for t in model_terms(out)]
    lattice = ENCODERS[config.encoder.name].uses_lattice
    for kind, path in vector_files(config, lattice).items():
        rows.append((f"{kind} vectors", Path(path).name, file_terms(path).said()))
    if lattice:
        source = config.lexicon.source
        rows.append(("lexicon", source, JIEBA_LICENCE if source == "jieba" else file_terms(source).said()))
    lines = ["## Licences", ""]
    if not rows:
        return lines + ["No pretrained part: every weight was learnt from the data above, whose terms apply."]
    lines += ["The weights hold what they took from these parts and fall under their terms as well as the "
              "data's. A language model's upstream licence files and model card are carried in `lm/`.", "",
              "| part | what | licence |", "|---|---|---|"]
    return lines + [f"| {part} | `{what}` | {licence} |" for part, what, licence in rows]
