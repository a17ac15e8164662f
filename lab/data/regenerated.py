"""The regenerated training set: ShareGPT's first turns answered by the target (`python -m lab data
build`), packed as uint16 token ids with a manifest in data/regen/. Its order is fixed
(`ordered_prompts`); the first `HELDOUT_PROMPTS` are held out."""
from __future__ import annotations

import functools
import hashlib
import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..artifacts import atomic_write
from ..errors import LabError
from ..paths import CACHE_DIR, DATA_DIR
from ..target.load import load_tokenizer
from .prompts import Prompt, chat_ids, humaneval, mt_bench, sharegpt_conversations, sharegpt_first_turns

HELDOUT_PROMPTS = 64


MAX_PROMPT_TOKENS = 384


MAX_NEW_TOKENS = 160


REGEN_DIR = DATA_DIR / "regen"
SHARD_DIR = CACHE_DIR / "regen"  # where a build keeps its shards until it packs them


def regen_files(sampled: bool = False) -> tuple[Path, Path, Path]:
    """(packed set, its manifest, shard folder) of the greedy set or the sampled (T = 1) one."""
    if sampled:
        return REGEN_DIR / "sharegpt_smollm2_t1.npz", REGEN_DIR / "manifest_t1.json", SHARD_DIR / "t1"
    return REGEN_DIR / "sharegpt_smollm2.npz", REGEN_DIR / "manifest.json", SHARD_DIR


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower()).strip()


def _overlaps(text: str, references: list[str]) -> bool:
    t = _normalise(text)
    return any(r in t or (len(t) >= 40 and t in r) for r in references)


def ordered_prompts(tokenizer) -> list[tuple[str, list[int]]]:
    """(id, input ids) of the usable ShareGPT first turns (short, no evaluation overlap), fixed order."""
    references = [_normalise(p.text) for p in mt_bench() + humaneval()]
    prompts = sorted(sharegpt_first_turns(), key=lambda p: p.id)
    random.Random(0).shuffle(prompts)
    out = []
    for p in prompts:
        if _overlaps(p.text, references):
            continue
        ids = chat_ids(tokenizer, p.text)
        if len(ids) <= MAX_PROMPT_TOKENS:
            out.append((p.id, ids))
    return out


@dataclass
class RegenSet:
    tokens: np.ndarray
    offsets: np.ndarray
    prompt_lens: np.ndarray
    split: np.ndarray

    def ids(self, i: int) -> np.ndarray:
        """Token ids (int64) of sequence i: its prompt, then its response."""
        return self.tokens[self.offsets[i]: self.offsets[i + 1]].astype(np.int64)

    def sequences(self, which: str) -> list[tuple[np.ndarray, int]]:
        """(token ids, prompt length) of the `train` or `heldout` split."""
        want = {"heldout": 0, "train": 1}[which]
        return [(self.ids(i), int(self.prompt_lens[i]))
                for i in range(len(self.split)) if self.split[i] == want]


    def subset(self, which: str, limit: int | None = None) -> "RegenSet":
        """The first `limit` sequences of one split, as a RegenSet of its own."""
        want = {"heldout": 0, "train": 1}[which]
        keep = [i for i in range(len(self.split)) if self.split[i] == want][:limit]
        seqs = [self.tokens[self.offsets[i]: self.offsets[i + 1]] for i in keep]
        offsets = np.cumsum([0] + [len(s) for s in seqs]).astype(self.offsets.dtype)
        return RegenSet(np.concatenate(seqs), offsets, self.prompt_lens[keep], self.split[keep])


def training_items(sets: list[RegenSet], prompts: int | None = None) -> list[tuple[int, int, int]]:
    """(set, sequence, prompt length) of every training sequence of `sets`. With `prompts`, only the
    first that many of the first set (0: none of it) and all of the others; LabError if the first set
    has fewer, or if nothing is left to train on."""
    items = [(s, i, int(d.prompt_lens[i])) for s, d in enumerate(sets) for i in range(len(d.split)) if d.split[i] == 1]
    if prompts is None:
        return items
    own = [item for item in items if item[0] == 0]
    if not 0 <= prompts <= len(own):
        raise LabError(f"--train-prompts {prompts}: choose 0 to {len(own)}, the training prompts this set has")
    kept = own[:prompts] + [item for item in items if item[0] != 0]
    if not kept:
        raise LabError("--train-prompts 0 leaves nothing to train on: add --replies N (ShareGPT's replies)")
    return kept


@functools.lru_cache(maxsize=1)
def repeated_prompts() -> frozenset[tuple[int, ...]]:
    """Input ids of every ShareGPT first turn whose text occurs more than once."""
    counts: dict[str, int] = {}
    for p in sharegpt_first_turns():
        counts[p.text] = counts.get(p.text, 0) + 1
    tokenizer = load_tokenizer()
    return frozenset(tuple(chat_ids(tokenizer, text)) for text, n in counts.items() if n > 1)


def unique_heldout(data: RegenSet) -> list[int]:
    """Held-out sequences whose prompt occurs only once among ShareGPT's first turns: ShareGPT repeats
    popular prompts word for word, so figures on this subset cannot have seen their answer in training."""
    repeated = repeated_prompts()
    return [i for i in range(len(data.split))
            if data.split[i] == 0 and tuple(data.ids(i)[: data.prompt_lens[i]].tolist()) not in repeated]


def sharegpt_replies(tokens: int) -> RegenSet:
    """Extra training text that costs no generation: ShareGPT's own first replies to the prompts after
    the regenerated set's (skipping copies of its prompts), each cut to MAX_NEW_TOKENS tokens ending in
    EOS, until they hold `tokens` at least; all training split, cached under .cache/regen. The head still
    learns the target's dynamics from the target's features over that text. LabError if too few."""
    regen = load_regen()
    # the regenerated set (its prompts are skipped) and the reply cut decide the result
    digest = hashlib.sha1(b"".join(a.tobytes() for a in (regen.tokens, regen.offsets, regen.prompt_lens, regen.split))
                          + str(MAX_NEW_TOKENS).encode()).hexdigest()[:12]
    cache = CACHE_DIR / "regen" / f"sharegpt_replies_{tokens}_{digest}.npz"
    if cache.exists():
        with np.load(cache) as z:
            return RegenSet(z["tokens"], z["offsets"], z["prompt_lens"], z["split"])
    replies = _collect_sharegpt_replies(tokens, regen)
    atomic_write(cache, lambda tmp: np.savez(open(tmp, "wb"), tokens=replies.tokens, offsets=replies.offsets,
                                             prompt_lens=replies.prompt_lens, split=replies.split))
    return replies


def _collect_sharegpt_replies(tokens: int, regen: RegenSet) -> RegenSet:
    tokenizer = load_tokenizer()
    used = {tuple(ids[:p].tolist()) for split in ("train", "heldout") for ids, p in regen.sequences(split)}
    first_reply = {}
    for conv in sharegpt_conversations():
        turns = conv.get("conversations") or []
        if len(turns) > 1 and turns[1].get("from") == "gpt" and turns[1].get("value", "").strip():
            first_reply[conv["id"]] = turns[1]["value"].strip()
    sequences, prompt_lens, total = [], [], 0
    for pid, ids in ordered_prompts(tokenizer)[len(regen.split):]:
        if total >= tokens:
            break
        if pid not in first_reply or tuple(ids) in used:
            continue
        reply = tokenizer.encode(first_reply[pid], add_special_tokens=False)[:MAX_NEW_TOKENS - 1]
        reply.append(tokenizer.eos_token_id)
        sequences.append(np.array(ids + reply, np.uint16))
        prompt_lens.append(len(ids))
        total += len(reply)
    if total < tokens:
        raise LabError(f"ShareGPT has only {total} reply tokens after the regenerated prompts; ask for fewer")
    offsets = np.cumsum([0] + [len(s) for s in sequences]).astype(np.int64)
    return RegenSet(np.concatenate(sequences), offsets, np.array(prompt_lens, np.int32),
                    np.ones(len(sequences), np.uint8))


def load_regen(sampled: bool = False) -> RegenSet:
    """The greedy training set, or with `sampled` the one whose answers were sampled at T = 1."""
    path = regen_files(sampled)[0]
    if not path.exists():
        raise LabError(f"{path} is missing: run `python -m lab data build{' --sampled' if sampled else ''}` "
                       "(about 20 minutes on 2 cores)")
    z = np.load(path)
    return RegenSet(z["tokens"], z["offsets"], z["prompt_lens"], z["split"])


def sharegpt_heldout(limit: int | None = None) -> list[Prompt]:
    """The regenerated set's held-out prompts (no draft or head trained on them), in the set's order,
    as ShareGPT texts looked up by id; `chat_ids` of each gives back the set's prompt ids exactly."""
    path = regen_files()[0]
    if not path.exists():
        raise LabError(f"{path} is missing: run `python -m lab data build` (about 20 minutes on 2 cores)")
    z = np.load(path)
    ids = [str(i) for i, split in zip(z["ids"], z["split"]) if split == 0][:limit]
    by_id = {p.id: p for p in sharegpt_first_turns()}
    return [Prompt(i, by_id[i].text, "sharegpt-heldout") for i in ids]
