"Heavier proofs for fsi_nb.layers / attention / model than a notebook cell should hold."
import math, pytest, torch, torch.nn.functional as F
from dataclasses import replace
from fsi_nb.config import FSIEdgeConfig, PRESETS, get_preset
from fsi_nb.layers import assert_scaled_close
from fsi_nb.attention import (HybridAttention, local_attention, struct_attention, token_structure,
                              byte_structure_tables, _code_like_ids)
from fsi_nb.model import FSIEdgeModel, chunked_cross_entropy, unwrap

@pytest.fixture(autouse=True)
def one_thread():
    "These tests run many small ops: one thread is faster, and steadier on a shared machine."
    n = torch.get_num_threads(); torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

def small_cfg(moe=False, **kw):
    "A model shrunk to test size: d_model 48, vocab 512, window 16 (Helix merges often at T=300)."
    base = dict(vocab_size=512, d_model=48, n_layers=2, n_heads=6, kv_heads=2, d_ff=96, max_seq_len=128,
                window_size=16, struct_lines=4, local_heads=2, struct_heads=2, global_heads=2)
    if moe: base.update(n_routed=8, n_shared=1, top_k=4, expert_d_ff=32)
    base.update(kw)
    return FSIEdgeConfig(**base)

def make(cfg, seed=0):
    torch.manual_seed(seed)
    m = FSIEdgeModel(cfg)
    with torch.no_grad():  # QK-norm gains and struct slopes away from their init so every term matters
        for b in m.layers:
            b.attn.q_norm.weight.uniform_(0.5, 1.5); b.attn.k_norm.weight.uniform_(0.5, 1.5)
            b.attn.struct_bias.uniform_(-2, 1)
    return m

# ---------------------------------------------------------------- parallel == streaming

@pytest.mark.parametrize('moe', [False, True], ids=['dense', 'moe'])
def test_streaming_equals_parallel(moe):
    m = make(small_cfg(moe)).eval()
    ids = _code_like_ids(2, 300, 512, seed=1)
    with torch.no_grad():
        par = m(ids).logits
        state = m.init_state(2)
        seq = torch.stack([m.step(ids[:, t], state) for t in range(ids.shape[1])], 1)
    rel = ((seq - par).abs().max() / par.abs().max()).item()
    assert rel <= 1e-4, rel

def test_streaming_with_indent_tables():
    "Multi-byte newline tokens with indentation, installed as tokenizer tables, agree in both forms too."
    m = make(small_cfg()).eval()
    t = byte_structure_tables(400)
    for i in range(300, 400): t['newline'][i], t['indent'][i], t['depth_delta'][i] = True, i % 4, (i % 3) - 1
    m.set_structure_tables(**t)
    ids = _code_like_ids(2, 200, 512, seed=2)
    ids[:, ::9] = torch.randint(300, 400, ids[:, ::9].shape)
    with torch.no_grad():
        par = m(ids).logits
        state = m.init_state(2)
        seq = torch.stack([m.step(ids[:, t], state) for t in range(ids.shape[1])], 1)
    assert ((seq - par).abs().max() / par.abs().max()).item() <= 1e-4

@pytest.mark.parametrize('moe,T,kinds', [(False, 1, (2, 2, 2)), (False, 15, (2, 2, 2)), (False, 16, (2, 2, 2)), (False, 17, (2, 2, 2)),
                                          (False, 100, (2, 2, 2)), (True, 37, (2, 2, 2)),
                                          (False, 50, (6, 0, 0)), (False, 50, (0, 6, 0)), (False, 50, (0, 0, 6)), (False, 50, (3, 1, 2))])
def test_prefill_then_step_equals_parallel(moe, T, kinds):
    "A prompt prefilled in parallel leaves the state stepping would have; the steps after it match the parallel logits."
    m = make(small_cfg(moe, local_heads=kinds[0], struct_heads=kinds[1], global_heads=kinds[2])).eval()
    t = byte_structure_tables(512)
    t['newline'][300:310], t['indent'][300:310] = True, torch.arange(10)
    m.set_structure_tables(**t)
    L = T + 40
    ids = _code_like_ids(3, L, 512, seed=T)
    ids[:, ::11] = torch.randint(300, 310, ids[:, ::11].shape)
    with torch.no_grad():
        par = m(ids).logits
        state, ref = m.init_state(3), m.init_state(3)
        last = m.prefill(ids[:, :T], state)
        for i in range(T): m.step(ids[:, i], ref)
        for a, b in zip((state.pos, state.bracket, state.indent, state.n_anchors), (ref.pos, ref.bracket, ref.indent, ref.n_anchors)):
            assert torch.equal(a, b)
        for a, b in zip(state.layers, ref.layers):
            for name in ('local_k', 'local_v', 'anchor_k', 'anchor_v', 'anchor_depth'):
                assert_scaled_close(getattr(a, name), getattr(b, name), rtol=1e-5)
        rest = torch.stack([m.step(ids[:, i], state) for i in range(T, L)], 1)
    assert_scaled_close(last, par[:, T - 1], rtol=1e-4)
    assert_scaled_close(rest, par[:, T:], rtol=1e-4)
    with pytest.raises(ValueError, match='Fix'): m.prefill(ids[:, :5], state)

def test_generate_greedy_matches_parallel_argmax():
    m = make(small_cfg(moe=True)).eval()
    prompt = _code_like_ids(2, 40, 512, seed=3)
    out = m.generate(prompt, 25, greedy=True)
    with torch.no_grad(): assert torch.equal(m(out).logits[:, 39:-1].argmax(-1), out[:, 40:])

# ---------------------------------------------------------------- head kinds vs slow references

def struct_reference(q, k, v, depth, anchor, w, S):
    B, H, T, D = q.shape
    out = torch.zeros_like(q)
    for b in range(B):
        for t in range(T):
            keys = [p for p in range(t) if anchor[b, p]][-S:] + [t]
            for h in range(H):
                s = torch.stack([q[b, h, t] @ k[b, h, p] / D ** 0.5
                                 - (F.softplus(w[h]) * (depth[b, t] - depth[b, p]).abs() if p != t else 0) for p in keys])
                out[b, h, t] = s.softmax(0) @ v[b, h, keys]
    return out

@pytest.mark.parametrize('T,S', [(1, 4), (50, 1), (150, 8), (150, 20)])
def test_struct_matches_reference(T, S):
    torch.manual_seed(T + S)
    ids = _code_like_ids(2, T, 512, seed=T)
    depth, anchor = token_structure(ids, **byte_structure_tables(512))
    q, k, v = torch.randn(3, 2, 3, T, 8).unbind(0)
    w = torch.randn(3)
    torch.testing.assert_close(struct_attention(q, k, v, depth, anchor, w, S), struct_reference(q, k, v, depth, anchor, w, S),
                               rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize('T,W', [(1, 1), (5, 1), (100, 3), (257, 16), (1000, 64), (129, 32), (640, 32)])
def test_local_matches_dense_reference(T, W):
    q, k, v = torch.randn(3, 2, 2, T, 8).unbind(0)
    s = (q @ k.transpose(-1, -2)) / 8 ** 0.5
    everything = torch.ones(T, T, dtype=torch.bool)
    band = everything.tril() & ~everything.tril(-W)   # written out, not `_band_mask`: key j <= query i and j > i - W
    ref = s.masked_fill(~band, float('-inf')).softmax(-1) @ v
    assert_scaled_close(local_attention(q, k, v, W), ref, rtol=1e-5)

# ---------------------------------------------------------------- causality

@pytest.mark.parametrize('kinds', [(6, 0, 0), (0, 6, 0), (0, 0, 6), (2, 2, 2)], ids=['local', 'struct', 'global', 'hybrid'])
@pytest.mark.parametrize('moe', [False, True], ids=['dense', 'moe'])
def test_causality(kinds, moe):
    cfg = small_cfg(moe, local_heads=kinds[0], struct_heads=kinds[1], global_heads=kinds[2])
    m = make(cfg).eval()
    ids = _code_like_ids(1, 120, 512, seed=4)
    with torch.no_grad():
        ref = m(ids).logits
        for j in (0, 15, 16, 63, 119):
            ids2 = ids.clone(); ids2[0, j] = 10 if ids[0, j] != 10 else 40
            new = m(ids2).logits
            assert torch.equal(new[:, :j], ref[:, :j]), j
            assert (new[:, j] - ref[:, j]).abs().max() > 1e-5

# ---------------------------------------------------------------- gradients, compile, precision

@pytest.mark.parametrize('moe', [False, True], ids=['dense', 'moe'])
@pytest.mark.parametrize('return_logits', [True, False])
def test_every_parameter_gets_a_gradient(moe, return_logits):
    m = make(small_cfg(moe)).train()
    ids = _code_like_ids(8, 128, 512, seed=5)   # 1024 tokens: every routed expert gets some
    m(ids, labels=ids, return_logits=return_logits).loss.backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing, missing

@pytest.mark.parametrize('moe', [False, True], ids=['dense', 'moe'])
def test_compile_matches_eager(moe):
    "Loss and every gradient; on two threads, where inductor's backward of the local heads' unfold windows was wrong."
    torch.set_num_threads(2)   # the autouse fixture restores the count
    m = make(small_cfg(moe, n_layers=1)).train()
    ids = _code_like_ids(2, 64, 512, seed=6)
    eager = m(ids, labels=ids, return_logits=False)
    compiled = torch.compile(m, fullgraph=True)   # fullgraph: any graph break (a host sync, a disabled function) fails
    out = compiled(ids, labels=ids, return_logits=False)
    assert_scaled_close(out.loss, eager.loss, rtol=1e-4)
    out.loss.backward()
    g = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad(); eager.loss.backward()
    for n, p in m.named_parameters(): assert_scaled_close(g[n], p.grad, rtol=1e-4, msg=n)
    # the compiled wrapper's keys carry _orig_mod.; unwrap gives the plain module's
    assert any(k.startswith('_orig_mod.') for k in compiled.state_dict())
    keys = list(unwrap(compiled).state_dict())
    assert keys == list(m.state_dict()) and not any('_orig_mod' in k for k in keys)
    fresh = FSIEdgeModel(m.cfg); fresh.load_state_dict(unwrap(compiled).state_dict())

@pytest.mark.parametrize('moe', [False, True], ids=['dense', 'moe'])
def test_tiny_preset_step_has_no_graph_break(moe):
    "The tiny preset's training forward (and an MoE version of it) traces as one graph: no break, no host sync."
    torch._dynamo.reset()
    cfg = get_preset('tiny').model
    if moe: cfg = replace(cfg, n_routed=8, n_shared=1, top_k=2, expert_d_ff=32)
    m = make(cfg).train()
    ids = _code_like_ids(2, 64, 512, seed=6)
    for autocast in (False, True):
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=autocast):
            ex = torch._dynamo.explain(lambda ids: m(ids, labels=ids, return_logits=False).loss)(ids)
        assert (ex.graph_count, ex.graph_break_count) == (1, 0), [str(b.reason)[:200] for b in ex.break_reasons]

@pytest.mark.parametrize('moe', [False, True], ids=['dense', 'moe'])
def test_bf16_autocast_close_to_fp32(moe):
    m = make(small_cfg(moe)).train()
    ids = _code_like_ids(4, 128, 512, seed=7)
    fp32 = m(ids, labels=ids)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        bf16 = m(ids, labels=ids, return_logits=False).loss
        bf16_full = m(ids, labels=ids)
    # the logits, not just the loss: a fresh model's loss is ~ln(vocab) whatever attention does. Measured 0.004-0.005
    # here; bf16 attention that ignored its mask gave 0.15-0.17
    rel = ((bf16_full.logits.float() - fp32.logits).abs().max() / fp32.logits.abs().max()).item()
    assert rel < 3e-2, rel
    assert abs(bf16.item() - fp32.loss.item()) < 1e-2 and abs(bf16_full.loss.item() - fp32.loss.item()) < 1e-2
    bf16.backward()

def test_chunked_ce_matches_plain_at_full_vocab():
    torch.manual_seed(0)
    h, w = torch.randn(600, 64), torch.randn(32768, 64) * 0.05
    y = torch.randint(0, 32768, (600,)); y[::5] = -100
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    F.cross_entropy(h1 @ w1.T, y, ignore_index=-100).backward()
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss = chunked_cross_entropy(h2, w2, y, chunk_size=256); loss.backward()
    torch.testing.assert_close(loss, F.cross_entropy(h @ w.T, y, ignore_index=-100))
    torch.testing.assert_close(h2.grad, h1.grad); torch.testing.assert_close(w2.grad, w1.grad)

# ---------------------------------------------------------------- sizes

def test_count_params_equals_numel_for_every_preset():
    from fsi_nb.sizing import count_params
    for name, p in PRESETS.items():
        with torch.device('meta'): m = FSIEdgeModel(p.model)
        assert count_params(p.model).total == sum(t.numel() for t in m.parameters()), name
    with torch.device('meta'): tiny = FSIEdgeModel(PRESETS['tiny'].model)
    assert sum(t.numel() for t in tiny.parameters()) == 2_220_418

@pytest.mark.parametrize('name', ['tiny', 'small', 'med'])
def test_step0_loss_is_ln_vocab(name):
    cfg = get_preset(name).model
    torch.manual_seed(0)
    m = FSIEdgeModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (4, 128))
    with torch.no_grad(): loss = m(ids, labels=ids, return_logits=False).loss.item()
    assert abs(loss - math.log(cfg.vocab_size)) < 0.05, loss

def test_seed_smoke_config():
    config = FSIEdgeConfig(d_model=64, n_layers=2, n_heads=4, kv_heads=2, d_ff=256, max_seq_len=128, window_size=32,
                           local_heads=2, struct_heads=1, global_heads=1)
    model = FSIEdgeModel(config)
    ids = torch.randint(0, config.vocab_size, (2, 128))
    batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), labels=ids)
    loss = model(**batch).loss
    loss.backward()
    assert math.isfinite(loss.item())

def test_generation_state_bounded_16k():
    "A state sized for a 16K-token context is at most 1.1x one sized for 1K, and prefill and stepping do not grow it."
    m = make(small_cfg(n_layers=1)).eval()
    ids = _code_like_ids(1, 16384 + 32, 512, seed=8)
    sizes = {}
    with torch.no_grad():
        for L in (1024, 16384):
            state = m.init_state(1, max_len=L + 32)   # each sized for its own context, not the default 2**20
            empty = state.nbytes()
            m.prefill(ids[:, :L], state)    # == stepping through them (test_prefill_then_step_equals_parallel)
            for t in range(L, L + 32): m.step(ids[:, t], state)
            assert state.pos.item() == L + 32
            assert state.nbytes() == empty, 'the state never grows'
            sizes[L] = empty
    assert sizes[16384] <= 1.1 * sizes[1024], sizes

def test_h100_architecture_smoke():
    "The cloud preset's real architecture (105M params, MoE, d_model 512) runs a CPU step; its step-0 loss is ln(vocab) too."
    cfg = get_preset('h100').model
    torch.manual_seed(0)
    m = FSIEdgeModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (1, 64))
    out = m(ids, labels=ids, return_logits=False)
    assert abs(out.aux['lm_loss'].item() - math.log(cfg.vocab_size)) < 0.05, out.aux
    out.loss.backward()
    assert len(out.routing) == cfg.n_layers and m.layers[0].ffn.router.weight.grad is not None

def test_real_tokenizer_structure_tables(tmp_path):
    "With a trained BPE tokenizer's tables installed, depths follow the code and streaming still equals parallel."
    import glob
    from fsi_nb.tokenizer import train_tokenizer, load_tokenizer, structure_tables
    files = sorted(glob.glob('/usr/lib/python3*/json/*.py'))[:10] + sorted(glob.glob('/usr/lib/python3*/email/*.py'))[:10]
    assert files, 'no stdlib sources found'
    tok = load_tokenizer(train_tokenizer([__import__('pathlib').Path(f) for f in files], tmp_path / 'tok', vocab_size=1024))
    tables = structure_tables(tok)
    cfg = small_cfg(vocab_size=1024)
    m = make(cfg).eval()
    m.set_structure_tables(**tables)
    code = "def f(x):\n    if x:\n        return [x, (x + 1)]\n    return None\n\nclass A:\n    def g(self):\n        pass\n"
    ids = torch.tensor([tok.encode(code).ids])
    depth, anchor = token_structure(ids, m.newline_table, m.depth_delta, m.indent_table)
    assert anchor.sum().item() >= 5                       # the newlines are anchors, whatever tokens hold them
    text_at = [tok.decode(ids[0, :i + 1].tolist()) for i in range(ids.shape[1])]
    i_ret = next(i for i, s in enumerate(text_at) if s.endswith('return [x'))
    assert depth[0, i_ret].item() >= 3                    # indent 2 + one open bracket
    assert depth[0, -1].item() == 0                       # everything closed, back at column 0
    with torch.no_grad():
        par = m(ids).logits
        state = m.init_state(1)
        seq = torch.stack([m.step(ids[:, t], state) for t in range(ids.shape[1])], 1)
    assert_scaled_close(seq, par, rtol=1e-4)
