"""Which methods the inspector steps through and how it builds each one's drafter from the shipped
components (loaded on first use), with the budget its sliders set; its arguments checked."""
from __future__ import annotations

from ..bench import Setup, make_drafter
from ..costmodel import dtype_name, given_tree
from ..drafters.eagle_draft import static_shape
from ..drafters.heads import head_manifest, load_head, rank_accuracy_of
from ..errors import LabError
from ..judge.probe import load_judge
from ..paths import EAGLE3_SHIPPED, shipped_head
from ..sampling import Sampling
from ..target.load import load_draft, load_target, load_tokenizer
from ..verify.lossy import JudgeRule
from .phases import PHASES

INSPECTED_METHODS = ("sd", "sd-tree", "pld", "pld-tree", "lookahead", "medusa", "eagle1", "eagle2", "eagle3", "judge",
                     "topk")
LOSSY = ("judge", "topk")  # greedy verification OR-ed with a lossy rule: the text is no longer the target's
# their budget is the depth slider alone (lookahead: none)
CHAIN_METHODS = ("sd", "pld", "pld-tree", "lookahead", *LOSSY)
VIEWS = ("tree", *PHASES)  # the whole cycle, or one phase of it
DEPTHS, TOP_KS, TOTALS = (1, 8), (1, 10), (2, 64)  # the budget sliders' ranges
MAX_TEMPERATURE = 2.0
DRAFT_LAYERS = 2  # the shipped draft that sd and sd-tree use (the command line's default)


def inspected_drafter(setup: Setup, method: str, depth: int, top_k: int, total: int
                      ) -> tuple[object, int, object | None]:
    """The method's drafter with the given budget, its drafts per cycle and its lossy rule (None:
    lossless), loading the shipped draft, heads or judge on first use."""
    setup.draft_len = depth
    if method in ("sd", "sd-tree", *LOSSY):
        if setup.draft is None:
            setup.draft = load_draft(setup.target, DRAFT_LAYERS)
        setup.tree = (depth, top_k, total)
    if method == "medusa":  # a static tree of the total-tokens slider's size, shaped by the heads' accuracy
        if setup.medusa is None:
            setup.medusa = load_head(setup.target, shipped_head("medusa"))
        accuracy = head_manifest(shipped_head("medusa"))["evaluation"]["rank_accuracy_by_head"]
        setup.medusa_shape = static_shape(total, len(accuracy), accuracy)
    if method == "judge" and setup.judge is None:
        setup.judge = JudgeRule(*load_judge(setup.target))
    if method in ("sd", "sd-tree", "pld", "pld-tree", "lookahead", "medusa", *LOSSY):
        return make_drafter(setup, method)
    dtype = dtype_name(setup.target)
    if method == "eagle3":
        if setup.head3 is None:
            name = shipped_head("eagle3")
            setup.head3, setup.rank_accuracy3 = load_head(setup.target, name), rank_accuracy_of(head_manifest(name))
        setup.eagle3_tree = given_tree(depth, top_k, total, dtype=dtype, head=EAGLE3_SHIPPED, kind="eagle3")
    else:
        if setup.head is None:
            name = shipped_head("eagle1")
            setup.head, setup.rank_accuracy = load_head(setup.target, name), rank_accuracy_of(head_manifest(name))
        setup.eagle_tree = given_tree(depth, top_k, total, dtype=dtype)
    return make_drafter(setup, method)


def check_arguments(prompt: str, method: str, temperature: float, tree: tuple[int, int, int] | None,
                    max_new_tokens: int) -> None:
    if not isinstance(prompt, str) or not prompt.strip():
        raise LabError("DraftTreeInspector needs a prompt: a non-empty string")
    if method not in INSPECTED_METHODS:
        raise LabError(f"the inspector steps through {', '.join(INSPECTED_METHODS)}, not {method!r}")
    if not 0.0 <= temperature <= MAX_TEMPERATURE:
        raise LabError(f"temperature must be between 0 (greedy) and {MAX_TEMPERATURE:g}, got {temperature}")
    if tree is not None and (len(tree) != 3 or not all(low <= int(v) <= high for v, (low, high)
                                                       in zip(tree, (DEPTHS, TOP_KS, TOTALS)))):
        raise LabError(f"tree must be (depth {DEPTHS[0]}-{DEPTHS[1]}, top-k {TOP_KS[0]}-{TOP_KS[1]}, "
                       f"total tokens {TOTALS[0]}-{TOTALS[1]}), got {tree!r}")
    if max_new_tokens < 1:
        raise LabError(f"max_new_tokens must be at least 1, got {max_new_tokens}")


def shipped_setup() -> Setup:
    """The shipped target and tokenizer; drafts and heads load when a method needs them."""
    return Setup(load_target(), None, load_tokenizer(), Sampling(), 0, 0, 0)

