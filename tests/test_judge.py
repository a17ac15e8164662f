"""Judge Decoding's pieces: planted-error labels, the sandbox, the checkable tasks, the lossy
acceptance rules and their reduction to standard verification."""
import pytest
import torch

from lab.decode import decode
from lab.drafters import ReferenceDraft
from lab.engine import Engine
from lab.errors import LabError
from lab.judge import JudgeRule, Probe, TopKRule, code_mutations, label_tokens, load_judge, number_mutations
from lab.sandbox import check_humaneval, run_python
from lab.sampling import Sampling
from lab.tasks import make_tasks
from lab.data import humaneval_problems, humaneval_split
from lab.verify import verify_chain_greedy, verify_chain_lossy

GREEDY = Sampling()


def test_planted_error_labels_mark_the_mutation_site(tokenizer):
    code = "    return [x for x in numbers if x > threshold]\n"
    for mutation in code_mutations(code):
        labelled = label_tokens(tokenizer, [1, 2, 3], code, mutation, "p")
        if labelled is None:
            continue
        negative = labelled.site_token - labelled.answer_start
        assert labelled.labels[:negative] == [1] * negative and labelled.labels[negative] == 0
        assert set(labelled.labels[negative + 1:]) <= {-1}
        # the negative token's characters cover the first changed character
        tokens = labelled.ids[labelled.answer_start:]
        before = len(tokenizer.decode(tokens[:negative]))
        upto = len(tokenizer.decode(tokens[: negative + 1]))
        first_change = next(i for i, (a, b) in enumerate(zip(code, mutation.text)) if a != b)
        assert before <= first_change < upto, (mutation, before, first_change, upto)


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
    with pytest.raises(LabError, match="unknown task"):
        make_tasks(["telepathy"])


def test_lossy_verification_is_standard_verification_when_nothing_else_accepts():
    drafts, argmax = [5, 6, 7], [5, 9, 7, 8]
    assert verify_chain_lossy(drafts, argmax, [False] * 3) == verify_chain_greedy(drafts, argmax)
    assert verify_chain_lossy(drafts, argmax, [False, True, False]).n_accepted == 3


def _probe(hidden: int, layer: int, bias: float) -> Probe:
    return Probe(layer, torch.zeros(hidden), torch.ones(hidden), torch.zeros(hidden), bias)


def test_a_judge_above_every_score_gives_standard_speculative_decoding(tiny, tokenizer):
    prompt = tokenizer("A judge that never fires", add_special_tokens=False).input_ids
    reference = list(range(100, 140))  # drafts the target would not write
    standard = decode(Engine(tiny), ReferenceDraft(len(prompt), reference), prompt, 12, GREEDY, 5, 0, None)
    never = JudgeRule(_probe(tiny.config.hidden_size, 2, bias=0.0), delta=1.0)  # P(correct) = 0.5 < 1
    judged = decode(Engine(tiny), ReferenceDraft(len(prompt), reference), prompt, 12, GREEDY, 5, 0, None, rule=never)
    assert judged.tokens == standard.tokens and judged.cycles == standard.cycles
    always = JudgeRule(_probe(tiny.config.hidden_size, 2, bias=0.0), delta=0.1)
    accepted = decode(Engine(tiny), ReferenceDraft(len(prompt), reference), prompt, 12, GREEDY, 5, 0, None, rule=always)
    assert accepted.tokens[:5] == reference[:5]  # the judge let the reference through


def test_top_k_with_k_one_is_standard_verification(tiny, tokenizer):
    prompt = tokenizer("Top one", add_special_tokens=False).input_ids
    reference = list(range(200, 240))
    standard = decode(Engine(tiny), ReferenceDraft(len(prompt), reference), prompt, 10, GREEDY, 4, 0, None)
    top1 = decode(Engine(tiny), ReferenceDraft(len(prompt), reference), prompt, 10, GREEDY, 4, 0, None, rule=TopKRule(1))
    assert top1.tokens == standard.tokens


def test_lossy_rules_refuse_sampling_and_bad_heads(tiny, tmp_path):
    with pytest.raises(LabError, match="greedy"):
        decode(Engine(tiny), ReferenceDraft(1, [5]), [1, 2], 4, Sampling(1.0), 2, 0, None, rule=TopKRule(2))
    with pytest.raises(LabError, match="at least 1"):
        TopKRule(0)
    with pytest.raises(LabError, match="no judge head"):
        load_judge(tiny, tmp_path / "missing.json")
    (tmp_path / "other.json").write_text('{"target": "another-model", "weight": [0.0], "layer": 1}')
    with pytest.raises(LabError, match="another target"):
        load_judge(tiny, tmp_path / "other.json")


def test_a_humaneval_split_keeps_the_program_whole(tokenizer):
    for p in humaneval_problems()[:5]:
        context, solution = humaneval_split(tokenizer, p)
        assert p["prompt"].rstrip("\n") + solution == p["prompt"] + p["canonical_solution"]
        assert tokenizer.decode(context).endswith(p["prompt"].rstrip("\n")) and solution.startswith("\n")
