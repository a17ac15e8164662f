"""Triton chain verification agrees bit for bit with the reference (lab/verify/lossless.py), given the
same random inputs, over many random shapes and the edge cases. On a CPU it runs in Triton's
interpreter (see conftest.py); on a GPU, compiled."""
import pytest
import torch

from lab.kernels import verify_chain_batched, verify_chain_greedy_batched
from lab.sampling import RandomStream
from lab.verify.lossless import verify_chain, verify_chain_greedy

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def random_case(b, k, v, seed, one_hot=False, closeness=1.0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g) * 2, -1)
    q = torch.softmax(torch.log(p[:, :k]) + closeness * torch.randn(b, k, v, generator=g), -1)
    rng = RandomStream(seed)
    draft = torch.stack([torch.stack([torch.argmax(q[i, j] / rng.exponential(v)) for j in range(k)])
                         for i in range(b)]) if k else torch.zeros(b, 0, dtype=torch.long)
    return draft, (None if one_hot else q), p, rng.uniforms(b * k).reshape(b, k), rng.exponential(b, v)


def reference(draft, q, p, u, noise):
    rows = [verify_chain(draft[i].tolist(), None if q is None else q[i], p[i], u[i], noise[i])
            for i in range(draft.shape[0])]
    return [r.n_accepted for r in rows], [r.tokens for r in rows]


def transposed(t):
    """The same values, laid out non-contiguously."""
    return t.transpose(0, 1).contiguous().transpose(0, 1)


def run_kernel(draft, q, p, u, noise, block_v=None):
    block_v = block_v or (1024 if p.shape[-1] > 4096 else 128)
    n, tokens = verify_chain_batched(*(None if t is None else t.to(DEVICE) for t in (draft, q, p, u, noise)),
                                     block_v=block_v)
    n = n.cpu().tolist()
    return n, [tokens[i, : n[i] + 1].cpu().tolist() for i in range(len(n))]


@pytest.mark.parametrize("b,k,v,seed,one_hot,closeness", [
    (4, 3, 300, 0, False, 1.0),    # V not a multiple of the block
    (3, 1, 129, 1, False, 0.3),    # K = 1
    (5, 4, 257, 2, True, 1.0),     # one-hot drafts (EAGLE-style)
    (6, 2, 64, 3, False, 0.05),    # close drafts: mostly accepted
    (6, 5, 200, 4, False, 3.0),    # far drafts: mostly rejected
    (2, 0, 100, 5, False, 1.0),    # K = 0: just the bonus draw (AR)
    (2, 4, 49152, 6, False, 1.0),  # the target's real vocabulary, default block size
])
def test_kernel_matches_reference_on_random_cases(b, k, v, seed, one_hot, closeness):
    args = random_case(b, k, v, seed, one_hot, closeness)
    assert run_kernel(*args) == reference(*args)


def test_all_accepted_none_accepted_p_equal_q_and_q_zero():
    draft, q, p, u, noise = random_case(4, 3, 150, 9)
    # row 0: u = 0 accepts every draft with p > 0 -> bonus
    u[0] = 0.0
    # row 1: u = 1 with q >= p at the drafted token rejects the first draft
    u[1] = 1.0
    # row 2: p == q and u = 1: forced rejection with an all-zero residual -> race over p
    q[2] = p[2, :3]
    u[2] = 1.0
    # row 3: q = 0 at the drafted token: rejected even with u = 0
    q[3, 0, draft[3, 0]] = 0.0
    u[3] = 0.0
    n_ref, tok_ref = reference(draft, q, p, u, noise)
    assert n_ref[0] == 3 and n_ref[2] == 0 and n_ref[3] == 0
    assert run_kernel(draft, q, p, u, noise) == (n_ref, tok_ref)


@pytest.mark.parametrize("b,k,v,seed", [(4, 3, 300, 0), (3, 1, 77, 1), (5, 4, 1000, 2)])
def test_greedy_kernel_matches_reference(b, k, v, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, k + 1, v, generator=g)
    argmax = logits.argmax(-1)
    draft = argmax[:, :k].clone()
    draft[1, min(1, k - 1)] = (draft[1, min(1, k - 1)] + 1) % v  # a mismatch in row 1
    logits[2, 0, 5] = logits[2, 0, 7] = logits[2, 0].max() + 1.0  # a tie: lowest id wins
    draft[2, 0] = 5
    n, tokens = verify_chain_greedy_batched(draft.to(DEVICE), logits.to(DEVICE), block_v=128)
    for i in range(b):
        ref = verify_chain_greedy(draft[i].tolist(), logits[i].argmax(-1).tolist())
        assert int(n[i]) == ref.n_accepted and tokens[i, : ref.n_accepted + 1].cpu().tolist() == ref.tokens


def test_bad_input_is_rejected_before_launch(no_launch):
    draft, q, p, u, noise = random_case(2, 2, 50, 0)
    with pytest.raises(ValueError, match="shapes disagree"):
        verify_chain_batched(draft, q, p[:, :2].contiguous(), u, noise)
    with pytest.raises(ValueError, match="dtype"):
        verify_chain_batched(draft, q, p.double(), u, noise)
    with pytest.raises(ValueError, match="contiguous"):
        verify_chain_batched(draft, q, p.transpose(0, 1).contiguous().transpose(0, 1), u, noise)
    with pytest.raises(ValueError, match=r"\[0, 50\)"):
        verify_chain_batched(draft + 100, q, p, u, noise)
    with pytest.raises(ValueError, match="q must have shape"):
        verify_chain_batched(draft, q[:, :1].contiguous(), p, u, noise)


def greedy_case():
    logits = torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(0))
    return logits.argmax(-1)[:, :2].contiguous(), logits


@pytest.mark.parametrize("spoil,message", [
    pytest.param(lambda d, l: (d, l[:, :2].contiguous()), "logits must have shape", id="mismatched-shapes"),
    pytest.param(lambda d, l: (d, l.double()), "logits must have dtype", id="float64-logits"),
    pytest.param(lambda d, l: (d.float(), l), "draft must have dtype", id="float-draft"),
    pytest.param(lambda d, l: (d, transposed(l)), "logits must be contiguous", id="non-contiguous-logits"),
    pytest.param(lambda d, l: (transposed(d), l), "draft must be contiguous", id="non-contiguous-draft"),
    pytest.param(lambda d, l: (d + 50, l), r"\[0, 50\)", id="token-too-large"),
    pytest.param(lambda d, l: (d - 50, l), r"\[0, 50\)", id="negative-token"),
])
def test_greedy_kernel_rejects_bad_input_before_launch(spoil, message, no_launch):
    draft, logits = spoil(*greedy_case())
    with pytest.raises(ValueError, match=message):
        verify_chain_greedy_batched(draft, logits)


def test_chain_kernels_reject_an_empty_vocabulary(no_launch):
    draft = torch.zeros(1, 0, dtype=torch.long)  # K = 0: no draft token that could be out of range
    with pytest.raises(ValueError, match="vocabulary is empty"):
        verify_chain_batched(draft, None, torch.zeros(1, 1, 0), torch.zeros(1, 0), torch.zeros(1, 0))
    with pytest.raises(ValueError, match="vocabulary is empty"):
        verify_chain_greedy_batched(draft, torch.zeros(1, 1, 0))


def test_kernels_package_does_not_import_transformers():
    import subprocess
    import sys
    code = "import sys, lab.kernels; sys.exit(1 if 'transformers' in sys.modules else 0)"
    env = {"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


@pytest.mark.parametrize("one_hot", [False, True])
def test_vectorised_reference_of_the_benchmark_matches_the_loop_reference(one_hot):
    from lab.kernels.bench import chain_reference_vectorised
    draft, q, p, u, noise = random_case(8, 4, 300, 11, one_hot)
    u[0] = 0.0
    n, tokens = chain_reference_vectorised(draft, q, p, u, noise)
    n = n.tolist()
    assert (n, [tokens[i, : n[i] + 1].tolist() for i in range(8)]) == reference(draft, q, p, u, noise)
