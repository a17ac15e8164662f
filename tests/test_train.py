"""Draft distillation smoke test: a few steps on a tiny slice lower the loss; checkpoints
resume; the written draft loads back."""
import json

import numpy as np
import torch

from lab.data import RegenSet
from lab.target.load import make_draft, tiny_target
from lab.train.distill import _batch, _loss, train_draft
from lab.train.options import DraftOptions


def tiny_regen(n=12, length=40, seed=0):
    """A repetitive synthetic set (so a few steps can learn it): prompt 8 tokens, response 32."""
    rng = np.random.default_rng(seed)
    seqs = [np.tile(rng.integers(3, 60, size=4), length // 4).astype(np.uint16) for _ in range(n)]
    offsets = np.cumsum([0] + [len(s) for s in seqs])
    split = np.array([0, 0] + [1] * (n - 2), np.uint8)
    return RegenSet(np.concatenate(seqs), offsets, np.full(n, 8, np.int32), split)


def test_training_lowers_the_loss_and_round_trips(tmp_path, monkeypatch):
    import lab.train.distill as distill
    monkeypatch.setattr(distill, "CACHE_DIR", tmp_path)
    target, data = tiny_target(0), tiny_regen()
    before = make_draft(target, 1)
    batch = _batch(data.sequences("train")[:8], pad=2)
    with torch.no_grad():
        loss_before = _loss(before, *batch).item()
    out = train_draft(DraftOptions(layers=1, minutes=5, batch=4, lr=3e-3, max_steps=40), target=target, data=data,
                      out=tmp_path / "draft_1l.safetensors")
    manifest = json.loads(out.with_suffix(".json").read_text())
    assert manifest["steps"] == 40 and manifest["loss_last_20"] < manifest["loss_first_20"]
    from safetensors.torch import load_file
    after = make_draft(target, 1)
    after.load_state_dict({k: v.float() for k, v in load_file(out).items()}, strict=False)
    with torch.no_grad():
        assert _loss(after, *batch).item() < loss_before


def test_resume_continues_from_the_checkpoint(tmp_path, monkeypatch):
    import lab.train.checkpoint as checkpoint
    import lab.train.distill as distill
    monkeypatch.setattr(distill, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(checkpoint, "CHECKPOINT_SECONDS", 0)  # checkpoint after every step
    target, data = tiny_target(0), tiny_regen()
    out = tmp_path / "d.safetensors"
    ckpt = tmp_path / "checkpoints" / "d.pt"
    real_loss = distill._loss
    # an interrupted run: stop after 5 steps but keep the checkpoint as an interruption would
    monkeypatch.setattr(checkpoint.Checkpoint, "finish", lambda self: None)
    train_draft(DraftOptions(layers=1, minutes=5, batch=2, max_steps=5), target=target, data=data, out=out)
    assert torch.load(ckpt, weights_only=False)["progress"]["step"] == 5
    calls = []
    monkeypatch.setattr(distill, "_loss", lambda *a: calls.append(1) or real_loss(*a))
    train_draft(DraftOptions(layers=1, minutes=5, batch=2, max_steps=8, resume=True), target=target, data=data,
                out=out)
    manifest = json.loads(out.with_suffix(".json").read_text())
    assert manifest["steps"] == 8 and len(calls) == 3  # only steps 6..8 ran
    assert manifest["heldout_top1_agreement_before"] is None  # measured only on a fresh start


def test_checkpoint_of_another_shape_is_a_clear_error(tmp_path, monkeypatch):
    import pytest

    import lab.train.distill as distill
    from lab.errors import LabError
    monkeypatch.setattr(distill, "CACHE_DIR", tmp_path)
    ckpt = tmp_path / "checkpoints" / "d.pt"
    ckpt.parent.mkdir(parents=True)
    other = {"shape": {"n_layers": 2, "hidden": 64}, "model": {}, "optim": {}, "rng": None, "progress": {}}
    torch.save(other, ckpt)
    with pytest.raises(LabError, match="is for .*'n_layers': 2.* delete it or drop --resume"):
        train_draft(DraftOptions(layers=1, minutes=1, max_steps=1, resume=True), target=tiny_target(0),
                    data=tiny_regen(), out=tmp_path / "d.safetensors")
    torch.save({"n_layers": 1, "hidden": 64, "step": 3}, ckpt)  # a checkpoint from before this format
    with pytest.raises(LabError, match="older version of lab: delete it or drop --resume"):
        train_draft(DraftOptions(layers=1, minutes=1, max_steps=1, resume=True), target=tiny_target(0),
                    data=tiny_regen(), out=tmp_path / "d.safetensors")
