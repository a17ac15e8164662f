"""`python -m lab.kernels.bench`: time the Triton kernels against vectorised PyTorch.

Chain verification (B in {1, 64, 1024}, K in {4, 8}, V = 49152) against a vectorised PyTorch version
of the same rule (for B = 64, K = 8 also `torch.compile` of it); tree attention (B = 1, prefix 512 and
2048, N in {16, 64}) against scaled-dot-product attention with a dense mask. Each row reports the
time, the bytes the algorithm must move and their time at the device's copy bandwidth. Times mean
something on a GPU only; in the CPU interpreter (use --quick) this checks that the script runs."""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import triton

from ..artifacts import repo_path, write_json
from ..paths import KERNEL_BENCH_DIR
from .chain import verify_chain_batched
from .tree_attention import ancestor_bits, tree_attention


def chain_reference_vectorised(draft, q, p, uniforms, noise):
    """lab/verify/lossless.py's `verify_chain` for a whole batch at once, vectorised in PyTorch."""
    b, k = draft.shape
    rows = torch.arange(b, device=p.device)
    px = p[:, :k].gather(-1, draft[..., None]).squeeze(-1)
    qx = torch.ones_like(px) if q is None else q.gather(-1, draft[..., None]).squeeze(-1)
    ok = (qx > 0) & (uniforms * qx < px)
    n = torch.cumprod(ok.int(), dim=1).sum(1)
    rejected = n < k
    p_n = p[rows, n]
    if q is None:
        x = draft.gather(1, n.clamp(max=k - 1)[:, None]).squeeze(1) if k else torch.zeros_like(n)
        w = p_n.scatter(1, x[:, None], 0.0)
        w = torch.where(rejected[:, None], w, p_n)
    else:
        q_n = q[rows, n.clamp(max=k - 1)] if k else torch.zeros_like(p_n)
        w = torch.where(rejected[:, None], torch.clamp(p_n - q_n, min=0.0), p_n)
    w = torch.where((w > 0).any(1, keepdim=True), w, p_n)
    extra = torch.argmax(w / noise, dim=1)
    tokens = torch.full((b, k + 1), -1, dtype=torch.long, device=p.device)
    keep = torch.arange(k, device=p.device)[None] < n[:, None]
    tokens[:, :k] = torch.where(keep, draft, -1)
    tokens[rows, n] = extra
    return n.int(), tokens


@triton.jit
def _empty_kernel(x_ptr):
    pass


def _time(fn, repeats: int) -> float:
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_bandwidth(device: str, mib: int) -> float:
    """Bytes per second of a device-to-device copy, counting bytes read and written."""
    x = torch.empty(mib * 2**20 // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    return 2 * x.numel() * 4 / _time(lambda: y.copy_(x), 10)


def chain_case(b: int, k: int, v: int, device: str, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g), -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g), -1)
    draft = torch.randint(0, v, (b, k), generator=g)
    u = torch.rand(b, k, generator=g)
    noise = torch.empty(b, v).exponential_(1.0, generator=g)
    return [t.to(device) for t in (draft, q, p, u, noise)]


def chain_bytes(b: int, k: int, v: int) -> int:
    """What the rule must read and write: drafts, p and q at the drafts, uniforms, one full
    row each of p, q and noise at the deciding position, and the outputs."""
    return b * (k * (8 + 4 + 4 + 4) + 3 * v * 4 + (k + 1) * 8 + 4)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=repo_path(KERNEL_BENCH_DIR))
    parser.add_argument("--quick", action="store_true", help="tiny shapes, for a CPU smoke run")
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    v = 4096 if args.quick else 49152
    repeats = 2 if args.quick else 20
    bandwidth = copy_bandwidth(device, 8 if args.quick else 1024)
    marker = torch.zeros(1, device=device)
    launch = _time(lambda: _empty_kernel[(1,)](marker), repeats)
    rows = []
    for b in ([1, 4] if args.quick else [1, 64, 1024]):
        for k in (4, 8):
            draft, q, p, u, noise = chain_case(b, k, v, device)
            got = verify_chain_batched(draft, q, p, u, noise)
            ref = chain_reference_vectorised(draft, q, p, u, noise)
            row = {"kernel": "chain", "B": b, "K": k, "V": v,
                   "identical_to_reference": bool(torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])),
                   "triton_s": _time(lambda: verify_chain_batched(draft, q, p, u, noise), repeats),
                   "torch_s": _time(lambda: chain_reference_vectorised(draft, q, p, u, noise), repeats),
                   "bytes": chain_bytes(b, k, v)}
            if b == 64 and k == 8 and device == "cuda":
                compiled = torch.compile(chain_reference_vectorised)
                row["torch_compile_s"] = _time(lambda: compiled(draft, q, p, u, noise), repeats)
            row["byte_bound_s"] = row["bytes"] / bandwidth
            row["goal_s"] = 2 * max(row["byte_bound_s"], launch)
            rows.append(row)
            print(row, flush=True)
    for prefix in ([32] if args.quick else [512, 2048]):
        for n in (16, 64):
            g = torch.Generator().manual_seed(n)
            parents = [-1] + [int(torch.randint(0, j, (1,), generator=g)) for j in range(1, n)]
            q = torch.randn(9, n, 64, generator=g).to(device)
            k_ = torch.randn(3, prefix + n, 64, generator=g).to(device)
            v_ = torch.randn(3, prefix + n, 64, generator=g).to(device)
            bits = ancestor_bits(parents).to(device)
            allowed = torch.ones(n, prefix + n, dtype=torch.bool)
            allowed[:, prefix:] = ((ancestor_bits(parents)[:, :, None] >> torch.arange(64)) & 1).flatten(1)[:, :n] == 1
            allowed = allowed.to(device)

            def sdpa():
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k_.repeat_interleave(3, 0), v_.repeat_interleave(3, 0), attn_mask=allowed)
            err = float((tree_attention(q, k_, v_, bits) - sdpa()).abs().max())
            nbytes = 4 * (2 * 3 * (prefix + n) * 64 + 2 * 9 * n * 64) + bits.numel() * 8
            row = {"kernel": "tree_attention", "prefix": prefix, "N": n, "max_abs_error": err,
                   "triton_s": _time(lambda: tree_attention(q, k_, v_, bits), repeats),
                   "sdpa_dense_mask_s": _time(sdpa, repeats), "bytes": nbytes, "byte_bound_s": nbytes / bandwidth}
            rows.append(row)
            print(row, flush=True)
    name = (torch.cuda.get_device_name(0).replace(" ", "_") if device == "cuda"
            else f"cpu-interpreter-{platform.machine()}")
    command = " ".join(["python -m lab.kernels.bench", *(argv if argv is not None else sys.argv[1:])])
    result = {"command": command, "machine": {"device": name, "torch": torch.__version__, "triton": triton.__version__,
                          "python": platform.python_version(), "interpreter": os.environ.get("TRITON_INTERPRET") == "1",
                          "copy_bandwidth_bytes_per_s": bandwidth, "empty_launch_s": launch},
              "quick": args.quick, "rows": rows}
    out = Path(args.out) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, result)
    print(f"written {out}")


if __name__ == "__main__":
    main()
