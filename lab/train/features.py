"""The target's hidden states at every position of a regenerated set, computed once and cached in
fp16 under .cache/features/ in chunks of CHUNK sequences (an interrupted run resumes), keyed by the
data, a fingerprint of the target's weights and the layers, so training never runs the target."""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..artifacts import atomic_write, repo_path, write_json
from ..data import RegenSet
from ..errors import LabError
from ..paths import CACHE_DIR
from ..target.load import load_target

CHUNK = 64             # sequences per feature-cache file


@dataclass
class FeatureSet:
    """fp16 features [positions, F] of every sequence of a RegenSet, in order, memory-mapped: a cache
    larger than memory works and a training process reads only the sequences it samples."""
    chunks: list[np.ndarray]
    offsets: np.ndarray
    folder: Path | None = None
    compute_seconds: float = 0.0   # what computing the cached chunks cost (as recorded)
    untimed_chunks: int = 0        # chunks with no recorded timing

    def __getitem__(self, i: int) -> np.ndarray:
        base = self.offsets[i // CHUNK * CHUNK]
        return self.chunks[i // CHUNK][self.offsets[i] - base: self.offsets[i + 1] - base]


def _key(target, data: RegenSet, layers: tuple[int, ...]) -> str:
    """Cache folder name: which data, which target (a fingerprint of its weights), which layers."""
    weights = target.model.layers[-1].mlp.down_proj.weight[:4].detach().float().cpu().numpy().tobytes()
    digest = hashlib.sha1(data.tokens.tobytes() + data.offsets.tobytes() + weights).hexdigest()[:12]
    return f"{digest}_layers{'-'.join(map(str, layers))}"


@torch.inference_mode()
def target_features(target, data: RegenSet, layers: tuple[int, ...], batch: int = 8,
                    progress: bool = True) -> FeatureSet:
    """The target's hidden states at `layers` (transformers' indexing: N the normed top feature) at
    every position of `data`, cached; LabError before any work if the disk cannot hold them."""
    folder = CACHE_DIR / "features" / _key(target, data, layers)
    n = len(data.offsets) - 1
    need = int(data.offsets[-1]) * len(layers) * target.config.hidden_size * 2  # fp16 bytes
    missing = need - sum(p.stat().st_size for p in folder.glob("chunk_*.npy")) if folder.exists() else need
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if missing > free:
        raise LabError(f"the feature cache needs {missing / 1e9:.1f} GB more at {folder}, only {free / 1e9:.1f} GB "
                       "are free: free disk space or set LAB_CACHE to a bigger disk")
    if progress:
        print(f"[lab] target features of layers {layers}: {need / 1e9:.2f} GB in {repo_path(folder)}", file=sys.stderr)
    chunks = []
    timing_path = folder / "seconds.json"  # compute seconds per chunk, for the manifests' budgets
    timing = json.loads(timing_path.read_text()) if timing_path.exists() else {}
    for c, start in enumerate(tqdm(range(0, n, CHUNK), desc="target features", unit="chunk", disable=not progress)):
        path = folder / f"chunk_{c:05d}.npy"
        if not path.exists():
            began = time.perf_counter()
            members = sorted(range(start, min(start + CHUNK, n)), key=lambda i: data.offsets[i + 1] - data.offsets[i])
            rows = {}
            for b in range(0, len(members), batch):  # similar lengths batched together: little padding
                seqs = [data.ids(i) for i in members[b: b + batch]]
                width = max(len(s) for s in seqs)
                ids = torch.zeros(len(seqs), width, dtype=torch.long)
                mask = torch.zeros(len(seqs), width, dtype=torch.long)
                for r, s in enumerate(seqs):  # right padding: causal attention leaves real positions exact
                    ids[r, : len(s)], mask[r, : len(s)] = torch.from_numpy(s), 1
                out = target.model(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                   output_hidden_states=True)
                h = torch.cat([out.hidden_states[layer] for layer in layers], -1).half().cpu().numpy()
                rows.update({i: h[r, : len(s)] for r, (i, s) in enumerate(zip(members[b: b + batch], seqs))})
            rows = [rows[i] for i in sorted(rows)]
            atomic_write(path, lambda tmp, rows=rows: np.save(open(tmp, "wb"), np.concatenate(rows)))
            timing[path.name] = round(time.perf_counter() - began, 2)
            write_json(timing_path, timing)
        chunks.append(np.load(path, mmap_mode="r"))
    return FeatureSet(chunks, data.offsets.astype(np.int64), folder, sum(timing.values()), len(chunks) - len(timing))


def source_features(target, sources: list[RegenSet], layers: tuple[int, ...], reply_dtype: str = "float32",
                    progress: bool = True) -> list[FeatureSet]:
    """`target_features` per source: the regenerated set's from `target`, ShareGPT replies' from a
    copy in `reply_dtype`."""
    models = [target if s == 0 or reply_dtype == "float32" else load_target(reply_dtype).to(target.device)
              for s in range(len(sources))]
    return [target_features(m, source, layers, progress=progress) for m, source in zip(models, sources)]
