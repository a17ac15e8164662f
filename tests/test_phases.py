"""The inspector's four phases checked against independent captures of the decoding, not against the
recorder's own fields: the mask the engine received (a hook on its scoring call), the verdicts
recomputed by the reference rules from the recorded uniforms and the captured logits, and the engine's
compaction indices (a hook on its `keep`), for greedy and sampled cycles of a draft tree."""
import re

import pytest
import torch

from lab.data import chat_ids
from lab.decode import decode
from lab.drafters import TreeModelDraft
from lab.sampling import Sampling, probabilities
from lab.target.engine import Engine
from lab.target.load import make_draft
from lab.verify.lossless import argmax_rows, children_of, verify_tree, verify_tree_greedy
from lab.viz.cycles import CycleRecorder
from lab.viz.phases import PHASES, checks, kept_rows, mask_html, phase_html, verify_html

PROMPT = "Name three colours of the sea."


def captured(tiny, tokenizer, sampling: Sampling):
    """Decode with a draft tree, recording the cycles and, beside them, what the engine itself was
    given: each tree forward's mask and logits, and each `keep`'s start and indices."""
    engine, forwards, keeps = Engine(tiny), [], []
    forward, keep = engine.forward, engine.keep

    def scoring(tokens, mask=None, **kwargs):
        scored = forward(tokens, mask=mask, **kwargs)
        if mask is not None:  # a tree's scoring call (the prefill and chains have none)
            forwards.append((mask.clone(), scored.logits.float().clone()))
        return scored

    def compaction(start, indices):
        keeps.append((start, list(indices)))
        keep(start, indices)
    engine.forward, engine.keep = scoring, compaction
    recorder = CycleRecorder(sampling)
    drafter = TreeModelDraft(make_draft(tiny, 1), depth=3, top_k=3, total_tokens=8)
    decode(engine, drafter, chat_ids(tokenizer, PROMPT), 24, sampling, 3, 5, None, kernel="torch", on_cycle=recorder)
    assert len(recorder.records) == len(forwards) == len(keeps) > 2
    return recorder.records, forwards, keeps


def recomputed_verdicts(record, logits: torch.Tensor, sampling: Sampling) -> dict[int, bool]:
    """node -> accepted, from the captured logits and the recorded uniforms alone: greedy, the child
    that is the target's argmax; sampled, u * m < p(x) with m what the rejected earlier siblings left."""
    tree, verdicts = record.tree, {}
    if sampling.greedy:
        best = argmax_rows(logits)
        for c in checks(record):
            verdicts[c.node] = tree.tokens[c.node] == best[tree.parents[c.node]]
        return verdicts
    p = probabilities(logits, sampling)
    for node in record.path:
        mass = 1.0
        for child in children_of(tree.parents)[node]:
            prob = float(p[node, tree.tokens[child]])
            verdicts[child] = record.uniforms[child] * mass < prob
            if verdicts[child]:
                break
            mass -= prob
    return verdicts


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(1.0)], ids=["greedy", "sampled"])
def test_the_phases_match_what_the_engine_received_and_the_rules_decide(tiny, tokenizer, sampling):
    records, forwards, keeps = captured(tiny, tokenizer, sampling)
    for record, (mask, logits), (start, indices) in zip(records, forwards, keeps):
        # the mask phase: row i has a ■ in exactly the columns the engine let node i attend to
        drawn = re.findall(r'<tr data-node="(\d+)">(.*?)</tr>', mask_html(record, tokenizer))
        assert [(int(i), row.count("■")) for i, row in drawn] == [(i, int(mask[i].sum())) for i in range(len(mask))]
        assert all("■" not in cell or mask[int(i), j] for i, row in drawn
                   for j, cell in enumerate(re.findall(r"<td[^>]*>(.*?)</td>", row)))
        # the verify phase: every verdict it shows is the one the reference rule gives
        verdicts = recomputed_verdicts(record, logits, sampling)
        shown = {c.node: c.verdict == "accepted" for c in checks(record)}
        assert shown == {n: v for n, v in verdicts.items() if n in shown} and (shown or len(record.tree) == 1)
        reference = (verify_tree_greedy(record.tree.tokens, record.tree.parents, argmax_rows(logits)) if sampling.greedy
                     else verify_tree(record.tree.tokens, record.tree.parents, probabilities(logits, sampling),
                                      torch.tensor(record.uniforms), torch.ones(logits.shape[-1])))
        assert [n for n, v in shown.items() if v] == reference.path[1:]
        # the commit phase: the rows kept are the engine's compaction indices
        assert kept_rows(record) == [start + i for i in indices]
        assert f"<b class='lab-kept'>{kept_rows(record)}</b>" in phase_html("commit", record, tokenizer)
        for phase in PHASES:
            assert phase_html(phase, record, tokenizer).startswith(f'<div class="lab-phase {phase}"')
    # the comparison can fail: a rejected node's uniform set to 0 would have passed
    rejected = next((r, c) for r in records for c in checks(r) if c.verdict == "rejected")
    if not sampling.greedy:
        record, check = rejected
        index = records.index(record)
        record.uniforms[check.node] = 0.0
        assert recomputed_verdicts(record, forwards[index][1], sampling)[check.node] != (check.verdict == "accepted")


def test_a_sampled_correction_shows_the_residual_it_was_drawn_from(tiny, tokenizer):
    """The residual's top tokens exclude every rejected draft, and their mass is a distribution's."""
    records, _, _ = captured(tiny, tokenizer, Sampling(1.0))
    corrected = [r for r in records if r.last == "corrected"]
    assert corrected
    for record in corrected:
        rejected = {record.tree.tokens[c] for c in children_of(record.tree.parents)[record.path[-1]]}
        assert record.residual and not rejected & {t for t, _ in record.residual}
        assert 0 < sum(v for _, v in record.residual) <= 1 + 1e-6
        assert "drawn from the residual" in verify_html(record, tokenizer)
