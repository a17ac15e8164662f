"""Draft-head files under data/eagle: one path, save, load and manifest reader for every head kind.
A head file is fp16 safetensors of the head's own tensors, with metadata naming its kind (`variant`:
eagle1, no-token, token-only, eagle3 or medusa), its target and its shapes, so a caller names a
head, never its kind. Its manifest (NAME.json) has the command, data, budget and held-out figures."""
from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from ..artifacts import atomic_write
from ..errors import LabError
from ..paths import DATA_DIR, EAGLE3_SHIPPED
from .eagle1 import VARIANTS, EagleHead
from .eagle3 import Eagle3Head
from .medusa import MedusaHeads

HEAD_DIR = DATA_DIR / "eagle"
KINDS = (*VARIANTS, "eagle3", "medusa")
Head = EagleHead | Eagle3Head | MedusaHeads


def head_path(name: str) -> Path:
    """data/eagle/NAME.safetensors"""
    return HEAD_DIR / f"{name}.safetensors"


def rebuild_command(name: str, kind: str | None = None) -> str:
    """The command that makes the head file `name` of `kind` (the shipped EAGLE-3 head takes two
    stages; an unknown kind names both trainers)."""
    if name == EAGLE3_SHIPPED:
        return "make run E=eagle3-full"
    if kind in ("eagle3", "medusa"):
        return f"python -m lab train {kind} --name {name}"
    if kind in VARIANTS:
        return f"python -m lab train eagle1 --variant {kind} --name {name}"
    return f"python -m lab train eagle1 --name {name}` or `python -m lab train eagle3 --name {name}"


def head_kind(path: Path) -> str | None:
    """The kind a head file's metadata names, None for a file without one."""
    with safe_open(str(path), "pt") as f:
        return (f.metadata() or {}).get("variant")


def head_names(kind: str | None = None) -> list[str]:
    """The head files under data/eagle, by name; with `kind`, those of that kind only."""
    return sorted(p.stem for p in HEAD_DIR.glob("*.safetensors") if kind is None or head_kind(p) == kind)


def save_head(head: Head, path: Path) -> None:
    """The head's own tensors as fp16 safetensors (`vocab` stays int64), with its metadata."""
    state = {k: (v if k == "vocab" else v.detach().half()).contiguous() for k, v in head.own_state().items()}
    atomic_write(path, lambda tmp: save_file(state, str(tmp), metadata=head.metadata()))


def load_head(target, name: str | None = None, path: Path | None = None) -> Head:
    """The head data/eagle/NAME.safetensors (or the file at `path`), of the kind its metadata names,
    tied to `target` (its embedding, and an EAGLE-1 head's LM head, are the target's). Raises
    LabError for a missing file or one made for another target or head shape."""
    path = path or head_path(name)
    if not path.exists():
        raise LabError(f"no head at {path}: run `{rebuild_command(path.stem)}`, or name one of "
                       f"{', '.join(head_names())}")
    with safe_open(str(path), "pt") as f:
        meta, state = f.metadata() or {}, {k: f.get_tensor(k) for k in f.keys()}
    kind = meta.get("variant")
    if kind == "eagle3" and "vocab" in state:
        head = Eagle3Head(target, state["vocab"], meta["taps"])
    elif kind == "medusa" and "vocab" in state and meta.get("heads", "").isdigit():
        head = MedusaHeads(target, state["vocab"], int(meta["heads"]))
    elif kind in VARIANTS:
        head = EagleHead(target, kind)
    else:
        raise LabError(f"{path} names no head kind in its metadata ({kind!r}): retrain it "
                       f"(`{rebuild_command(path.stem)}`)")
    expected = head.own_state()
    if (meta != head.metadata() or set(state) != set(expected)
            or any(state[k].shape != expected[k].shape for k in state)):
        raise LabError(f"{path} was trained for another target or head shape ({meta}): retrain it with "
                       f"`{rebuild_command(path.stem, kind)}`")
    head.load_state_dict({k: v if k == "vocab" else v.to(target.dtype) for k, v in state.items()}, strict=False)
    return head.eval()


def head_manifest(name: str) -> dict:
    """The manifest data/eagle/NAME.json."""
    path = head_path(name).with_suffix(".json")
    if not path.exists():
        raise LabError(f"no manifest at {path}: run `{rebuild_command(name)}`")
    return json.loads(path.read_text())


def check_head(name: str, kind: str, flag: str) -> None:
    """Raises a LabError naming the heads of `kind` there are, unless data/eagle/NAME.safetensors is
    one; the command line checks a head name so before loading anything."""
    path = head_path(name)
    found = head_kind(path) if path.exists() else None
    if found == kind:
        return
    heads = ", ".join(head_names(kind)) or "none"
    if path.exists():
        raise LabError(f"{flag} {name}: data/eagle/{path.name} is a head of kind {found}, not {kind}; "
                       f"the {kind} heads are {heads}")
    raise LabError(f"{flag} {name}: there is no data/eagle/{path.name}; the {kind} heads are {heads} "
                   f"(or train one: `python -m lab train {kind} --name {name}`)")


# ---- what a manifest says ----------------------------------------------------------------------

def rank_accuracy_of(manifest: dict) -> list[float]:
    """Per-rank depth-1 accuracy from a head's manifest, as the held-out evaluator
    (`lab.train.evaluate`) wrote it under "evaluation": it shapes the head's static trees."""
    figures = manifest.get("evaluation", {})
    if "rank_accuracy" not in figures or "evaluator_version" not in figures:
        raise LabError(f"{manifest['artifact']} has no held-out figures of the current evaluator: run "
                       f"`python -m lab evaluate {Path(manifest['artifact']).stem}`")
    return figures["rank_accuracy"]


def warm_start_chain(manifest: dict) -> list[dict]:
    """A head's manifest, then those of the heads it continued (`--init`), newest first."""
    chain, m = [], manifest
    while m is not None:
        chain.append(m)
        m = (m.get("init") or {}).get("manifest")
    return chain


def training_budget(manifest: dict) -> dict:
    """What a head cost in all: CPU and GPU minutes and steps summed over its warm-start chain, and
    the training tokens of its last stage, which kept the earlier stages' data."""
    chain = warm_start_chain(manifest)
    data = manifest["data"]
    return {"cpu_minutes": sum(m.get("cpu_budget_minutes", 0.0) for m in chain),
            "gpu_minutes": sum(m.get("gpu_budget_minutes", 0.0) for m in chain),
            "steps": sum(m["steps"] for m in chain), "stages": len(chain),
            "train_tokens": data["train_response_tokens"] + data.get("sharegpt_reply_tokens", 0)}
