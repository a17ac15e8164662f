"""The options of every trainer, each one dataclass: `python -m lab train WHAT` builds its flags from
WHAT's dataclass in `TRAINERS`, the trainer takes it, and its manifest records it under "options"."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import LabError
from ..options import opt

DTYPES = ["float32", "bfloat16"]
DEVICE = "cpu or cuda: features and training on a GPU (make run E=gpu-heads)"
EVAL_PROMPTS = ("held-out prompts to evaluate on (by default all 64; 0: none, for a machine without the datasets: "
                "`python -m lab evaluate NAME --prompts 64` adds it)")
MAX_STEPS = "exactly this many steps instead of a time budget (cosine over the steps)"
REPLIES = "also train on this many tokens of ShareGPT's original replies"
REPLY_DTYPE = ("compute the replies' target features in this dtype (bfloat16: much faster on CPUs with matrix "
               "units)")
TRAIN_PROMPTS = ("train on the first N regenerated training prompts only (by default all; 0: none, with --replies: "
                 "ShareGPT's replies alone)")
INIT = "start from the trained head data/eagle/NAME.safetensors"


@dataclass
class LoopOptions:
    """What every trainer of the one loop (lab/train/loop.py) takes besides its budget and rate."""
    max_steps: int | None = opt(None, MAX_STEPS)
    batch: int = opt(8, "sequences per step")
    seed: int = opt(0, "seed of the initialisation, the data order and the sampling in training")
    resume: bool = opt(False, "go on from the run's checkpoint")
    snapshot_every: int = opt(0, "every N steps, also save the model so far beside the final file as NAME-stepN "
                              "(tau against sequence draws along one run; 0: never)")

    def __post_init__(self) -> None:
        if self.snapshot_every < 0:
            raise LabError(f"--snapshot-every must be 0 (never) or a number of steps, not {self.snapshot_every}")


@dataclass
class DraftOptions(LoopOptions):
    """`train draft`: distil a small draft LM from the target."""
    layers: int | None = opt(None, "decoder layers of the draft (1, 2 or 4; required)")
    minutes: float = opt(6.0, "wall-clock budget in minutes")
    lr: float = opt(2e-3, "peak learning rate")
    label_fraction: float = opt(0.25, "share of the response positions scored in each step")


@dataclass
class Eagle1Options(LoopOptions):
    """`train eagle1`: an EAGLE head on the target's features."""
    variant: str = opt("eagle1", "what the head sees: feature and next token (eagle1), feature only (no-token) "
                       "or token only", choices=["eagle1", "no-token", "token-only"])
    name: str | None = opt(None, "save as data/eagle/NAME.safetensors (by default the variant's name)")
    init: str | None = opt(None, INIT)
    replies: int = opt(0, REPLIES)
    reply_feature_dtype: str = opt("float32", REPLY_DTYPE, choices=DTYPES)
    sampled: bool = opt(False, "train and evaluate on the answers sampled at T = 1 (`lab data build --sampled`)")
    train_prompts: int | None = opt(None, TRAIN_PROMPTS)
    minutes: float = opt(30.0, "wall-clock budget in minutes")
    lr: float = opt(1e-3, "peak learning rate")
    ce_fraction: float = opt(0.5, "share of the scored positions whose cross-entropy is computed in each step")
    device: str = opt("cpu", DEVICE)
    eval_prompts: int | None = opt(None, EVAL_PROMPTS)


@dataclass
class Eagle3Options(LoopOptions):
    """`train eagle3`: an EAGLE-3 head trained with training-time test."""
    name: str | None = opt(None, "save as data/eagle/NAME.safetensors (by default eagle3)")
    init: str | None = opt(None, INIT + " (same vocabulary and taps)")
    replies: int = opt(0, REPLIES)
    reply_feature_dtype: str = opt("float32", REPLY_DTYPE, choices=DTYPES)
    train_prompts: int | None = opt(None, TRAIN_PROMPTS)
    ttt_steps: int = opt(7, "training-time test steps")
    draft_vocab: int = opt(8192, "draft vocabulary: the most frequent training tokens")
    taps: str = opt("fused", "the target's layers 2, N/2, N-3 fused (fused-normed: each tap RMS-normalised first), "
                    "or its top feature only (an ablation)", choices=["fused", "fused-normed", "top"])
    feature_loss: float = opt(0.0, "also regress each step's output state onto the target's top feature with this "
                              "weight against the token loss (EAGLE-1's constraint put back, an ablation; 0: "
                              "EAGLE-3's objective)")
    fp32: bool = opt(False, "float32 matrix products (by default bfloat16 autocast over fp32 weights)")
    heldout_every: int = opt(0, "every N steps (and after the last), the run's own loss on VALIDATION_SEQUENCES "
                             "held-out sequences, recorded with a verdict: trained enough or capped (0: never)")
    minutes: float = opt(60.0, "wall-clock budget in minutes")
    lr: float = opt(1e-3, "peak learning rate")
    device: str = opt("cpu", DEVICE)
    eval_prompts: int | None = opt(None, EVAL_PROMPTS)

    def __post_init__(self) -> None:
        """Options that would train something other than they say are refused, in one line."""
        super().__post_init__()
        if self.heldout_every < 0:
            raise LabError(f"--heldout-every must be 0 (never) or a number of steps, not {self.heldout_every}")
        if self.feature_loss < 0:
            raise LabError(f"--feature-loss must be 0 (EAGLE-3's objective) or a positive weight, "
                           f"not {self.feature_loss}")


@dataclass
class MedusaOptions(LoopOptions):
    """`train medusa`: Medusa-1 heads on the target's cached top features (the target frozen)."""
    name: str = opt("medusa", "save as data/eagle/NAME.safetensors")
    heads: int = opt(4, "heads: head k guesses token t+k+1")
    draft_vocab: int = opt(8192, "read out over the target's LM-head rows of the N most frequent training tokens")
    minutes: float = opt(30.0, "wall-clock budget in minutes")
    lr: float = opt(2e-3, "peak learning rate")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.heads < 1 or self.draft_vocab < 1:
            raise LabError(f"--heads and --draft-vocab must be at least 1, got {self.heads} and {self.draft_vocab}")


@dataclass
class JudgeOptions:
    """`train judge`: planted-error labels, a probe per layer, the shipped judge head."""
    mined: int = opt(0, "also label the 2-layer draft's real mismatches on up to N checkable items (the templated "
                     "tasks of lab.judge.tasks' judge half first, then HumanEval; cached under .cache/judge-mined/ and "
                     "resumed; 0: planted errors only)")
    mine_with: str = opt("draft", "whose mismatches --mined labels, comma-separated: draft (the 2-layer draft "
                         "model) and/or eagle1 (the shipped EAGLE-1 head's first drafts)")
    mine_cap: int = opt(8, "at most this many mismatches tried per item")
    with_logits: bool = opt(False, "the probe also reads the token's log-probability and the entropy under the "
                            "target's logits, beside the hidden state")
    layers: list = opt([], "the target's layers to fit a probe on (by default every second one)", nargs="+",
                       parse=int)
    recall: float = opt(0.9, "share of the validation split's wrong tokens the threshold rejects")
    positives_per_answer: int = opt(24, "at most this many correct tokens labelled per planted answer")
    seed: int = opt(0, "seed of the planted mutations, the subsampling and the split")
    out: str | None = opt(None, "write the head here (by default data/judge/judge.json)")


TRAINERS = {"draft": (DraftOptions, "distil a draft model from the target (a CPU wall-clock budget; --resume)"),
            "eagle1": (Eagle1Options, "train an EAGLE head on the target's features"),
            "eagle3": (Eagle3Options, "train an EAGLE-3 head with training-time test"),
            "medusa": (MedusaOptions, "train Medusa-1 heads on the target's top features (the target frozen)"),
            "judge": (JudgeOptions, "planted and mined error labels, a probe per layer: the judge head")}
