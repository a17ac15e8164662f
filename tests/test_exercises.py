"""Teaching mode: the student copies are in sync, the reference solutions pass their checks,
wrong solutions fail them with a message that points at the mistake, and a stub is a stub."""
import nbformat
import pytest
import torch

from lab.check import (ExerciseError, check_ancestor_mask, check_eagle_input, check_isolating_pairs,
                       check_medusa_shape, check_n_alpha_interval, check_prompt_lookup, check_ttt_mask,
                       check_verify_chain)
from lab.errors import LabError
from lab.exercises import solution_cells, stale, stub_functions, student_copy
from lab.paths import INSTRUCTOR_DIR, NOTEBOOKS_DIR


def solutions() -> dict:
    """Every function the chapters' solution cells define, by name."""
    namespace = {"torch": torch}
    for path in sorted(INSTRUCTOR_DIR.glob("*.ipynb")):
        for cell in solution_cells(nbformat.read(path, as_version=4)):
            exec(cell.source, namespace)
    return namespace


REFERENCE = solutions()


def test_the_committed_student_copies_are_up_to_date():
    assert stale() == [], "run `make exercises`"


def test_every_chapter_has_two_exercises_and_the_student_copies_hold_no_solution():
    chapters = sorted(INSTRUCTOR_DIR.glob("*.ipynb"))
    assert [p.name for p in chapters] == [p.name for p in sorted(NOTEBOOKS_DIR.glob("*.ipynb"))]
    few = {p.name: len(solution_cells(nbformat.read(p, as_version=4))) for p in chapters}
    assert {name: n for name, n in few.items() if n < 2} == {}
    for path in NOTEBOOKS_DIR.glob("*.ipynb"):
        notebook = nbformat.read(path, as_version=4)
        assert not solution_cells(notebook)
        for cell in notebook.cells:
            if "exercise" in cell.metadata.get("tags", []):
                namespace = {"torch": torch}
                exec(cell.source, namespace)
                function = next(v for k, v in namespace.items() if callable(v) and k != "torch")
                with pytest.raises(NotImplementedError, match="exercise"):
                    function(*([None] * function.__code__.co_argcount))


def test_an_exercise_copy_with_the_solution_pasted_back_passes_its_own_check_cells(tiny):
    """What a student does: in the copy, replace the stub with the answer (here the notebook's
    own solution) and run the check cell after it, as written in the copy. The names the check
    cells use from earlier cells are given: FAST, and the target (the tiny one)."""
    checked = 0
    for path in sorted(NOTEBOOKS_DIR.glob("*.ipynb")):
        copy = nbformat.read(path, as_version=4)
        original = nbformat.read(INSTRUCTOR_DIR / path.name, as_version=4)
        for i, cell in enumerate(copy.cells):
            if "exercise" not in cell.metadata.get("tags", []):
                continue
            assert "solution" in original.cells[i].metadata.get("tags", [])
            namespace = {"torch": torch, "FAST": True, "target": tiny}
            exec(cell.source, namespace)  # the stub as handed out: its check cell must call it
            with pytest.raises(NotImplementedError, match="exercise"):
                exec(copy.cells[i + 1].source, namespace)
            exec(original.cells[i].source, namespace)  # the pasted answer (cells keep their order)
            exec(copy.cells[i + 1].source, namespace)  # the copy's check cell raises if it is wrong
            checked += 1
    assert checked >= 3


def test_resampling_from_p_after_a_rejection_fails_the_chain_check():
    def from_p(draft, q, p, uniforms, noise):
        for i, x in enumerate(draft):
            if uniforms[i] * (1.0 if q is None else q[i, x]) < p[i, x]:
                continue
            return i, list(draft[:i]) + [int(torch.argmax(p[i] / noise))]  # the classic bug
        return len(draft), list(draft) + [int(torch.argmax(p[len(draft)] / noise))]
    with pytest.raises(ExerciseError, match="residual"):
        check_verify_chain(from_p, samples=2000)


def test_a_non_strict_comparison_fails_the_chain_check():
    def non_strict(draft, q, p, uniforms, noise):
        for i, x in enumerate(draft):
            if uniforms[i] * (1.0 if q is None else q[i, x]) <= p[i, x]:  # "<=" accepts p(x) = 0 when u = 0
                continue
            return i, list(draft[:i]) + [int(torch.argmax(p[i] / noise))]
        return len(draft), list(draft) + [int(torch.argmax(p[len(draft)] / noise))]
    with pytest.raises(ExerciseError, match="strict"):
        check_verify_chain(non_strict, samples=100)


def test_pairing_f_t_with_x_t_fails_the_eagle_input_check(tiny):
    with pytest.raises(ExerciseError, match="one step ahead"):
        check_eagle_input(lambda f, ids, embed: torch.cat([f, embed(ids[:-1])], -1), tiny.model.embed_tokens)


def test_a_parent_only_mask_fails_the_ancestor_check():
    def parent_only(parents):
        mask = torch.eye(len(parents), dtype=torch.bool)
        for i, parent in enumerate(parents):
            if parent >= 0:
                mask[i, parent] = True
        return mask
    with pytest.raises(ExerciseError, match="is an ancestor of node"):
        check_ancestor_mask(parent_only)


def test_stubs_keep_signature_and_docstring_and_refuse_other_statements():
    source = 'def f(a, b=2):\n    """Doc."""\n    return a + b\n\n\ndef g(x):\n    return x\n'
    stubbed = stub_functions(source)
    assert 'def f(a, b=2):\n    """Doc."""\n    raise NotImplementedError' in stubbed
    assert "def g(x):\n    raise NotImplementedError" in stubbed and "return" not in stubbed
    with pytest.raises(LabError, match="only functions"):
        stub_functions("x = 1\n")


def test_a_student_copy_drops_outputs_and_retags():
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def f():\n    return 1", metadata={"tags": ["solution"]}),
        nbformat.v4.new_code_cell("print(f())")])
    notebook.cells[1].outputs = [nbformat.v4.new_output("stream", text="1\n")]
    copy = student_copy(notebook)
    assert copy.cells[0].metadata["tags"] == ["exercise"] and "NotImplementedError" in copy.cells[0].source
    assert copy.cells[1].outputs == [] and copy.cells[1].source == "print(f())"


def test_a_ttt_mask_without_the_chain_diagonal_fails_its_check():
    def causal_only(positions, steps):
        mask = torch.zeros(steps * positions, steps * positions, dtype=torch.bool)
        for s in range(steps):
            mask[s * positions:(s + 1) * positions, :positions] = torch.tril(torch.ones(positions, positions)).bool()
        return mask
    with pytest.raises(ExerciseError, match="its own chain's earlier step"):
        check_ttt_mask(causal_only)
    check_ttt_mask(REFERENCE["ttt_mask"])


def test_the_normal_approximation_fails_the_interval_check():
    def normal(evaluation, depth):
        series = evaluation["n_alpha_by_depth"]
        chains = series["chains"][depth - 1]
        hits = round(series["rate"][depth - 1] * chains)
        p = hits / chains
        half = 1.96 * (p * (1 - p) / chains) ** 0.5
        return hits, chains, p - half, p + half
    with pytest.raises(ExerciseError, match="Wilson"):
        check_n_alpha_interval(normal)
    check_n_alpha_interval(REFERENCE["n_alpha_interval"])


def test_a_pair_that_differs_in_two_options_or_in_stages_fails_the_pairs_check():
    with pytest.raises(ExerciseError, match="ttt_steps"):  # differs in the loss and in TTT: the second is named
        check_isolating_pairs(lambda manifests: {"feature loss": ("ablation-feature-plain", "ablation-token-ttt"),
                                                 "training-time test": ("ablation-token-plain", "ablation-token-ttt")})
    with pytest.raises(ExerciseError, match="numbers of stages differ"):  # a first stage against a whole head
        check_isolating_pairs(lambda manifests: {"feature loss": ("ablation-feature-plain", "ablation-token-plain"),
                                                 "training-time test": ("ablation-token-s1", "ablation-token-plain")})
    check_isolating_pairs(REFERENCE["isolating_pairs"])


def test_the_first_occurrence_fails_the_prompt_lookup_check():
    def first_occurrence(context, k, max_ngram):
        for n in range(min(max_ngram, len(context) - 1), 0, -1):
            suffix = context[-n:]
            for start in range(len(context) - n):  # oldest first: the broken part
                if context[start:start + n] == suffix and context[start + n:start + n + k]:
                    return context[start + n:start + n + k]
        return []
    with pytest.raises(ExerciseError, match="more recent"):
        check_prompt_lookup(first_occurrence)
    check_prompt_lookup(REFERENCE["prompt_lookup"])


def test_summed_accuracies_fail_the_medusa_shape_check():
    import itertools

    def by_sum(total_tokens, accuracy):
        paths = [p for d in range(1, len(accuracy) + 1) for p in itertools.product(range(len(accuracy[0])), repeat=d)]
        return sorted(paths, key=lambda p: -sum(accuracy[j][r] for j, r in enumerate(p)))[: total_tokens - 1]
    with pytest.raises(ExerciseError, match="product"):
        check_medusa_shape(by_sum)
    check_medusa_shape(REFERENCE["medusa_shape"])
