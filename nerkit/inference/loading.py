"""Which runtime a model directory asks for: nerkit.json's `runtime` is `torch` for a directory that
`nerkit train` wrote (nerkit.inference.pipeline) and `onnx` for one that `nerkit export` wrote
(nerkit.inference.onnx_runtime, which never imports torch). `nerkit.load`, `nerkit predict`, `nerkit
eval` and their worker processes load through `load_pipeline`."""

from __future__ import annotations

from pathlib import Path

from nerkit.errors import UserError
from nerkit.inference.model_dir import META_FILE, ModelDir


def require_runtime(directory: str | Path, wanted: str) -> None:
    """`--runtime`: `auto` runs a directory on what it asks for; `torch` or `onnx` also checks that it
    asks for that one, so that a script that means to run on onnxruntime (without torch) fails at once
    on the wrong directory instead of running it on the other runtime."""
    directory = Path(directory)
    if wanted == "auto" or not (directory / META_FILE).is_file():  # no nerkit.json: loading says what is wrong
        return
    found = ModelDir.read(directory).runtime
    if found == wanted:
        return
    if wanted == "onnx":
        raise UserError(f"--runtime onnx: this is a PyTorch model directory (nerkit.json: runtime {found}), "
                        "not an ONNX export", where=str(directory),
                        fix=f"nerkit export --model {directory} --format onnx --out DIR, then --model DIR "
                            "(or --runtime torch)")
    raise UserError(f"--runtime {wanted}: this is an ONNX export (nerkit.json: runtime {found}), which runs "
                    "on onnxruntime only", where=str(directory),
                    fix="give the model directory it was exported from, or --runtime onnx")


def load_pipeline(directory: str | Path, device: str = "cpu", threads: int | None = None, lanes: bool = True):
    """The directory's pipeline: an `OnnxPipeline` for an export, else a `Pipeline`. `threads`: the
    threads of the runtime (0: nerkit's default, the cores found free; None: torch's setting is left
    as it is); an export spends them on batches read at once unless `lanes` is False (then on
    each batch, as torch does: nerkit.inference.onnx_runtime)."""
    found = ModelDir.read(directory)  # read once: the pipeline is built from it
    if found.is_export:
        from nerkit.inference.onnx_runtime import OnnxPipeline

        return OnnxPipeline.load(found, device, threads or 0, lanes)
    if threads is not None:
        from nerkit.device import set_threads

        set_threads(threads)
    from nerkit.inference.pipeline import Pipeline

    return Pipeline.load(found, device=device)
