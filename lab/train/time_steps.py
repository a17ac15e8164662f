"""Seconds per `train eagle3` step, this code against an earlier commit, taken in turns
(`python -m lab.train.time_steps --against 2671ca1`; the result is data/eagle/trainer_steps.json).

Timings on these machines drift by 10-20% between runs, so a change to the trainer is measured
as a ratio within one run: each round times the earlier commit, then this code, each in a process
of its own with that code first on PYTHONPATH (the earlier commit checked out by `git worktree`
under the cache) and this file's `measure` as the program, so the timing code is the same for both.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from lab.errors import LabError
from lab.paths import DATA_DIR

STEPS_PATH = DATA_DIR / "eagle" / "trainer_steps.json"
CONFIGS = (1, 7)  # training-time test steps S: the curriculum's two stages


def measure(batches: int = 6, batch: int = 8, seed: int = 0) -> dict:
    """Seconds per step (loss, backward, AdamW) at S = 1 and S = 7 on `batches` fixed batches of the
    regenerated set, float32, after one warm-up step. Code with the argmax memo is also timed on a
    second pass over the same batches: every pass after a training run's first one runs that way."""
    import random
    import time

    import torch

    import lab
    from lab.data import load_regen, training_items
    from lab.drafters.eagle3 import Eagle3Head
    from lab.target.load import load_target
    from lab.train import eagle3
    from lab.train.features import target_features

    torch.manual_seed(seed)
    target = load_target()
    for param in target.parameters():
        param.requires_grad_(False)
    data = load_regen()
    feats = target_features(target, data, eagle3.cached_layers(target), progress=False)
    rng = random.Random(seed)
    train = training_items([data], None)
    hidden = target.config.hidden_size
    fixed = [eagle3.make_batch([(data.ids(i), feats[i], p) for _, i, p in rng.sample(train, batch)], hidden)
             for _ in range(batches + 1)]
    target_head = target.lm_head.weight.detach().float()
    memo = "argmax_memo" in eagle3.ttt_loss.__code__.co_varnames
    result = {"root": str(Path(lab.__file__).parent.parent), "argmax_memo": memo}
    for steps in CONFIGS:
        head = Eagle3Head(target, eagle3.training_vocabulary([data], eagle3.DRAFT_VOCAB))
        optim = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-4)
        seen: dict = {}

        def step(b) -> float:
            began = time.perf_counter()
            loss = eagle3.ttt_loss(head, b, target_head, steps, **({"argmax_memo": seen} if memo else {}))[0]
            optim.zero_grad(set_to_none=True)
            loss.backward()
            optim.step()
            return round(time.perf_counter() - began, 3)

        step(fixed[0])
        result[f"S{steps}_first_pass"] = [step(b) for b in fixed[1:]]
        if memo:
            result[f"S{steps}_later_pass"] = [step(b) for b in fixed[1:]]
    return result


def _worktree(commit: str) -> Path:
    from lab.paths import CACHE_DIR, ROOT
    folder = CACHE_DIR / f"worktree-{commit[:12]}"
    if not folder.exists():
        made = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), commit],
                              capture_output=True, text=True)
        if made.returncode:
            raise LabError(f"cannot check out {commit!r} to time it: {made.stderr.strip().splitlines()[-1]}")
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="the earlier commit to time beside this code")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure()))
        return
    from lab.artifacts import git_commit, machine, write_json
    from lab.paths import CACHE_DIR, ROOT
    if not args.against:
        raise LabError("say which earlier commit to time against: --against COMMIT")
    commit = git_commit()
    codes = {args.against: _worktree(args.against), "this code": ROOT}
    rounds = []
    for _ in range(args.rounds):
        for name, root in codes.items():
            env = {**os.environ, "PYTHONPATH": str(root), "LAB_CACHE": str(CACHE_DIR)}
            run = subprocess.run([sys.executable, "-P", __file__, "--child"], env=env, capture_output=True, text=True)
            if run.returncode:
                raise LabError(f"timing {name} failed: {run.stderr.strip().splitlines()[-1]}")
            rounds.append({**json.loads(run.stdout.strip().splitlines()[-1]), "code": name})
    medians = {}
    for name in codes:
        mine = [r for r in rounds if r["code"] == name]
        for key in mine[0]:
            if key.startswith("S"):
                medians.setdefault(name, {})[key] = statistics.median(x for r in mine for x in r[key])
    old, new = medians[args.against], medians["this code"]
    speedup = {key: round(old[f"S{s}_first_pass"] / new[key], 2)
               for s in CONFIGS for key in new if key.startswith(f"S{s}_")}
    write_json(STEPS_PATH, {
        "what": "seconds per train-eagle3 step (loss, backward, AdamW), float32, batch 8, regenerated set; "
                "medians over rounds run in turns; speed-up = the earlier commit's seconds / this code's",
        "command": f"python -m lab.train.time_steps --against {args.against} --rounds {args.rounds}",
        "commit": commit, "against": args.against, "machine": machine(),
        "median_seconds": medians, "speedup": speedup, "rounds": rounds})
    print(json.dumps({"median_seconds": medians, "speedup": speedup}, indent=1))


if __name__ == "__main__":
    try:
        main()
    except LabError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
