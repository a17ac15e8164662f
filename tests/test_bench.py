"""Greedy identity bookkeeping: a mismatch is located and classified by ar's top-2 gap; the
line that says which head and tree each EAGLE method drafted with."""
from lab.bench import TIE_GAP, drafting_line
from lab.bench.run import _mismatch
from lab.decode import DecodeResult


def ar_row(tokens, gaps):
    return DecodeResult(tokens=tokens, top2_gaps=gaps)


def test_identical_rows_have_no_mismatch():
    assert _mismatch([1, 2, 3], ar_row([1, 2, 3], [1.0, 1.0, 1.0])) is None


def test_mismatch_at_a_near_tie_is_a_numerical_tie():
    m = _mismatch([1, 5, 6], ar_row([1, 2, 3], [1.0, TIE_GAP / 2, 1.0]))
    assert m == {"position": 1, "ar_top2_gap": TIE_GAP / 2, "numerical_tie": True}


def test_mismatch_with_a_clear_gap_is_a_bug():
    assert _mismatch([9], ar_row([1], [0.3]))["numerical_tie"] is False


def test_a_shorter_row_is_a_mismatch():
    assert _mismatch([1, 2], ar_row([1, 2, 3], [1.0, 1.0, 1.0]))["position"] == 2


def test_the_drafting_line_names_the_head_file_each_eagle_method_ran():
    tree = {"tree": "dynamic (EAGLE-2 expansion and reranking)", "depth": 2, "top_k": 4, "total_tokens": 6}
    result = {"config": {"eagle_head": "eagle1-gpu", "eagle3_head": "eagle3-full",
                         "methods": {"ar": {"loop": "lab.decode"}, "eagle2": {**tree, "head": "eagle1"},
                                     "eagle3": {**tree, "head": "eagle3"}}}}
    line = drafting_line(result)
    assert "eagle2 head eagle1-gpu, dynamic tree 2,4,6" in line  # the flag's file, not the kind
    assert "eagle3 head eagle3-full, dynamic tree 2,4,6" in line and "ar" not in line.split(":", 1)[1]
    assert drafting_line({"config": {"methods": {"ar": {"loop": "lab.decode"}}}}) is None
