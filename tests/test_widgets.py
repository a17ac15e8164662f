"""The draft-tree inspector without a browser: its state after each interaction (slider, method,
temperature, budget, clicks), on the tiny target with untrained drafts and heads; and the
recorder's explanations, checked against what verification actually decided."""
import math
import re

import pytest
import torch

from lab.bench import Setup
from lab.costmodel import load_choice
from lab.data import chat_ids
from lab.decode import decode
from lab.drafters import EagleDraft, ModelDraft, NoDraft, ReferenceDraft, TreeModelDraft
from lab.drafters.eagle1 import EagleHead
from lab.drafters.eagle3 import Eagle3Head
from lab.drafters.medusa import MedusaHeads
from lab.errors import LabError
from lab.sampling import Sampling
from lab.target.engine import Engine
from lab.target.load import make_draft
from lab.verify.lossless import children_of
from lab.viz.cycles import CycleRecorder, node_details, node_states, visible_text
from lab.viz.drawing import cycle_svg, foldable
from lab.viz.inspector import DraftTreeInspector
from lab.viz.phases import drafted_depth, drafting_html

PROMPT = "Name three colours of the sea."


@pytest.fixture(scope="module")
def setup(tiny, tokenizer):
    """Every model the inspector's methods need, tiny and untrained; no tree, so the inspector
    takes the shipped tuning's."""
    torch.manual_seed(0)
    return Setup(tiny, make_draft(tiny, 1), tokenizer, Sampling(), 0, 0, 0, head=EagleHead(tiny).eval(),
                 rank_accuracy=[0.6, 0.2, 0.1, 0.05],
                 head3=Eagle3Head(tiny, torch.arange(0, tiny.config.vocab_size, 7)).eval(),
                 rank_accuracy3=[0.5, 0.2, 0.1])


def inspector(setup, **kwargs) -> DraftTreeInspector:
    return DraftTreeInspector(PROMPT, setup=setup, max_new_tokens=kwargs.pop("max_new_tokens", 16), **kwargs)


def drawn_nodes(view: DraftTreeInspector) -> int:
    return view.view.svg.count('<g class="node ')


def test_it_starts_on_cycle_0_of_the_shipped_tree(setup):
    view = inspector(setup)
    shipped = load_choice()
    assert (view.depth_slider.value, view.top_k_slider.value, view.total_slider.value) == (
        shipped.depth, shipped.top_k, shipped.total_tokens)
    assert view.method_picker.value == "eagle2" and view.temperature_slider.value == 0.0
    assert len(view.records) == view.result.cycles and view.cycle_slider.max == view.result.cycles
    assert view.cycle_slider.value == 1 and view.play.max == view.cycle_slider.max
    assert [t for r in view.records for t in r.emitted] == view.result.tokens
    assert view.expanded == [] and view.selected == -1
    assert view.view.svg.startswith("<svg") and drawn_nodes(view) >= 2  # the root and the target's own token
    assert 'class="edge path"' in view.view.svg  # the path ends in the target's token even if nothing passed
    assert "cycle 1 of" in view.summary.value and "eagle2" in view.summary.value
    assert "τ = " in view.text.value and "tokens/s" in view.text.value


def test_moving_the_cycle_slider_redraws_that_cycle_and_resets_folding(setup):
    view = inspector(setup, tree=(3, 3, 12), max_new_tokens=24)
    view.click(0)
    assert view.selected == 0
    last = view.cycle_slider.max
    view.cycle_slider.value = last
    assert view.record is view.records[-1]
    assert view.view.svg == cycle_svg(view.records[-1], setup.tokenizer)
    assert view.selected == -1 and view.expanded == []
    assert f"cycle {last} of {len(view.records)}" in view.summary.value
    assert view.play.value == last  # play and the slider are one value
    view.play.value = 1
    assert view.cycle_slider.value == 1 and view.record is view.records[0]


def test_changing_the_method_decodes_again_with_its_drafter(setup):
    view = inspector(setup)
    view.cycle_slider.value = view.cycle_slider.max
    view.method_picker.value = "sd"
    assert view.cycle_slider.value == 1 and "<b>sd</b>" in view.summary.value
    assert all(r.chain and r.tree.parents == list(range(-1, len(r.tree) - 1)) for r in view.records)
    assert view.top_k_slider.disabled and view.total_slider.disabled  # a chain has only a length
    view.method_picker.value = "eagle1"
    assert view.top_k_slider.disabled and not view.total_slider.disabled  # a static shape: no top-k
    assert not any(r.chain for r in view.records)
    for method in ("sd-tree", "eagle3"):
        view.method_picker.value = method
        assert not view.top_k_slider.disabled and not view.total_slider.disabled
        assert [t for r in view.records for t in r.emitted] == view.result.tokens


def test_the_tree_budget_bounds_every_drafted_tree(setup):
    view = inspector(setup)
    view.depth_slider.value, view.top_k_slider.value, view.total_slider.value = 3, 2, 6
    for record in view.records:
        tree = record.tree
        assert len(tree) <= 6 and max(tree.depths()) <= 3
        assert max(len(c) for c in children_of(tree.parents)) <= 2
    view.method_picker.value = "sd"
    assert max(len(r.tree) for r in view.records) == 4  # a chain of 3 drafts after the root


def test_stepping_walks_the_four_phases_then_the_next_cycle(setup):
    """One step at a time: drafting level by level, the mask, verification, the commit, then cycle 2's
    drafting; each view draws its own phase of the cycle on show."""
    view = inspector(setup, method="sd-tree")
    view.depth_slider.value = 3
    deepest = drafted_depth(view.record)
    seen = []
    for _ in range(deepest + 3):
        view.step()
        seen.append((view.view_picker.value, view.level, view.cycle_slider.value))
    assert seen == ([("drafting", level, 1) for level in range(1, deepest + 1)]
                    + [("mask", deepest, 1), ("verify", deepest, 1), ("commit", deepest, 1)])
    for phase in ("drafting", "mask", "verify", "commit"):
        view.view_picker.value = phase
        assert view.view.svg.startswith(f'<div class="lab-phase {phase}"')
    view.step()
    assert (view.view_picker.value, view.level, view.cycle_slider.value) == ("drafting", 1, 2)
    # the keys the tree view reports: ArrowLeft retraces the steps, ArrowRight redoes them, T toggles the tree
    view._message({"key": "ArrowLeft"})
    assert (view.view_picker.value, view.cycle_slider.value) == ("commit", 1)
    for want in reversed(seen[:-1]):
        view._message({"key": "ArrowLeft"})
        assert (view.view_picker.value, view.level, view.cycle_slider.value) == want
    view._message({"key": "ArrowRight"})
    assert view.view_picker.value == seen[1][0] and view.level == seen[1][1]
    view._message({"key": "t"})
    assert view.view_picker.value == "tree" and view.view.svg.startswith("<svg")


def test_a_typed_prompt_decodes_and_the_projector_enlarges_every_label(setup):
    view = inspector(setup, method="pld")
    view.prompt_box.value = "Repeat after me: the sea, the sea, the sea."
    view.decode_button.click()
    assert view.prompt_ids == chat_ids(setup.tokenizer, view.prompt_box.value)
    assert len(view.result.tokens) == 16 and "<b>pld</b> at temperature" in view.summary.value
    view.projector.value = True
    assert view.controls.selected_index is None  # the controls fold away
    sizes = [int(s) for s in re.findall(r'font-size="(\d+)"', view.view.svg)]
    sizes += [int(s) for s in re.findall(r"font-size:(\d+)px", view.summary.value + view.text.value)]
    assert sizes and min(sizes) >= 18
    view.projector.value = False
    assert view.controls.selected_index == 0
    assert min(int(s) for s in re.findall(r'font-size="(\d+)"', view.view.svg)) < 18
    view.method_picker.value = "lookahead"
    assert view.records and view.result.tokens
    view.setup.medusa = MedusaHeads(setup.target, torch.arange(0, setup.target.config.vocab_size, 3))  # untrained
    view.total_slider.value = 5
    view.method_picker.value = "medusa"  # a static tree of 5 tokens, shaped by the shipped heads' accuracy
    assert view.records and all(len(r.tree) <= 5 for r in view.records)


def test_side_by_side_aligns_two_methods_by_output_position(setup):
    from lab.viz.compare import SideBySide
    pair = SideBySide(PROMPT, ("sd", "sd-tree"), max_new_tokens=16, setup=setup)
    left, right = pair.sides
    assert left.result.tokens == right.result.tokens  # lossless at T = 0: the same text, cycle counts apart
    for token in range(1, 17):
        pair.position.value = token
        for side in pair.sides:  # the cycle on show produced that token
            before = sum(len(r.emitted) for r in side.records[: side.cycle_slider.value - 1])
            assert before < token <= before + len(side.record.emitted)
        assert f"{left.cycle_slider.value} target forwards" in pair.forwards.value
    assert pair.forwards.value.count("target forwards") == 2
    with pytest.raises(LabError, match="two methods"):
        SideBySide(PROMPT, ("sd",), setup=setup)


def test_a_saved_session_loads_without_decoding_and_exports_a_page(setup, tmp_path, monkeypatch):
    import lab.viz.inspector as module
    from lab.viz.session import export_html, load_session, save_session
    view = inspector(setup, method="sd-tree", temperature=1.0)
    path = save_session(view, tmp_path / "session.json")
    monkeypatch.setattr(module, "decode", lambda *a, **k: pytest.fail("a prepared session decoded again"))
    loaded = load_session(path, setup=setup)
    assert loaded.records == view.records and loaded.result.tokens == view.result.tokens
    assert (loaded.method_picker.value, loaded.temperature_slider.value) == ("sd-tree", 1.0)
    assert loaded.summary.value.split("tokens/s")[0] == view.summary.value.split("tokens/s")[0]
    page = export_html(loaded, tmp_path / "session.html").read_text()
    assert page.count("</script>") == 1 and '"drafting"' in page and '"commit"' in page
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(LabError, match="not a saved inspector session"):
        load_session(tmp_path / "other.json", setup=setup)


def test_background_decoding_shows_progress_and_cancel_keeps_the_cycles_on_show(setup, monkeypatch):
    import threading
    import lab.viz.inspector as module
    view = inspector(setup, method="sd", background=True)
    view.wait()
    assert view.records and view.progress.value == len(view.result.tokens) == 16 and view.cancel_button.disabled
    shown, started, calls = list(view.records), threading.Event(), []

    def endless(*args, on_tokens=None, **kwargs):  # a decoding that runs until it is cancelled
        started.set()
        while len(calls) < 100_000:
            calls.append(1)
            on_tokens([1], ["target"])
        pytest.fail("cancel never reached the decoding")
    monkeypatch.setattr(module, "decode", endless)
    view.decode_button.click()
    assert started.wait(10) and not view.cancel_button.disabled
    view.cancel_button.click()
    view.wait()
    assert view.records == shown and "decoding cancelled" in view.summary.value and view.cancel_button.disabled


def test_the_drafting_view_shows_what_reranking_cut(setup):
    """While inspecting, a dynamic drafter keeps each tree before reranking; reranking that tree gives the
    tree decoded, and the deepest drafting view strikes out exactly the candidates it cut. Outside the
    inspector nothing is kept."""
    from lab.trees import rerank
    view = inspector(setup, method="sd-tree")
    view.depth_slider.value, view.top_k_slider.value, view.total_slider.value = 3, 3, 6
    cuts = []
    for record in view.records:
        again = rerank(record.expanded, len(record.tree))
        assert (again.tokens, again.parents) == (record.tree.tokens, record.tree.parents)
        drawn = drafting_html(record, setup.tokenizer, drafted_depth(record))
        cuts.append(drawn.count('class="node cut"'))
        assert cuts[-1] == len(record.expanded) - len(record.tree)
    assert max(cuts) > 0
    plain = TreeModelDraft(setup.draft, 3, 3, 6)
    decode(Engine(setup.target), plain, chat_ids(setup.tokenizer, PROMPT), 8, Sampling(), 3, 0, None)
    assert plain.expansions is None


def test_lossy_rules_are_marked_and_name_the_tokens_only_they_let_through(setup, monkeypatch):
    import lab.viz.methods as methods
    from lab.verify.lossy import JudgeRule, Probe
    from lab.viz.cycles import rule_only
    view = inspector(setup, method="sd")
    h = setup.target.config.hidden_size
    view.setup.judge = JudgeRule(Probe(1, torch.zeros(h), torch.ones(h), torch.zeros(h), 0.0), 0.1)  # P 0.5: all pass
    made = methods.make_drafter
    # drafts the tiny target would never write (it repeats one token), so that only the rule accepts them
    monkeypatch.setattr(methods, "make_drafter", lambda s, m: (ReferenceDraft(len(view.prompt_ids), list(range(5, 40))),
                                                               *made(s, m)[1:]))
    view.method_picker.value = "judge"
    assert view.temperature_slider.disabled and "lossy" in view.summary.value
    only = [(r, n) for r in view.records for n in rule_only(r)]
    assert only  # the untrained draft's tokens, let through by the judge alone
    for record, node in only:
        assert record.rule == "judge" and record.rule_scores[node] == pytest.approx(0.5)
        assert node_details(record, node, setup.tokenizer)[3].startswith("accepted by the judge rule only")
    view.cycle_slider.value = len(view.records)
    marked = sum(1 for r in view.records for i in range(len(r.emitted)) if r.path[i + 1: i + 2]
                 and r.path[i + 1] in rule_only(r))
    assert view.text.value.count('class="token draft lossy"') == marked > 0
    view.method_picker.value = "topk"
    assert {r.rule for r in view.records} == {"topk2"} and "lossy" in view.summary.value


def test_temperature_samples_reproducibly(setup):
    view = inspector(setup, method="sd-tree")
    view.temperature_slider.value = 1.0
    assert all(not r.greedy and len(r.uniforms) == len(r.tree) for r in view.records)
    again = inspector(setup, method="sd-tree", temperature=1.0)
    assert again.result.tokens == view.result.tokens
    again.seed_box.value = 1  # another seed decodes again, other draws
    assert [r.uniforms for r in again.records] != [r.uniforms for r in view.records]
    again.seed_box.value = 0
    assert again.result.tokens == view.result.tokens


def test_a_click_selects_a_node_and_folds_or_unfolds_its_branch(setup):
    view = inspector(setup, tree=(4, 3, 16), max_new_tokens=24)
    cycle = next(i for i, r in enumerate(view.records) if foldable(r))
    view.cycle_slider.value = cycle + 1
    node = min(foldable(view.record))
    folded = drawn_nodes(view)
    assert f"+{_descendants(view.record, node)}" in view.view.svg
    view.click(node)
    assert view.expanded == [node] and view.selected == node
    assert drawn_nodes(view) == folded + _children(view.record, node)
    assert "depth" in view.details.value and "rank" in view.details.value
    view.click(node)
    assert view.expanded == [] and drawn_nodes(view) == folded
    final = len(view.record.tree)  # the target's own token
    view.click(final)
    assert view.selected == final and view.expanded == []
    assert any(word in view.details.value for word in ("corrected", "bonus", "target's own"))
    with pytest.raises(LabError, match="nodes 0.."):
        view.click(final + 1)


def _children(record, node):
    return len(children_of(record.tree.parents)[node])


def _descendants(record, node):
    children = children_of(record.tree.parents)
    stack, count = list(children[node]), 0
    while stack:
        count += 1
        stack += children[stack.pop()]
    return count


def test_the_static_fallback_is_the_same_drawing(setup):
    view = inspector(setup)
    bundle = view._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert view.view.svg in bundle["text/html"] and view.text.value in bundle["text/html"]


@pytest.mark.parametrize("kwargs, message", [
    ({"method": "hf"}, "steps through"), ({"temperature": -0.5}, "temperature"),
    ({"tree": (0, 4, 16)}, "tree must be"), ({"tree": (4, 4, 100)}, "tree must be"),
    ({"max_new_tokens": 0}, "max_new_tokens")])
def test_bad_arguments_are_one_clear_line(setup, kwargs, message):
    with pytest.raises(LabError, match=message):
        DraftTreeInspector(PROMPT, setup=setup, **kwargs)
    with pytest.raises(LabError, match="non-empty"):
        DraftTreeInspector("  ", setup=setup)


def test_token_text_shows_whitespace():
    assert visible_text(" the\n") == "␣the↵" and visible_text("\t") == "␉" and visible_text("") == "∅"


def _record(tiny, tokenizer, drafter, sampling, new_tokens=16, draft_len=4):
    prompt = chat_ids(tokenizer, PROMPT)
    recorder = CycleRecorder(sampling, drafter)
    out = decode(Engine(tiny), drafter, prompt, new_tokens, sampling, draft_len, 3, None, kernel="torch",
                 on_cycle=recorder)
    assert [t for r in recorder.records for t in r.emitted] == out.tokens
    return prompt, recorder.records


def test_greedy_verdicts_name_the_targets_argmax(tiny, tokenizer):
    """A reference text that is the target's own greedy answer with one token changed: the
    drafts pass up to the change, which is rejected as a greedy mismatch."""
    prompt = chat_ids(tokenizer, PROMPT)
    greedy = decode(Engine(tiny), NoDraft(), prompt, 12, Sampling(), 0, 0, None).tokens
    wrong = greedy[:5] + [(greedy[5] + 1) % tiny.config.vocab_size] + greedy[6:]
    _, records = _record(tiny, tokenizer, ReferenceDraft(len(prompt), wrong), Sampling(), 12)
    first = records[0]
    assert node_states(first) == ["root"] + ["accepted"] * 4 and first.last == "bonus"
    second = records[1]
    assert node_states(second)[1] == "rejected" and second.last == "corrected"
    assert "greedy mismatch" in node_details(second, 1, tokenizer)[3]
    assert "not verified" in node_details(second, 2, tokenizer)[3]
    assert math.isnan(second.tree.confidences[1])  # a reference text has no confidence


@pytest.mark.parametrize("drafter", ["chain", "tree"])
def test_sampled_verdicts_agree_with_the_verification(tiny, tokenizer, drafter):
    """Every tried node's explanation (u against p/q for a chain, u·m against p for a tree)
    gives the verdict verification reached."""
    chosen = ModelDraft(make_draft(tiny, 1)) if drafter == "chain" else EagleDraft(EagleHead(tiny).eval(), "dynamic",
                                                                                   3, 3, 8)
    _, records = _record(tiny, tokenizer, chosen, Sampling(1.0), 24, 3)
    tried = 0
    for record in records:
        states = node_states(record)
        for node in range(1, len(record.tree)):
            if states[node] == "untried":
                continue
            tried += 1
            text = node_details(record, node, tokenizer)[3]
            assert text.startswith(states[node]) and "uniform draw" in text
            u, p = record.uniforms[node], record.target_probs[node]
            if record.chain:
                passes = u * record.tree.confidences[node] < p
            else:
                siblings = children_of(record.tree.parents)[record.tree.parents[node]]
                mass = 1 - sum(record.target_probs[s] for s in siblings[: siblings.index(node)])
                passes = u * mass < p
            assert passes == (states[node] == "accepted")
    assert tried > 0
