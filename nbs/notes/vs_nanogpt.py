"""`tiny`'s training step against a nanoGPT-style GPT of the same size (issue 30: ">= 3x on the machine you have").

The GPT below is written here after nanoGPT's `model.py` design (learned positions, pre-LayerNorm blocks without
biases, causal SDPA, a 4x GELU MLP, tied embeddings, full logits and `F.cross_entropy`), and trained the way nanoGPT's
`train.py` trains on a CPU: fp32 (it uses no autocast on a CPU), unfused AdamW (fused only on CUDA), gradient clipping
at 1.0. A bf16-autocast arm of the same GPT is measured beside it. `tiny` steps with the trainer's own `train_step`
(bf16, the fused loss, fused AdamW). All arms take the same real batches, interleaved in one process.

    python nbs/notes/vs_nanogpt.py DATA_DIR [THREADS]

Results: nbs/notes/compile-pays.md."""
import math, platform, statistics, sys, time, torch
import torch.nn as nn, torch.nn.functional as F
from fsi_nb.runs import resolve_run
from fsi_nb.objectives import make_objective
from fsi_nb.train import build_model, make_optimizer, train_step

class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln_1, self.ln_2, self.heads = nn.LayerNorm(d, bias=False), nn.LayerNorm(d, bias=False), heads
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.fc, self.proj = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)
    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.c_attn(self.ln_1(x)).split(C, dim=2))
        x = x + self.c_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x))))

class GPT(nn.Module):
    def __init__(self, vocab, block, d, layers, heads):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.h, self.ln_f = nn.ModuleList(Block(d, heads) for _ in range(layers)), nn.LayerNorm(d, bias=False)
        self.lm_head = nn.Linear(d, vocab, bias=False); self.wte.weight = self.lm_head.weight
        for n, p in self.named_parameters():   # nanoGPT's init: N(0, 0.02), the residual projections scaled down by depth
            if p.dim() == 2: nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers) if n.endswith('proj.weight') else 0.02)
    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.h: x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)

def gpt_step(model, opt, x, bf16):
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=bf16): loss = model(x[:, :-1], x[:, 1:])
    loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step(); opt.zero_grad(set_to_none=True)
    return loss.item()

data = sys.argv[1] if len(sys.argv) > 1 else 'runs/data'
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
torch.set_num_threads(threads)
spec = resolve_run('tiny', 'vs', data_dir=data, runs_dir='/tmp/vs', precision='bf16', threads=threads)
t, m, dev = spec.train, spec.model, torch.device('cpu')
obj = make_objective(spec, data)
tiny = build_model(spec, data); tiny_opt = make_optimizer(tiny, t)
gpts = {}
for name, bf16 in (('nanoGPT-style GPT, fp32 (its CPU default)', False), ('nanoGPT-style GPT, bf16 autocast', True)):
    torch.manual_seed(0); g = GPT(m.vocab_size, t.seq_len, m.d_model, m.n_layers, m.n_heads)
    gpts[name] = (g, torch.optim.AdamW(g.parameters(), lr=t.lr, betas=(t.beta1, t.beta2), weight_decay=t.weight_decay), bf16)
times = {'tiny (the trainer step, bf16)': [], **{k: [] for k in gpts}}
print(f'{platform.processor() or platform.machine()}, {threads} threads, torch {torch.__version__}; '
      f'd_model {m.d_model}, {m.n_layers} layers, {m.n_heads} heads, vocab {m.vocab_size}, batch {t.batch_size} x {t.seq_len}', flush=True)
for i in range(20):
    x = obj.batch(i, 0, tiny)['input_ids']
    t0 = time.perf_counter(); train_step(tiny, tiny_opt, obj, i, t, dev); dt = time.perf_counter() - t0
    if i >= 4: times['tiny (the trainer step, bf16)'].append(dt)
    for k, (g, opt, bf16) in gpts.items():
        t0 = time.perf_counter(); gpt_step(g, opt, x, bf16); dt = time.perf_counter() - t0
        if i >= 4: times[k].append(dt)
med = {k: statistics.median(v) for k, v in times.items()}
base = med['tiny (the trainer step, bf16)']
for k, v in med.items(): print(f'{k:44s} {1000 * v:7.1f} ms   tiny is {v / base:.2f}x faster')
