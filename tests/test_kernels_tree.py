"""Triton tree verification agrees bit for bit with lab.verify.verify_tree(_greedy)."""
import pytest
import torch
from test_kernels_chain import transposed

from lab.kernels import verify_tree_batched, verify_tree_greedy_batched
from lab.sampling import RandomStream
from lab.verify.lossless import verify_tree, verify_tree_greedy

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def random_trees(b, n, v, seed, temperature=1.0):
    """B random parents-first trees whose children are the top tokens of a noisy copy of the
    parent's target row (distinct per sibling group), like an EAGLE drafter's top-k."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, n, v, generator=g) * 2
    p = torch.softmax(logits / temperature, -1)
    tokens = torch.zeros(b, n, dtype=torch.long)
    parents = torch.full((b, n), -1, dtype=torch.long)
    for i in range(b):
        ranks: dict[int, torch.Tensor] = {}
        used: dict[int, int] = {}
        for j in range(1, n):
            parent = int(torch.randint(0, j, (1,), generator=g))
            if parent not in ranks:
                ranks[parent] = torch.argsort(logits[i, parent] + 0.3 * torch.randn(v, generator=g), descending=True)
            parents[i, j] = parent
            tokens[i, j] = ranks[parent][used.get(parent, 0)]
            used[parent] = used.get(parent, 0) + 1
    rng = RandomStream(seed)
    return tokens, parents, p, rng.uniforms(b * n).reshape(b, n), rng.exponential(b, v)


def outputs(length, path, out):
    return [(path[i, : length[i]].tolist(), out[i, : length[i]].tolist()) for i in range(len(length))]


def run_kernel(tokens, parents, p, u, noise, block_v=32):
    return outputs(*[t.cpu() for t in verify_tree_batched(
        *(t.to(DEVICE) for t in (tokens, parents, p, u, noise)), block_v=block_v)])


@pytest.mark.parametrize("b,n,v,seed,temperature", [
    (4, 8, 300, 0, 0.5), (6, 12, 129, 1, 0.3), (5, 1, 100, 2, 1.0), (3, 20, 1000, 3, 3.0), (2, 6, 49152, 4, 0.3)])
def test_tree_kernel_matches_reference(b, n, v, seed, temperature):
    tokens, parents, p, u, noise = random_trees(b, n, v, seed, temperature)
    block = 1024 if v > 4096 else 128
    got = outputs(*[t.cpu() for t in verify_tree_batched(
        *(t.to(DEVICE) for t in (tokens, parents, p, u, noise)), block_v=block)])
    want = []
    for i in range(b):
        r = verify_tree(tokens[i].tolist(), parents[i].tolist(), p[i], u[i], noise[i])
        want.append((r.path, r.tokens))
    assert got == want
    if temperature < 1 and n > 1:  # peaked targets: some drafts must have been accepted
        assert max(len(path) for path, _ in want) > 1


def test_tree_kernel_edge_cases():
    tokens, parents, p, u, noise = random_trees(3, 7, 64, 5)
    u[0] = 0.0                      # row 0: the first child with p > 0 at every node passes
    u[1] = 1.0                      # row 1: every child fails -> residual with siblings zeroed
    p[2, 0] = 0.0                   # row 2: p concentrated on the root's children only
    kids = tokens[2][parents[2] == 0]
    p[2, 0, kids] = 1.0 / len(kids)
    u[2] = 1.0
    got = run_kernel(tokens, parents, p, u, noise)
    for i in range(3):
        r = verify_tree(tokens[i].tolist(), parents[i].tolist(), p[i], u[i], noise[i])
        assert got[i] == (r.path, r.tokens), i


def first_child_path(parents):
    """The path that takes the first child of every node, down to a leaf."""
    path = [0]
    while children := (parents == path[-1]).nonzero().flatten().tolist():
        path.append(children[0])
    return path


def test_tree_kernel_accepts_the_first_child_down_to_a_leaf_when_every_uniform_is_zero():
    tokens, parents, p, u, noise = random_trees(3, 7, 64, 5)
    assert bool((p > 0).all())      # so u = 0 accepts the first child of every node
    u.zero_()
    for i, (path, out) in enumerate(run_kernel(tokens, parents, p, u, noise)):
        want = first_child_path(parents[i])
        assert len(want) > 1 and path == want, i
        assert out[:-1] == tokens[i, want[1:]].tolist() and len(out) == len(want), i  # drafts, then a bonus


def test_tree_kernel_accepts_no_child_when_every_uniform_is_one():
    tokens, parents, p, u, noise = random_trees(3, 7, 64, 5)
    u.fill_(1.0)                    # u * remaining mass < p(x) never holds: the mass includes p(x) and more
    for i, (path, out) in enumerate(run_kernel(tokens, parents, p, u, noise)):
        assert path == [0] and len(out) == 1, i
        assert out[0] not in tokens[i][parents[i] == 0].tolist(), i  # the residual zeroed the rejected children


@pytest.mark.parametrize("b,n,v,seed", [(4, 8, 300, 0), (3, 15, 77, 1)])
def test_greedy_tree_kernel_matches_reference(b, n, v, seed):
    tokens, parents, p, _, _ = random_trees(b, n, v, seed, temperature=0.2)
    logits = torch.log(p)
    got = outputs(*[t.cpu() for t in verify_tree_greedy_batched(
        tokens.to(DEVICE), parents.to(DEVICE), logits.to(DEVICE), block_v=128)])
    for i in range(b):
        r = verify_tree_greedy(tokens[i].tolist(), parents[i].tolist(), logits[i].argmax(-1).tolist())
        assert got[i] == (r.path, r.tokens)


def test_bad_trees_are_rejected_before_launch(no_launch):
    tokens, parents, p, u, noise = random_trees(2, 5, 50, 0)
    bad = parents.clone()
    bad[0, 2] = 3
    with pytest.raises(ValueError, match="parents must come before children"):
        verify_tree_batched(tokens, bad, p, u, noise)
    twins = tokens.clone()
    siblings = (parents[0] == 0).nonzero().flatten()[:2]
    if len(siblings) == 2:
        twins[0, siblings[1]] = twins[0, siblings[0]]
        with pytest.raises(ValueError, match="distinct"):
            verify_tree_batched(twins, parents, p, u, noise)
    with pytest.raises(ValueError, match="tree shapes disagree"):
        verify_tree_batched(tokens[:, :4].contiguous(), parents, p, u, noise)
    with pytest.raises(ValueError, match="uniforms"):
        verify_tree_batched(tokens, parents, p, u[:, :2].contiguous(), noise)


def expect_refusal(greedy, message, **changes):
    """Run either tree kernel on a small valid case with `changes` spoiling it; it must refuse
    with `message`. The greedy kernel reads p as its logits and takes no random inputs."""
    tokens, parents, p, u, noise = random_trees(2, 5, 50, 0)
    a = {"tokens": tokens, "parents": parents, "p": p, "uniforms": u, "noise": noise, **changes}
    with pytest.raises(ValueError, match=message):
        if greedy:
            verify_tree_greedy_batched(a["tokens"], a["parents"], a["p"])
        else:
            verify_tree_batched(**a)


KERNELS = pytest.mark.parametrize("greedy", [False, True], ids=["sampling", "greedy"])


@KERNELS
def test_tree_kernels_reject_mismatched_shapes(greedy, no_launch):
    tokens, parents, p, _, _ = random_trees(2, 5, 50, 0)
    expect_refusal(greedy, "tree shapes disagree", p=p[:, :4].contiguous())
    expect_refusal(greedy, "tree shapes disagree", parents=parents[:1])
    expect_refusal(greedy, "must be a 3-d tensor", p=p[0])


@KERNELS
def test_tree_kernels_reject_wrong_dtypes(greedy, no_launch):
    tokens, parents, p, u, noise = random_trees(2, 5, 50, 0)
    expect_refusal(greedy, "tokens must have dtype", tokens=tokens.float())
    expect_refusal(greedy, "parents must have dtype", parents=parents.float())
    expect_refusal(greedy, "(p|logits) must have dtype", p=p.double())
    if not greedy:
        expect_refusal(greedy, "uniforms must have dtype", uniforms=u.double())
        expect_refusal(greedy, "noise must have dtype", noise=noise.double())


@KERNELS
def test_tree_kernels_reject_non_contiguous_inputs(greedy, no_launch):
    tokens, parents, p, u, noise = random_trees(2, 5, 50, 0)
    expect_refusal(greedy, "tokens must be contiguous", tokens=transposed(tokens))
    expect_refusal(greedy, "parents must be contiguous", parents=transposed(parents))
    expect_refusal(greedy, "(p|logits) must be contiguous", p=transposed(p))
    if not greedy:
        expect_refusal(greedy, "uniforms must be contiguous", uniforms=transposed(u))
        expect_refusal(greedy, "noise must be contiguous", noise=transposed(noise))


@KERNELS
def test_tree_kernels_reject_tokens_out_of_range(greedy, no_launch):
    tokens, _, _, _, _ = random_trees(2, 5, 50, 0)
    for bad in (50, -1):            # one child of row 1 outside [0, V)
        spoilt = tokens.clone()
        spoilt[1, 4] = bad
        expect_refusal(greedy, r"\[0, 50\)", tokens=spoilt)


@KERNELS
def test_tree_kernels_reject_a_tree_without_its_root(greedy, no_launch):
    tokens, parents, p, u, _ = random_trees(2, 5, 50, 0)
    expect_refusal(greedy, "needs its root",
                   tokens=tokens[:, :0], parents=parents[:, :0], p=p[:, :0], uniforms=u[:, :0])


@KERNELS
def test_tree_kernels_reject_an_empty_vocabulary(greedy, no_launch):
    root = {"tokens": torch.zeros(2, 1, dtype=torch.long), "parents": torch.full((2, 1), -1),
            "uniforms": torch.zeros(2, 1)}
    expect_refusal(greedy, "vocabulary is empty", p=torch.zeros(2, 1, 0), noise=torch.zeros(2, 0), **root)
