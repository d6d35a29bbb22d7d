"""Weights on disk: reading a safetensors file, and loading a state dict into a module only after
checking that it fits (every tensor there, none left over, every shape equal), with one message
that names what does not fit. The model directory, the checkpoint, Hugging Face LMs and LAC all load
through here."""

from __future__ import annotations

from pathlib import Path

from nerkit.errors import UserError


def read_safetensors(path: str | Path, fix: str, error: type[UserError] = UserError) -> dict:
    """The tensors of `path` on the CPU; a missing or damaged file is `error` naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise error(f"{path.name} not found", where=str(path.parent), fix=fix)
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        gist = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise error(f"{path.name} cannot be read ({gist})", where=str(path), fix=fix) from None


def fit_problems(expected: dict, state: dict, extra_ok: bool = False) -> list[str]:
    """What keeps `state` from loading into a module whose state dict is `expected`: missing tensors,
    tensors the module has no place for (unless `extra_ok`), and shapes that differ; [] if it fits."""
    missing = [k for k in expected if k not in state]
    extra = [] if extra_ok else [k for k in state if k not in expected]
    wrong = [f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in expected.items()
             if k in state and tuple(state[k].shape) != tuple(v.shape)]
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensors missing (e.g. {', '.join(missing[:3])})")
    if extra:
        problems.append(f"{len(extra)} tensors the model has no place for (e.g. {', '.join(extra[:3])})")
    if wrong:
        problems.append(f"{len(wrong)} shapes differ (e.g. {', '.join(wrong[:3])})")
    return problems


def load_checked(module, state: dict, mismatch: str, where: str, fix: str, extra_ok: bool = False,
                 error: type[UserError] = UserError) -> None:
    """Load `state` into `module` if it fits, else `error`: "`mismatch`: what does not fit"."""
    problems = fit_problems(module.state_dict(), state, extra_ok)
    if problems:
        raise error(f"{mismatch}: {'; '.join(problems)}", where=where, fix=fix)
    expected = module.state_dict()
    module.load_state_dict({k: state[k] for k in expected})
