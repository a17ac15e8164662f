"""Tree-masked attention kernel against PyTorch attention with the dense tree mask."""
import pytest
import torch

from lab.kernels.tree_attention import ancestor_bits, tree_attention

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = 1e-5  # fp32: online softmax sums in a different order than PyTorch's


def random_parents(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [-1] + [int(torch.randint(0, j, (1,), generator=g)) for j in range(1, n)]


def dense_reference(q, k, v, parents):
    h, n, d = q.shape
    h_kv, total, _ = k.shape
    prefix = total - n
    allowed = torch.zeros(n, total, dtype=torch.bool)
    allowed[:, :prefix] = True
    for i in range(n):
        j = i
        while j >= 0:
            allowed[i, prefix + j] = True
            j = parents[j]
    kk = k.repeat_interleave(h // h_kv, 0)
    vv = v.repeat_interleave(h // h_kv, 0)
    return torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=allowed)


def test_ancestor_bits_encode_the_tree():
    bits = ancestor_bits([-1, 0, 0, 1])
    assert bits[:, 0].tolist() == [0b1, 0b11, 0b101, 0b1011]
    wide = ancestor_bits(list(range(-1, 69)))  # a 70-node chain: node 69 sees all 70
    assert wide.shape == (70, 2) and wide[69, 0] == -1 and wide[69, 1] == 0b111111


@pytest.mark.parametrize("n,prefix,heads,kv_heads,d,seed", [
    (7, 13, 9, 3, 64, 0),    # the target's GQA layout
    (1, 5, 2, 1, 16, 1),     # a single node
    (40, 0, 3, 3, 32, 2),    # no prefix
    (70, 9, 4, 2, 16, 3),    # more than 64 nodes: two words per node
])
def test_tree_attention_matches_dense_mask(n, prefix, heads, kv_heads, d, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, n, d, generator=g)
    k = torch.randn(kv_heads, prefix + n, d, generator=g)
    v = torch.randn(kv_heads, prefix + n, d, generator=g)
    parents = random_parents(n, seed)
    out = tree_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), ancestor_bits(parents).to(DEVICE)).cpu()
    assert (out - dense_reference(q, k, v, parents)).abs().max() < TOLERANCE


def test_bad_shapes_are_rejected(no_launch):
    q, k = torch.randn(9, 4, 64), torch.randn(3, 10, 64)
    with pytest.raises(ValueError, match="multiple of KV heads"):
        tree_attention(torch.randn(8, 4, 64), k, k.clone(), ancestor_bits([-1, 0, 0, 1]))
    with pytest.raises(ValueError, match="bits"):
        tree_attention(q, k, k.clone(), ancestor_bits([-1, 0]))
    with pytest.raises(ValueError, match="dtype"):
        tree_attention(q.double(), k, k.clone(), ancestor_bits([-1, 0, 0, 1]))


@pytest.mark.parametrize("name", ["q", "k", "v", "bits"])
def test_non_contiguous_inputs_are_rejected(name, no_launch):
    g = torch.Generator().manual_seed(0)
    inputs = {"q": torch.randn(9, 4, 64, generator=g), "k": torch.randn(3, 10, 64, generator=g),
              "v": torch.randn(3, 10, 64, generator=g), "bits": ancestor_bits([-1, 0, 0, 1])}
    inputs[name] = torch.stack([inputs[name]] * 2, -1)[..., 0]  # same values, every other element
    assert not inputs[name].is_contiguous()
    with pytest.raises(ValueError, match=f"{name} must be contiguous"):
        tree_attention(**inputs)
