"Heavier proofs for fsi_nb.helix: the notebook holds the small ones."
import math
import pytest
import torch
from fsi_nb.helix import helix_attention, helix_attention_loop, helix_clusters, HelixCache, _helix_mask


def _qkv(B, H, T, D, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(3, B, H, T, D, generator=g, dtype=dtype).unbind(0)


@pytest.mark.parametrize('W', [1, 4, 16, 64])
@pytest.mark.parametrize('T', [1, 'W-1', 'W', 'W+1', 300, 1000])
def test_parallel_equals_oracle_fp32(W, T):
    T = eval(T, {'W': W}) if isinstance(T, str) else T
    if T < 1: pytest.skip('empty sequence')
    q, k, v = _qkv(2, 2, T, 16)
    torch.testing.assert_close(helix_attention(q, k, v, W), helix_attention_loop(q, k, v, W), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('S', [1, 2, 3, 7, 8, 32, 100])
def test_every_block_size(S):
    q, k, v = _qkv(1, 2, 333, 8, torch.float64)
    torch.testing.assert_close(helix_attention(q, k, v, 24, S), helix_attention_loop(q, k, v, 24), rtol=1e-12, atol=1e-12)


def test_mask_uses_exactly_the_binary_decomposition():
    T, W, S = 517, 12, 8
    idx, mask = _helix_mask(T, W, S, dtype=torch.float64)
    r = -(-W // S)
    n_window = (r + 1) * S                       # window key columns per block: r older blocks first, own block last
    C = mask.shape[-1] - n_window                # candidate columns, between them
    for t in range(T):
        b, i = divmod(t, S)
        row, n = mask[0, b, i], max(t - W + 1, 0)
        window, candidates = torch.cat([row[:r * S], row[r * S + C:]]), row[r * S:r * S + C]
        pos = (b - r) * S + torch.arange(n_window)
        exact = (pos <= t) & (pos > t - W) & (pos >= 0)
        allowed = window == 0
        assert torch.equal(allowed & exact, exact) and (window[~allowed] == -math.inf).all()
        extra = pos[allowed & ~exact].tolist()   # the size-1 cluster: token t-W, present iff n is odd
        assert extra == ([t - W] if n % 2 else [])
        levels = [round(m / math.log(2)) for m in candidates.tolist() if m > -math.inf] + [0] * len(extra)
        assert sorted(levels) == sorted(z.bit_length() - 1 for _, z in helix_clusters(n))


def test_causality_each_position():
    T, W = 200, 8
    q, k, v = _qkv(1, 1, T, 8, torch.float64)
    base = helix_attention(q, k, v, W)
    for j in (0, 5, 8, 9, 77, 150, 199):
        q2, k2, v2 = q.clone(), k.clone(), v.clone()
        for x in (q2, k2, v2): x[:, :, j] += 1.0
        out = helix_attention(q2, k2, v2, W)
        assert torch.equal(out[:, :, :j], base[:, :, :j])
        assert ((out - base).abs().amax((0, 1, 3))[j:] > 1e-12).all()


def test_gradients_match_oracle():
    q, k, v = (x.requires_grad_() for x in _qkv(2, 2, 150, 8, torch.float64))
    w = torch.randn(2, 2, 150, 8, dtype=torch.float64)
    got = torch.autograd.grad((helix_attention(q, k, v, 16) * w).sum(), (q, k, v))
    want = torch.autograd.grad((helix_attention_loop(q, k, v, 16) * w).sum(), (q, k, v))
    for g, e in zip(got, want): torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


def test_streaming_equals_parallel_fp32():
    T, W = 300, 16
    q, k, v = _qkv(2, 2, T, 16)
    ref = helix_attention(q, k, v, W)
    cache = HelixCache(2, 2, 16, W)
    out = torch.cat([cache.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]) for t in range(T)], 2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_streaming_slots_equal_pyramid_bitwise():
    "Same pairwise means in the same order: the cluster summaries agree to the last bit."
    T, W = 300, 16
    q, k, v = _qkv(1, 2, T, 8)
    cache = HelixCache(1, 2, 8, W, max_len=512)
    for t in range(T): cache.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1])
    other = HelixCache(1, 2, 8, W, max_len=512)
    other.prefill(q, k, v)                       # reads the slots out of the parallel pyramid
    assert torch.equal(cache.active, other.active)
    assert torch.equal(cache.slots[:, :, :, cache.active[0]], other.slots[:, :, :, other.active[0]])   # empty slots: stale (batch of one)
    assert torch.equal(cache.ring, other.ring) and int(cache.pos) == int(other.pos) == T


def test_state_does_not_grow_over_16k_tokens():
    W, T = 16, 16384
    q, k, v = _qkv(1, 1, T, 4)
    cache = HelixCache(1, 1, 4, W, max_len=T)
    tensors = [cache.ring, cache.slots, cache.active, cache.pos]
    sizes = {}
    outs = []
    for t in range(T):
        outs.append(cache.step(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]))
        if t + 1 in (1024, T): sizes[t + 1] = cache.nbytes()
    assert sizes[T] == sizes[1024]
    assert all(a is b for a, b in zip(tensors, [cache.ring, cache.slots, cache.active, cache.pos]))
    torch.testing.assert_close(torch.cat(outs[-512:], 2), helix_attention(q, k, v, W)[:, :, -512:], rtol=1e-4, atol=1e-5)
    # a cache sized for 16K is at most 1.1x one sized for 1K, at the small preset's shape
    assert HelixCache(1, 2, 8, 64, max_len=16384).nbytes() <= 1.1 * HelixCache(1, 2, 8, 64, max_len=1024).nbytes()


def test_bf16():
    q, k, v = _qkv(2, 2, 257, 32)
    ref = helix_attention(q, k, v, 32)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = helix_attention(q, k, v, 32)
    assert out.dtype == torch.bfloat16 and (out.float() - ref).abs().max() < 0.05
    cache = HelixCache(2, 2, 32, 32, dtype=torch.bfloat16)
    steps = torch.cat([cache.step(*(x[:, :, t:t + 1].bfloat16() for x in (q, k, v))) for t in range(257)], 2)
    assert (steps.float() - ref).abs().max() < 0.05


def test_compile_matches_eager():
    torch._dynamo.reset()
    f = torch.compile(helix_attention)
    q, k, v = (x.requires_grad_() for x in _qkv(2, 2, 100, 16))
    out = f(q, k, v, 16)
    torch.testing.assert_close(out, helix_attention(q, k, v, 16), rtol=1e-5, atol=1e-5)
    got = torch.autograd.grad(out.square().sum(), (q, k, v))
    want = torch.autograd.grad(helix_attention(q, k, v, 16).square().sum(), (q, k, v))
    for g, e in zip(got, want): torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    with torch.no_grad():                        # a second length recompiles (or goes dynamic) and stays right
        q, k, v = _qkv(2, 2, 157, 16)
        torch.testing.assert_close(f(q, k, v, 16), helix_attention(q, k, v, 16), rtol=1e-5, atol=1e-5)


def test_cached_mask_survives_inference_mode():
    q, k, v = _qkv(1, 1, 77, 8)
    with torch.inference_mode(): helix_attention(q, k, v, 8)      # the first call builds and caches the mask
    q = q.clone().requires_grad_()
    helix_attention(q, k, v, 8).sum().backward()                   # autograd saves it: must not be an inference tensor
    assert q.grad.abs().sum() > 0


def test_compiled_step_matches_eager():
    torch._dynamo.reset()
    T, W = 80, 8
    q, k, v = _qkv(1, 2, T, 8)
    eager, compiled = HelixCache(1, 2, 8, W, max_len=256), HelixCache(1, 2, 8, W, max_len=256)
    step = torch.compile(compiled.step, fullgraph=True)
    for t in range(T):
        x = [y[:, :, t:t + 1] for y in (q, k, v)]
        torch.testing.assert_close(step(*x), eager.step(*x), rtol=1e-5, atol=1e-6)
    assert torch.equal(eager.active, compiled.active)
