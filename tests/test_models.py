"""Model loading: the GGUF cache, the tiny target, the shipped drafts."""
import json
import shutil

import pytest
import torch

from lab.target.load import draft_path, load_draft, make_draft, tiny_target


def test_tiny_target_is_deterministic():
    a, b = tiny_target(3), tiny_target(3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.model.layers[0].mlp.up_proj.weight, tiny_target(4).model.layers[0].mlp.up_proj.weight)


def test_draft_shares_embedding_and_head(tiny):
    d = make_draft(tiny, 1)
    assert d.model.embed_tokens is tiny.model.embed_tokens and d.lm_head is tiny.lm_head
    assert torch.equal(d.model.layers[0].self_attn.q_proj.weight, tiny.model.layers[0].self_attn.q_proj.weight)


@pytest.mark.parametrize("layers", [1, 2, 4])
def test_shipped_drafts_load_and_have_manifests(target, layers):
    draft = load_draft(target, layers)
    assert len(draft.model.layers) == layers and draft.lm_head is target.lm_head
    manifest = json.loads(draft_path(layers).with_suffix(".json").read_text())
    for key in ("command", "commit", "steps", "wall_seconds", "loss_last_20", "heldout_top1_agreement", "data"):
        assert key in manifest
    assert manifest["heldout_top1_agreement"] > manifest["heldout_top1_agreement_before"]


def test_wrong_shape_draft_is_a_clear_error(target, tmp_path, monkeypatch):
    import lab.target.load as models

    from lab.errors import LabError
    shutil.copy(draft_path(1), tmp_path / "draft_2l.safetensors")  # a 1-layer draft under a 2-layer name
    monkeypatch.setattr(models, "DRAFT_DIR", tmp_path)
    with pytest.raises(LabError, match="does not fit"):
        load_draft(target, 2)


@pytest.mark.slow
def test_corrupt_cache_warns_once_and_is_rebuilt(tmp_path, monkeypatch, capsys):
    import lab.target.load as models

    from lab.paths import CACHE_DIR
    shutil.copytree(CACHE_DIR / "target", tmp_path / "target")
    monkeypatch.setattr(models, "CACHE_DIR", tmp_path)
    weights = next((tmp_path / "target").rglob("*.safetensors"))
    weights.write_bytes(b"not a safetensors file")
    model = models.load_target()
    err = capsys.readouterr().err
    assert sum("warning" in line for line in err.splitlines()) == 1
    assert model.config.num_hidden_layers == 30
    models.load_target()  # rebuilt: loads cleanly now
    assert "warning" not in capsys.readouterr().err
