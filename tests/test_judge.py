"""Judge Decoding's pieces: planted-error labels, the sandbox, the checkable tasks, the lossy
acceptance rules and their reduction to standard verification."""
import json

import pytest
import torch

from lab.data import humaneval_problems, humaneval_split
from lab.decode import decode
from lab.drafters import NoDraft, ReferenceDraft
from lab.errors import LabError
from lab.judge.labels import code_mutations, label_tokens, number_mutations
from lab.judge.probe import load_judge
from lab.judge.sandbox import check_humaneval, run_python
from lab.judge.tasks import JUDGE_TASKS_PER_KIND, KINDS, make_tasks
from lab.sampling import Sampling
from lab.target.engine import Engine
from lab.verify.lossless import verify_chain_greedy
from lab.verify.lossy import JudgeRule, Probe, TopKRule, verify_chain_lossy

GREEDY = Sampling()


def test_planted_error_labels_mark_the_mutation_site(tokenizer):
    code = "    return [x for x in numbers if x > threshold]\n    count = len(numbers) - 1\n"
    prose = "She had 12 apples, ate 3 of them and kept 9."
    checked = 0
    for original, mutation in [(code, m) for m in code_mutations(code)] + [(prose, m) for m in number_mutations(prose)]:
        labelled = label_tokens(tokenizer, [1, 2, 3], original, mutation, "p")
        if labelled is None:
            continue
        checked += 1
        negative = labelled.site_token - labelled.answer_start
        assert labelled.labels[:negative] == [1] * negative and labelled.labels[negative] == 0
        assert set(labelled.labels[negative + 1:]) <= {-1}
        # the negative token's characters cover the first changed character
        tokens = labelled.ids[labelled.answer_start:]
        before = len(tokenizer.decode(tokens[:negative]))
        upto = len(tokenizer.decode(tokens[: negative + 1]))
        first_change = next(i for i, (a, b) in enumerate(zip(original, mutation.text)) if a != b)
        assert before <= first_change < upto, (mutation, before, first_change, upto)
    assert checked >= 8  # not vacuous: most mutations change a token of their own


def test_mutations_of_each_kind_are_planted():
    kinds = {m.kind for m in code_mutations("def f(a, b):\n    return a + 1 if a < b else b\n")}
    assert kinds == {"flipped comparison", "wrong operator", "off-by-one", "wrong variable"}
    assert [m.text for m in number_mutations("3 apples and 40 pears")] == ["4 apples and 40 pears",
                                                                          "3 apples and 41 pears"]


def test_the_sandbox_kills_an_infinite_loop_and_reports_failures():
    import time
    start = time.time()
    assert run_python("while True:\n    pass\n", timeout=1.0).reason == "timeout"
    assert time.time() - start < 5
    assert run_python("import os\nos.listdir('/')\n").reason == "forbidden import: os"
    assert run_python("open('/etc/passwd')\n").reason == "forbidden import: open"
    assert run_python("x = [0] * (10 ** 10)\n", memory_mb=256).passed is False
    assert run_python("assert 1 + 1 == 3\n").reason.startswith("failed: AssertionError")
    assert run_python("print('ok')\n").passed


@pytest.mark.slow
def test_every_canonical_humaneval_solution_passes_and_a_planted_error_fails():
    problems = humaneval_problems()
    assert all(check_humaneval(p, p["canonical_solution"]).passed for p in problems)
    p = problems[0]
    broken = next(m for m in code_mutations(p["canonical_solution"]) if m.kind == "flipped comparison")
    assert not check_humaneval(p, broken.text).passed


def test_tasks_are_reproducible_and_their_checks_accept_the_answer():
    a, b = make_tasks(per_kind=3, seed=1), make_tasks(per_kind=3, seed=1)
    assert [t.question for t in a] == [t.question for t in b]
    assert all(t.check(t.answer) and t.check(f"The answer is {t.answer}.") for t in a)
    assert not any(t.check("nothing here") for t in a)
    with pytest.raises(LabError, match="unknown task") as unknown:
        make_tasks(["telepathy"])
    assert "\n" not in str(unknown.value)
    with pytest.raises(LabError, match="unknown task split"):
        make_tasks(split="test")


def test_no_evaluation_question_is_a_judge_question():
    judge = make_tasks(per_kind=1000, seed=0)
    for seed in (0, 1):
        evaluation = make_tasks(per_kind=1000, seed=seed, split="evaluation")
        assert not {t.question for t in judge} & {t.question for t in evaluation}
        assert len({t.id for t in evaluation}) == len({t.question for t in evaluation}) == len(evaluation)
    # the two halves are the whole question space, and a seed only picks within a half
    assert {t.kind for t in judge} == set(KINDS)
    picked = make_tasks(per_kind=5, seed=3, split="evaluation")
    assert {t.question for t in picked} <= {t.question for t in make_tasks(per_kind=1000, seed=0, split="evaluation")}
    assert len(picked) == 5 * len(KINDS)


def test_lossy_verification_is_standard_verification_when_nothing_else_accepts():
    drafts, argmax = [5, 6, 7], [5, 9, 7, 8]
    assert verify_chain_lossy(drafts, argmax, [False] * 3) == verify_chain_greedy(drafts, argmax)
    assert verify_chain_lossy(drafts, argmax, [False, True, False]).n_accepted == 3


def _probe(hidden: int, layer: int, bias: float) -> Probe:
    return Probe(layer, torch.zeros(hidden), torch.ones(hidden), torch.zeros(hidden), bias)


def test_a_judge_above_every_score_gives_standard_speculative_decoding(tiny, tokenizer):
    prompt = tokenizer("A judge that never fires", add_special_tokens=False).input_ids
    own = decode(Engine(tiny), NoDraft(), prompt, 24, GREEDY, 0, 0, None).tokens
    # the target's own tokens with every third one wrong: standard verification accepts some
    # drafts and rejects others, so the judge must leave both kinds of cycle as they were
    mixed = [t + 1 if i % 3 == 2 else t for i, t in enumerate(own)]
    standard = decode(Engine(tiny), ReferenceDraft(len(prompt), mixed), prompt, 12, GREEDY, 5, 0, None)
    assert standard.accepted_per_cycle[0] == 2  # own[0], own[1] accepted, the wrong own[2] rejected
    never = JudgeRule(_probe(tiny.config.hidden_size, 2, bias=0.0), delta=1.0)  # P(correct) = 0.5 < 1
    judged = decode(Engine(tiny), ReferenceDraft(len(prompt), mixed), prompt, 12, GREEDY, 5, 0, None, rule=never)
    assert judged.tokens == standard.tokens and judged.accepted_per_cycle == standard.accepted_per_cycle
    reference = list(range(100, 140))  # drafts the target would not write
    always = JudgeRule(_probe(tiny.config.hidden_size, 2, bias=0.0), delta=0.1)
    accepted = decode(Engine(tiny), ReferenceDraft(len(prompt), reference), prompt, 12, GREEDY, 5, 0, None, rule=always)
    assert accepted.tokens[:5] == reference[:5]  # the judge let the reference through


def test_top_k_with_k_one_is_standard_verification(tiny, tokenizer):
    prompt = tokenizer("Top one", add_special_tokens=False).input_ids
    reference = list(range(200, 240))
    standard = decode(Engine(tiny), ReferenceDraft(len(prompt), reference), prompt, 10, GREEDY, 4, 0, None)
    top1 = decode(Engine(tiny), ReferenceDraft(len(prompt), reference), prompt, 10, GREEDY, 4, 0, None,
                  rule=TopKRule(1))
    assert top1.tokens == standard.tokens


def test_lossy_rules_refuse_sampling_and_bad_heads(tiny, tmp_path):
    with pytest.raises(LabError, match="greedy"):
        decode(Engine(tiny), ReferenceDraft(1, [5]), [1, 2], 4, Sampling(1.0), 2, 0, None, rule=TopKRule(2))
    with pytest.raises(LabError, match="at least 1"):
        TopKRule(0)
    with pytest.raises(LabError, match="no judge head") as missing:
        load_judge(tiny, tmp_path / "missing.json")
    (tmp_path / "other.json").write_text('{"target": "another-model", "weight": [0.0], "layer": 1}')
    with pytest.raises(LabError, match="another target") as other:
        load_judge(tiny, tmp_path / "other.json")
    assert "\n" not in str(missing.value) + str(other.value)  # one line each


def test_training_a_judge_refuses_unknown_drafters_before_any_work():
    from lab.train.judge import train_judge
    from lab.train.options import JudgeOptions
    with pytest.raises(LabError, match="unknown draft eagle9"):
        train_judge(JudgeOptions(mined=1, mine_with="draft,eagle9"))


def test_a_humaneval_split_keeps_the_program_whole(tokenizer):
    for p in humaneval_problems()[:5]:
        context, solution = humaneval_split(tokenizer, p)
        assert p["prompt"].rstrip("\n") + solution == p["prompt"] + p["canonical_solution"]
        assert tokenizer.decode(context).endswith(p["prompt"].rstrip("\n")) and solution.startswith("\n")


# ---- labels mined from real draft mismatches (lab/judge/labels.py) ----------------------------------

@pytest.fixture(scope="module")
def other():
    """A second random model as the draft: it disagrees with the tiny target almost everywhere."""
    from lab.target.load import tiny_target
    return tiny_target(1)


def _item(tokenizer, check, problem: str = "tasks:fake-0", text: str = "Mine this", n: int = 10):
    from lab.judge.labels import Checkable
    return Checkable(problem, "mined_tasks", tokenizer(text, add_special_tokens=False).input_ids, check, n)


def _greedy_next(model, ids: list[int]) -> int:
    return int(model(torch.tensor([ids])).logits[0, -1].argmax())


@torch.inference_mode()
def test_mining_puts_the_draft_token_at_the_mismatch_and_lets_the_target_finish(tiny, other, tokenizer):
    from lab.judge.labels import greedy_answer, mine_item
    item = _item(tokenizer, lambda ids: True)
    answer = greedy_answer(Engine(tiny), item.prompt, 10, None)
    record = mine_item(Engine(tiny), other, item, cap=4, eos_id=None)
    assert record["answer"] == answer and record["target_correct"] and len(record["mismatches"]) == 4
    for m in record["mismatches"]:
        j, finished = m["position"], m["answer"]
        assert finished[:j] == answer[:j] and finished[j] == m["draft"] != answer[j] == m["target"]
        assert _greedy_next(other, item.prompt + answer[:j]) == m["draft"]  # what the draft proposes there
        seq = item.prompt + finished[: j + 1]
        for token in finished[j + 1:]:  # the rest is the target's greedy continuation
            assert _greedy_next(tiny, seq) == token
            seq.append(token)
        assert len(finished) == 10


def _assert_labels_follow_the_checker(record: dict, examples: list, check) -> None:
    """Each mined example is the prompt and the checked answer up to and including the draft
    token, labelled there only, 1 iff the checker accepted that finished answer."""
    assert len(examples) == len(record["mismatches"])
    for ex, m in zip(examples, record["mismatches"]):
        site = ex.site_token - ex.answer_start
        assert ex.ids[: ex.answer_start] == record["prompt"] and site == m["position"]
        assert ex.ids[ex.answer_start:] == m["answer"][: site + 1]
        assert ex.labels[site] == int(check(m["answer"])) and set(ex.labels[:site]) <= {-1}


def test_a_mined_label_is_positive_iff_the_finished_answer_passes(tiny, other, tokenizer):
    from lab.judge.labels import Labelled, draft_mismatches, greedy_answer, labelled, mine_item, spread
    prompt = tokenizer("Mine this", add_special_tokens=False).input_ids
    answer = greedy_answer(Engine(tiny), prompt, 10, None)
    tried = spread(draft_mismatches(tiny, other, prompt, answer), 6)
    harmful = {d for i, (_, d) in enumerate(tried) if i % 2} - set(answer)  # a fake checker: these tokens break it
    checked = []

    def check(ids: list[int]) -> bool:
        checked.append(list(ids))
        return not harmful & set(ids)
    record = mine_item(Engine(tiny), other, _item(tokenizer, check), cap=6, eos_id=None)
    examples = labelled(record)
    assert {m["harmless"] for m in record["mismatches"]} == {True, False}
    assert checked == [answer] + [m["answer"] for m in record["mismatches"]]
    _assert_labels_follow_the_checker(record, examples, check)
    # a labeller that puts the target's token where the draft's belongs fails the same check
    wrong = [Labelled(ex.problem, ex.ids[: ex.site_token] + [m["target"]], ex.answer_start, ex.labels, ex.kind,
                      ex.site_token, ex.source) for ex, m in zip(examples, record["mismatches"])]
    with pytest.raises(AssertionError):
        _assert_labels_follow_the_checker(record, wrong, check)
    # a target that answers wrongly gives no labels, and nothing is substituted
    failed = mine_item(Engine(tiny), other, _item(tokenizer, lambda ids: False), cap=6, eos_id=None)
    assert not failed["target_correct"] and failed["mismatches"] == [] and labelled(failed) == []


@torch.inference_mode()
def test_a_mined_token_is_read_where_the_judge_reads_it_in_decoding(tiny, other, tokenizer):
    from lab.judge.labels import labelled, mine_item
    from lab.judge.probe import token_features
    record = mine_item(Engine(tiny), other, _item(tokenizer, lambda ids: True), cap=3, eos_id=None)
    layers = [1, tiny.config.num_hidden_layers]
    for ex, m in zip(labelled(record), record["mismatches"]):
        data = token_features(tiny, [ex], layers)
        from_logits = torch.from_numpy(data["logit_features"])
        for layer in layers:
            for reads_logits in (False, True):
                # reading the hidden state, or (with reads_logits) only the draft token's log-probability
                weight = (torch.cat([torch.zeros(64), torch.tensor([1.0, 0.0])]) if reads_logits
                          else torch.linspace(-3, 3, 64))
                probe = Probe(layer, torch.zeros(len(weight)), torch.ones(len(weight)), weight, 0.0, reads_logits)
                seen = []

                class Recording(JudgeRule):
                    def accepts(self, drafts, logits, hidden):
                        seen.append((hidden[layer].clone(), self.scores(drafts, logits, hidden)))
                        return super().accepts(drafts, logits, hidden)
                # decoding: the target's answer up to the mismatch, then the draft proposes the mined token
                context = record["prompt"] + record["answer"][: m["position"]]
                decode(Engine(tiny), ReferenceDraft(len(context), [m["draft"]]), context, 2, GREEDY, 1, 0, None,
                       rule=Recording(probe, 0.5))
                hidden, scores = seen[0]
                mined = torch.from_numpy(data["features"][layer][0])
                assert torch.allclose(hidden[1], mined, atol=1e-4)  # row 1 of [last, draft]: the draft token's own
                assert not torch.allclose(hidden[0], mined, atol=1e-3)  # not the position before it
                expected = probe.score(mined[None], from_logits[:1] if reads_logits else None)[0]
                assert torch.allclose(scores[0], expected, atol=1e-4)
                if reads_logits:  # the probability the target gave the draft token where it predicts it
                    p_draft = torch.softmax(Engine(tiny).forward(context).logits[-1].float(), -1)[m["draft"]]
                    assert torch.allclose(scores[0], torch.sigmoid(p_draft.log()), atol=1e-4)


@torch.inference_mode()
def test_judged_tokens_are_those_only_the_judge_let_through(tiny, other, tokenizer):
    from lab.drafters import ModelDraft
    from lab.judge.labels import greedy_answer, judged_tokens
    always = JudgeRule(_probe(tiny.config.hidden_size, 2, bias=0.0), delta=0.1)  # P(correct) 0.5: accepts every draft
    item = _item(tokenizer, lambda ids: True, n=12)
    answer, found = judged_tokens(Engine(tiny), ModelDraft(other), always, item, 4, None)
    # exactly the positions where the judged answer differs from what the target would say after its prefix
    targets = [_greedy_next(tiny, item.prompt + answer[:j]) for j in range(len(answer))]
    assert found == [(j, a, t) for j, (a, t) in enumerate(zip(answer, targets)) if a != t] and len(found) >= 2
    assert answer != greedy_answer(Engine(tiny), item.prompt, 12, None)  # off the target's own answer
    # a judge that never fires gives standard SD's (the target's) answer, and nothing to label
    never = JudgeRule(_probe(tiny.config.hidden_size, 2, bias=0.0), delta=1.0)
    plain, none = judged_tokens(Engine(tiny), ModelDraft(other), never, item, 4, None)
    assert plain == greedy_answer(Engine(tiny), item.prompt, 12, None) and none == []


def test_the_judge_bar_leads_with_accuracy_and_what_an_answer_costs():
    """The bar's sentence: the judge's best run within 5 points, its accuracy and target forwards per
    answer beside the lossless runs', then the tokens per answer that show a rule making answers
    longer (here 20 tokens against 13.5) and the tokens per forward that flatter it."""
    from lab.judge.sweep import Quality, format_quality, judge_bar
    seven = {"addition": [True] * 7 + [False] * 3}  # 10 questions, 7 right
    runs = {"target only": Quality(seven, 135, 135, 0.0), "standard SD": Quality(seven, 135, 104, 0.0),
            "top-2": Quality({"addition": [True] * 5 + [False] * 5}, 160, 90, 0.0),
            "judge 0.5": Quality({"addition": [True] * 5 + [False] * 5}, 220, 100, 0.0),
            "judge 0.9": Quality(seven, 200, 113, 0.0)}
    assert runs["judge 0.9"].forwards_per_answer == 11.3 and runs["judge 0.9"].tokens_per_answer == 20.0
    table = format_quality(runs).splitlines()
    assert table[-1] == "| judge 0.9 | 1.77 | 1.36x | 20.0 | 11.3 | 1.09x | 0.700 | +0.0 | 0.70 |"
    runs |= {"draft only": Quality({"addition": [False] * 10}, 240, 240, 0.0),
             "eagle SD": Quality(seven, 135, 80, 0.0), "eagle judge 0.9": Quality(seven, 180, 72, 0.0)}
    rows = {row.split(" | ")[0][2:]: row for row in format_quality(runs).splitlines()[2:]}
    assert rows["draft only"] == "| draft only | 1.00 | 0.77x | 24.0 | - | - | 0.000 | -70.0 | 0.00 |"
    assert rows["eagle judge 0.9"].startswith("| eagle judge 0.9 | 2.50 | 1.48x | 18.0 | 7.2 | 0.90x |")  # its own SD
    text = judge_bar(runs)
    assert text.startswith("judge 0.9, the most tokens per forward within 5 points of the target, answers "
                           "70.0% right (+0.0 points) at 11.3 target forwards per answer, against standard SD's "
                           "70.0% (lossless) at 10.4 and the EAGLE chain's at 8.0")
    assert "(20.0 tokens against 13.5), so its 1.36x standard SD's tokens per forward flatters it" in text
    assert text.endswith("the nearest Top-K in tokens per forward, top-2, is -20.0 points")


def test_lost_questions_are_those_the_target_gets_right_and_a_run_gets_wrong(tiny, tokenizer):
    from lab.judge.sweep import Quality, judge_only_tokens, lost_questions
    from lab.target.load import tiny_target
    tasks = make_tasks(per_kind=2, seed=1, split="evaluation")
    kinds = sorted({t.kind for t in tasks})
    target = Quality({k: [True, False] for k in kinds}, 0, 0, 0.0)
    run = Quality({k: [k != kinds[1], True] for k in kinds}, 0, 0, 0.0)  # loses the first question of one kind
    first = [t for t in tasks if t.kind == kinds[1]][0]
    assert lost_questions({"target only": target, "run": run}, "run", tasks) == [first]
    assert lost_questions({"target only": target, "run": target}, "run", tasks) == []
    # random tied-embedding models repeat the chat template's last token; a flipped final norm makes
    # this draft propose the token least like it, so it disagrees with the target everywhere
    other = tiny_target(1)
    other.model.norm.weight.data.neg_()
    always = JudgeRule(_probe(tiny.config.hidden_size, 2, bias=0.0), delta=0.1)
    seen = judge_only_tokens(tiny, tokenizer, first, other, always, 4, 12)
    assert seen["question"] == first.question and seen["judge_only"] and seen["judged"] != seen["target"]
    never = JudgeRule(_probe(tiny.config.hidden_size, 2, bias=0.0), delta=1.0)
    plain = judge_only_tokens(tiny, tokenizer, first, other, never, 4, 12)
    assert plain["judged"] == plain["target"] == seen["target"] and plain["judge_only"] == []


def test_a_judge_that_reads_logits_loads_back_and_asks_for_them(tiny, tmp_path):
    from lab.judge.probe import save_judge
    from lab.verify.lossy import logit_features
    width = tiny.config.hidden_size + 2
    probe = Probe(3, torch.zeros(width), torch.ones(width), torch.zeros(width), 0.0, reads_logits=True)
    probe.weight[-2] = 1.0  # P(correct) = sigmoid(log-probability of the token)
    path = save_judge(probe, 0.4, {"target": "SmolLM2-135M-Instruct"}, tmp_path / "head.json")
    loaded, delta = load_judge(tiny, path)
    assert loaded.reads_logits and delta == 0.4 and torch.equal(loaded.weight, probe.weight)
    narrow = Probe(3, torch.zeros(width - 2), torch.ones(width - 2), torch.zeros(width - 2), 0.0)
    narrow.reads_logits = True  # a head that claims the logit features but has no weights for them
    with pytest.raises(LabError, match="another target"):
        load_judge(tiny, save_judge(narrow, 0.4, {"target": "SmolLM2-135M-Instruct"}, tmp_path / "narrow.json"))
    hidden = torch.randn(2, tiny.config.hidden_size)
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [8.0, 0.0, 0.0, 0.0]])
    from_logits = logit_features(logits, torch.tensor([0, 0]))
    assert torch.allclose(from_logits[:, 0].exp(), torch.tensor([0.25, torch.softmax(logits[1], 0)[0].item()]))
    assert torch.allclose(from_logits[0, 1], torch.log(torch.tensor(4.0)))  # uniform over 4: entropy log 4
    assert torch.allclose(probe.score(hidden, from_logits), torch.sigmoid(from_logits[:, 0]))
    with pytest.raises(LabError, match="log-probability and entropy too"):
        probe.score(hidden)
    with pytest.raises(LabError, match="hidden state only"):
        Probe(3, torch.zeros(4), torch.ones(4), torch.zeros(4), 0.0).score(torch.zeros(1, 4), from_logits[:1])


def test_mining_resumes_from_its_cache(tiny, other, tokenizer, tmp_path):
    from lab.judge.labels import mine
    calls = []

    def check(ids: list[int]) -> bool:
        calls.append(1)
        return True
    items = [_item(tokenizer, check, f"tasks:fake-{i}", f"Mine item {i}", 6) for i in range(2)]
    first = mine(tiny, other, items[:1], cap=2, cache_dir=tmp_path, progress=False)  # interrupted after one item
    before = len(calls)
    both = mine(tiny, other, items, cap=2, cache_dir=tmp_path, progress=False)
    assert both[0] == first[0] and len(calls) - before == 1 + len(both[1]["mismatches"])  # only the new item ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks_fake-0.json", "tasks_fake-1.json"]  # no temp files
    calls.clear()
    assert mine(tiny, other, items, cap=2, cache_dir=tmp_path, progress=False) == both and calls == []
    assert mine(tiny, other, items, cap=1, cache_dir=tmp_path, progress=False)[0]["settings"]["cap"] == 1
    assert calls  # mined again with another cap


def test_the_split_keeps_planted_and_mined_labels_of_a_problem_together(tiny, other, tokenizer):
    from lab.judge.labels import checkable_items, labelled, mine_item
    from lab.judge.probe import split_by_problem, token_features
    examples = []
    for i in range(6):
        item = _item(tokenizer, lambda ids: True, f"tasks:fake-{i}", f"What is {i} + 3?", 6)
        record = mine_item(Engine(tiny), other, item, cap=3, eos_id=None)
        examples += labelled(record)
        for mutation in number_mutations(f"{i} + 3 = {i + 3}")[:1]:
            examples.append(label_tokens(tokenizer, item.prompt, f"{i} + 3 = {i + 3}", mutation, item.problem, "tasks"))
    data = token_features(tiny, examples, [1])
    train, val = split_by_problem(data["groups"], validation=0.5)
    assert train and val
    side = {}
    for name, rows in (("train", train), ("val", val)):
        for r in rows:
            side.setdefault(data["groups"][r], set()).add(name)
    assert len(side) == 6 and all(len(s) == 1 for s in side.values())
    assert set(data["sources"]) == {"tasks", "mined_tasks"}
    # the real items share their problem keys with the planted labels of the same questions
    tasks = make_tasks(per_kind=JUDGE_TASKS_PER_KIND, seed=0)
    items = checkable_items(tokenizer, len(tasks) + 1)
    assert [i.problem for i in items[:3]] == [f"tasks:{t.id}" for t in tasks[:3]]
    assert items[-1].problem == "humaneval:HumanEval/0" and items[-1].source == "mined_humaneval"
    task = tasks[0]
    assert items[0].check(tokenizer.encode(f"It is {task.answer}.")) and not items[0].check(tokenizer.encode("no"))


def test_per_source_report_counts_tokens_and_scores_validation_rows():
    from lab.train.judge import per_source
    sources, labels = ["a"] * 4 + ["b"] * 4, [1, 0, 1, 0, 1, 1, 0, 1]
    token_probability = [0.2, 0.9, 0.8, 0.1, 0.5, 0.5, 0.5, 0.5]  # every row's; a's: half its pairs in order
    report = per_source(sources, labels, [0.9, 0.1, 0.8, 0.6, 0.3, 0.7], [0, 1, 2, 3, 5, 7], delta=0.5,
                        token_probability=token_probability)
    assert report["a"] == {"positive": 2, "negative": 2, "val_auc": 1.0, "val_auc_token_probability": 0.5,
                           "val_wrong_rejected": 0.5}
    assert report["b"] == {"positive": 3, "negative": 1, "val_auc": None, "val_auc_token_probability": None,
                           "val_wrong_rejected": None}


@torch.inference_mode()
def test_an_eagle_heads_mined_proposals_are_its_first_drafts_in_decoding(tiny, tokenizer):
    from lab.drafters import EagleDraft, NoDraft
    from lab.drafters.eagle1 import EagleHead
    from lab.judge.labels import draft_mismatches, draft_proposals
    torch.manual_seed(0)
    head = EagleHead(tiny).eval()
    prompt = tokenizer.encode("Mine this answer, please")
    answer = decode(Engine(tiny), NoDraft(), prompt, 8, GREEDY, 0, 0, None).tokens
    proposed = draft_proposals(tiny, head, prompt, answer)
    assert len(proposed) == len(answer)
    for j in range(len(answer)):
        drafter, seen = EagleDraft(head, "chain", depth=1), []
        steps = drafter.propose_steps  # the loop drafts through the steps (lab/steps.py)

        def recorded(*args):
            seen.append((yield from steps(*args)))
            return seen[-1]
        drafter.propose_steps = recorded
        # decoding after the target's answer up to j: the head's first draft is its proposal for answer[j]
        decode(Engine(tiny), drafter, prompt + answer[:j], 2, GREEDY, 1, 0, None)
        assert seen[0][0] == [proposed[j]], j
    assert draft_mismatches(tiny, head, prompt, answer) == [(j, d) for j, (d, a) in enumerate(zip(proposed, answer))
                                                            if d != a]


def test_the_quality_sweep_resumes_run_by_run_and_reruns_when_its_inputs_change(tiny, tokenizer, tmp_path,
                                                                                 monkeypatch):
    import json

    import lab.judge.probe
    import lab.judge.sweep as quality
    probe = Probe(0, torch.zeros(4), torch.ones(4), torch.zeros(4), 0.0)
    monkeypatch.setattr(quality, "load_judge", lambda target, path: (probe, 0.8))
    monkeypatch.setattr(quality, "load_draft", lambda target, n: "draft model")
    monkeypatch.setattr(quality, "load_head", lambda target, name: "eagle head")
    judges = tmp_path / "judges"  # the shipped judge head and a second one beside it
    judges.mkdir()
    for name in ("judge", "judge-both"):
        (judges / f"{name}.json").write_text(f'{{"name": "{name}", "weight": [1.0]}}')
    monkeypatch.setattr(lab.judge.probe, "JUDGE_DIR", judges)
    decoded, fail_at = [], [3]

    def fake_answer_quality(model, tokenizer, tasks, make_drafter, rule, draft_len, max_new_tokens):
        if len(decoded) == fail_at[0]:
            raise RuntimeError("interrupted")
        decoded.append(getattr(rule, "name", "standard"))
        n = len(decoded)
        return quality.Quality({"addition": [n % 2 == 0] * len(tasks)}, 10 * n, 7, 0.5)
    monkeypatch.setattr(quality, "answer_quality", fake_answer_quality)
    path = tmp_path / "sweep.json"
    names = list(quality.sweep_runs(0.8, fast=True))
    with pytest.raises(RuntimeError):
        quality.quality_sweep(tiny, tokenizer, per_kind=1, fast=True, path=path, progress=False)
    assert list(json.loads(path.read_text())["runs"]) == names[:3]  # the finished runs, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["judges", "sweep.json"]  # no temporary file left
    fail_at[0] = None
    tasks, runs = quality.quality_sweep(tiny, tokenizer, per_kind=1, fast=True, path=path, progress=False)
    assert len(decoded) == len(names) and list(runs) == names  # only the missing runs were decoded, in order
    assert runs["target only"].new_tokens == 10 and runs[names[-1]].new_tokens == 10 * len(names)
    assert quality.recorded_qualities(json.loads(path.read_text())) == runs
    assert quality.quality_sweep(tiny, tokenizer, per_kind=1, fast=True, path=path, progress=False)[1] == runs
    assert len(decoded) == len(names)  # a complete file decodes nothing
    assert (quality.format_quality(runs).splitlines()[2]
            == "| target only | 1.43 | 0.33x | 1.7 | 1.2 | 1.00x | 0.000 | +0.0 | 0.00 |")
    sha = quality.judge_sha  # a retrained judge: other weights, the same threshold
    monkeypatch.setattr(quality, "judge_sha", lambda p: "retrained" if p.name == "judge.json" else sha(p))
    again = quality.quality_sweep(tiny, tokenizer, per_kind=1, fast=True, path=path, progress=False)[1]
    assert decoded[len(names):] == ["judge", "judge"] and list(again) == names  # only the judge's two runs
    monkeypatch.setattr(quality, "load_judge",  # the second head has another delta
                        lambda target, path: (probe, 0.9 if path.stem == "judge-both" else 0.8))
    other = quality.quality_sweep(tiny, tokenizer, per_kind=1, fast=True, path=path, judge="judge-both",
                                  progress=False)[1]
    assert decoded[len(names) + 2:] == ["judge", "judge"]  # only its own judge runs
    assert list(other) == [n.replace("0.8", "0.9 (judge-both)") for n in names]
    recorded = json.loads(path.read_text())["runs"]  # both heads' runs, the shipped head's first
    assert list(recorded) == [n for n in names if "judge" not in n] + [n for n in names if "judge" in n] \
        + [n for n in other if "judge-both" in n]
    assert quality.quality_sweep(tiny, tokenizer, per_kind=1, fast=True, path=path, progress=False)[1] == again
    assert len(decoded) == len(names) + 4  # each head's runs kept beside the other's
    quality.quality_sweep(tiny, tokenizer, per_kind=2, fast=True, path=path, progress=False)
    assert len(decoded) == 2 * len(names) + 4  # other questions: every run again
    assert list(json.loads(path.read_text())["runs"]) == list(again)  # and the other head's runs are dropped
    quality.quality_sweep(tiny, tokenizer, per_kind=2, fast=True, path=path, judge="judge-both", progress=False)
    (judges / "judge-both.json").write_text('{"weight": [2.0]}')  # that head retrained: its runs are no longer shown
    quality.quality_sweep(tiny, tokenizer, per_kind=2, fast=True, path=path, judge="judge-both", progress=False)
    assert len(decoded) == 2 * len(names) + 8
    (judges / "judge-both.json").write_text('{"weight": [3.0]}')  # retrained again: the shipped sweep drops them
    written = json.loads(path.read_text())
    assert quality.quality_sweep(tiny, tokenizer, per_kind=2, fast=True, path=path, progress=False)
    assert len(decoded) == 2 * len(names) + 8  # without decoding anything
    kept = json.loads(path.read_text())
    assert list(kept["runs"]) == list(again) and kept["commit"] == written["commit"]


def test_a_manifest_field_added_to_a_judge_file_keeps_its_runs_current(tmp_path):
    """Runs are keyed on what the head decides with: a new manifest field changes the file's bytes,
    not its hash; a changed weight changes both."""
    from lab.judge.sweep import judge_sha
    head = {"layer": 20, "delta": 0.9, "bias": 0.1, "weight": [0.5, -1.0], "mean": [0.0, 0.0], "std": [1.0, 1.0]}
    path = tmp_path / "judge.json"
    path.write_text(json.dumps(head))
    before = judge_sha(path)
    path.write_text(json.dumps({**head, "experiment": "judge-head"}))
    assert judge_sha(path) == before
    path.write_text(json.dumps({**head, "weight": [0.5, -1.5]}))
    assert judge_sha(path) != before
