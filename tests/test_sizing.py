"""fsi_nb.sizing: arithmetic against configs small enough to add up on paper, the CLI as a real subprocess,
every error path, and the sizing run notebook under papermill."""
import json, math, os, subprocess, sys
from dataclasses import replace
from pathlib import Path

import pytest, torch

from fsi_nb.config import FSIEdgeConfig, TrainConfig, PRESETS, get_preset
from fsi_nb.sizing import (GPU_PEAKS, activation_bytes, attention_keys, chinchilla_optimal, count_params, device_memory,
                           flops_per_token, has_widget_frontend, measure_cpu_peak, optimizer_steps, peak_flops,
                           MEASURED_MFU, measured_mfu, plan_run,
                           plot_tokens_vs_params, popcount_sum, presets_table, report, seed_claims_table,
                           size_for_budget, throughput, tokens_in_budget, training_memory)

ROOT = Path(__file__).resolve().parents[1]

# Hand config 1, dense: vocab 100, d 8, 1 layer, 2 heads of 4 (1 local, 0 struct, 1 global), 1 kv head, d_ff 16.
DENSE = dict(vocab_size=100, d_model=8, n_layers=1, n_heads=2, kv_heads=1, d_ff=16, max_seq_len=4, window_size=2, struct_lines=1)
# Hand config 2, MoE: vocab 100, d 8, 2 layers, 4 heads of 2 (2/1/1), 2 kv heads, 4 routed + 1 shared experts of 4, top-2.
MOE = dict(vocab_size=100, d_model=8, n_layers=2, n_heads=4, kv_heads=2, n_routed=4, n_shared=1, top_k=2, expert_d_ff=4)


def test_params_dense_by_hand():
    c = count_params(FSIEdgeConfig(**DENSE))
    # layer: attn_norm 8 + wq 64 + wk 32 + wv 32 + wo 64 + qk_norm 2*4 + ffn_norm 8 + SwiGLU 3*8*16 = 600
    assert c.total == 800 + 600 + 8 == 1408
    assert c.active == c.total and c.non_embedding == 608
    assert c.by_component['attention_local'] == c.by_component['attention_global'] == 64   # one head: 4 rows of wq + 4 cols of wo
    assert c.by_component['attention_struct'] == c.by_component['struct_bias'] == 0
    assert (c.by_component['attention_kv'], c.by_component['qk_norm'], c.by_component['norms']) == (64, 8, 24)
    assert count_params(FSIEdgeConfig(**DENSE, tie_embeddings=False)).total == 1408 + 800


def test_params_moe_by_hand():
    c = count_params(FSIEdgeConfig(**MOE))
    # layer: norms 16 + wq 64 + wk 32 + wv 32 + wo 64 + qk_norm 4 + struct 1 + router 32 + 5 experts * 96 = 725
    assert c.total == 800 + 2 * 725 + 8 == 2258
    # active: 1 shared + 2 routed experts of the 4
    assert c.active == 800 + 2 * (725 - 2 * 96) + 8 == 1874
    assert (c.by_component['router'], c.by_component['shared_experts'], c.by_component['routed_experts']) == (64, 192, 768)
    assert c.active_by_component['routed_experts'] == 384 and c.by_component['dense_ffn'] == 0
    assert sum(c.by_component.values()) == c.total and sum(c.active_by_component.values()) == c.active


def test_params_reference_presets():
    assert count_params('tiny').total == 2_220_418 and count_params('tiny').non_embedding == 123_266
    h = count_params('h100')
    assert (h.total, h.active) == (105_068_568, 39_008_280)
    for name in PRESETS:   # a preset name, a Preset and its model give the same answer
        assert count_params(name) == count_params(get_preset(name)) == count_params(get_preset(name).model)


def test_flops_by_hand():
    f = flops_per_token(FSIEdgeConfig(**DENSE), 4)
    assert f['matmul'] == 6 * (64 + 32 + 32 + 64 + 384) == 3456
    assert f['lm_head'] == 6 * 100 * 8 and f['embedding'] == 0
    # keys per query over t = 0..3, window 2: 1, 2, 2, 2 -> 1.75; Helix adds popcount(t-1): 0, 0, 1, 1 -> 0.5
    assert f['attention_local'] == pytest.approx(12 * 4 * 1.75)
    assert f['attention_global'] == pytest.approx(12 * 4 * 2.25)
    assert f['attention_struct'] == 0
    assert f['total'] == pytest.approx(3456 + 4800 + 84 + 108)
    k = attention_keys(FSIEdgeConfig(**DENSE), 4)
    assert (k['local'], k['struct'], k['global']) == (1.75, 1.75, 2.25)   # struct: min(t+1, struct_lines+1)
    assert flops_per_token(FSIEdgeConfig(**DENSE)) == f                  # default seq_len: max_seq_len


def test_flops_moe_counts_active_experts_only():
    cfg = FSIEdgeConfig(**MOE)
    f = flops_per_token(cfg, 16)
    matmul = 2 * (64 + 32 + 32 + 64 + 32 + 3 * 96)   # per layer: attention projections, router, 3 active experts
    assert f['matmul'] == 6 * matmul
    more_experts = flops_per_token(replace(cfg, n_routed=16), 16)
    assert more_experts['matmul'] - f['matmul'] == 6 * 2 * 8 * 12        # only the router grows


def test_popcount_sum_brute_force():
    for n in list(range(0, 70)) + [1023, 1024, 1025, 5000]:
        assert popcount_sum(n) == sum(bin(i).count('1') for i in range(n))


def test_memory_by_hand():
    cfg, train = FSIEdgeConfig(**DENSE), TrainConfig(batch_size=2, seq_len=4)
    a = activation_bytes(cfg, 4, 'fp32', loss='plain')
    # attention: norm (2*8+1)*4 + shared input 8*4 + QK-Norm (2*4+1)*(2+1)*4 + q,k,v (2+2)*4*4 + out 2*4*4 + lse 2*4
    #            + wo input 2*4*4 + Helix 1 head * 2 * ceil(log2 4) * 4 * 4 = 408;  ffn: 68 + 32 + 4*16*4 = 356
    assert a['layer'] == 408 + 356
    assert a['head'] == 68 + 32 + 100 * 12 and a['layer_input'] == 32
    m = training_memory(cfg, train, 'fp32', loss='plain')
    assert (m['weights'], m['master_weights'], m['grads'], m['adam_states']) == (4 * 1408, 0, 4 * 1408, 8 * 1408)
    assert m['activations'] == 8 * (764 + 1300) and m['total'] == 16 * 1408 + 8 * 2064 and m['loss_buffers'] == 0
    assert training_memory(cfg, train, 'fp32', checkpointing=True, loss='plain')['activations'] == 8 * (32 + 764 + 1300)
    b = training_memory(cfg, train, 'bf16')
    assert (b['weights'], b['master_weights']) == (2 * 1408, 4 * 1408)
    assert training_memory(cfg, replace(train, batch_size=4), 'fp32')['activations'] == 2 * training_memory(cfg, train, 'fp32')['activations']
    assert training_memory(cfg, replace(train, grad_accum=8), 'fp32') == training_memory(cfg, train, 'fp32')  # accumulation adds none
    # the trainer's fused loss: the head keeps the final norm (68) and d loss / d hidden (8 * 4); besides, the lm_head's
    # fp32 gradient (100 * 8 * 4) and one chunk of logits, fp32 and its fp32 cast: all 8 tokens in one chunk (8 * 100 * 8)
    c = training_memory(cfg, train, 'fp32')
    assert activation_bytes(cfg, 4, 'fp32')['head'] == 68 + 32
    assert c['activations'] == 8 * (764 + 100) and c['loss_buffers'] == 100 * 8 * 4 + 8 * 100 * 8
    assert c['total'] == 16 * 1408 + 8 * 864 + 3200 + 6400


def test_checkpointing_saves_memory_on_deep_models():
    m, c = training_memory('h100'), training_memory('h100', checkpointing=True)
    assert c['activations'] < m['activations'] / 2 and c['total'] < m['total']


def test_budget_arithmetic():
    cfg = FSIEdgeConfig(**DENSE)
    assert tokens_in_budget(cfg, 1, 'a100', 0.5, 4) == int(312e12 * 0.5 * 3600 / 8448)
    tp = throughput(cfg, 'h100', 0.25, 4)
    assert tp['tokens_per_sec'] == pytest.approx(989e12 * 0.25 / 8448)
    assert tp['precision'] == 'bf16' and tp['peak_source'].startswith('stated: NVIDIA H100')
    assert throughput(cfg, 'h100', 0.25, 4, 'fp32')['peak_flops'] == 494e12   # TF32, which the trainer turns on
    assert chinchilla_optimal(6 * 1e6 * 20e6) == (1_000_000, 20_000_000)
    n, d = chinchilla_optimal(1e21)
    assert d == pytest.approx(20 * n, rel=1e-6) and 6 * n * d == pytest.approx(1e21, rel=1e-6)
    assert optimizer_steps(98_304 * 10 + 5, 4, 12, 2048) == 10   # whole steps only
    assert device_memory('h200') == 141e9


def test_gpu_peaks_are_datasheet_dense_bf16():
    assert {g: GPU_PEAKS[g]['bf16'] for g in ('a100', 'h100', 'h200')} == {'a100': 312e12, 'h100': 989e12, 'h200': 989e12}
    for g in GPU_PEAKS: assert 'datasheet' in GPU_PEAKS[g]['source']


def test_cpu_peak_probe_is_cached(tmp_path):
    import torch
    m = measure_cpu_peak(seconds=0.5, cache_dir=tmp_path)
    assert not m['cached'] and m['fp32'] > 0 and m['bf16'] > 0
    assert torch.__version__ in m['key'] and f"{torch.get_num_threads()} threads" in m['key']
    cache = json.loads((tmp_path / 'cpu_peak.json').read_text())
    assert set(cache) == {m['key']} and cache[m['key']]['fp32'] == m['fp32']
    again = measure_cpu_peak(cache_dir=tmp_path)
    assert again['cached'] and again['fp32'] == m['fp32']
    assert not measure_cpu_peak(seconds=0.2, cache_dir=tmp_path, refresh=True)['cached']


def test_report_keys_and_defaults():
    r = report('h100')
    for k in ('params_total', 'params_active', 'flops_per_token', 'tokens_in_budget', 'memory', 'optimizer_steps', 'chinchilla'):
        assert k in r
    assert (r['gpu'], r['hours'], r['mfu'], r['precision']) == ('h100', 8.0, 0.0702, 'bf16')   # the H200 row: an H100 was never measured
    assert r['tokens_in_budget'] == tokens_in_budget('h100', 8, 'h100', 0.0702, 2048) and 'fallback' in r['mfu_source']
    assert report('h200')['gpu'] == 'h200' and report('cipher')['gpu'] == 'h100'
    assert report('tiny', gpu='a100', hours=2, mfu=0.4)['tokens_in_budget'] == tokens_in_budget('tiny', 2, 'a100', 0.4, 128)
    assert report('tiny', gpu='a100')['mfu_source'].startswith('stated guess')


def test_plan_run_against_a_hand_computation():
    tps = 0.0702 * 989e12 / flops_per_token('h100', 2048)['total']                 # the h100 row, on an H100's datasheet peak
    budget_steps = int(tps * 7.5 * 0.97 * 3600 // 98_304)                           # 16 x 3 x 2048 tokens a step
    pl = plan_run('h100', 7.5, 'h100', corpus_tokens=13_900_000)
    assert (pl['budget_steps'], pl['max_steps'], pl['capped']) == (budget_steps, 27_800_000 // 98_304, True)
    assert pl['tokens'] <= 2 * 13_900_000 and pl['schedule_hours'] <= 7.5 and pl['warmup_steps'] == 282 // 10
    assert pl['passes'] == pytest.approx(budget_steps * 98_304 / 13_900_000, rel=1e-3)
    assert f"= {pl['passes']:,.0f} passes over the 13.9M-token corpus; capped at 2 epochs = 27.8M tokens (max_steps 282)" in pl['warning']
    # a corpus the budget cannot cover twice: no cap, no warning, and the schedule ends inside the budget
    big = plan_run('h100', 7.5, 'h100', corpus_tokens=budget_steps * 98_304)
    assert not big['capped'] and big['warning'] is None and big['max_steps'] == budget_steps and big['schedule_hours'] <= 7.5 * 0.97
    # exactly at the cap: not capped; one step more of budget than the cap: capped
    assert plan_run('h100', 7.5, 'h100', corpus_tokens=budget_steps * 98_304 // 2)['capped'] is False
    assert plan_run('h100', 7.5, 'h100', corpus_tokens=(budget_steps - 1) * 98_304 // 2)['capped'] is True
    over = plan_run('h100', 7.5, 'h100', mfu=0.2, corpus_tokens=13_900_000, epochs=3)
    assert over['mfu'] == 0.2 and over['max_steps'] == 41_700_000 // 98_304 and 'capped at 3 epochs' in over['warning']
    cpu = plan_run('tiny', 1, 'cpu', tokens_per_sec=4456)                          # a rate a CPU run measured wins
    assert cpu['tokens_per_sec'] == 4456 and cpu['max_steps'] == int(4456 * 0.97 * 3600 // 2048)


@pytest.mark.parametrize('kw, message', [(dict(corpus_tokens=0), 'prepare a corpus'), (dict(epochs=0), 'epochs'),
                                         (dict(corpus_tokens=40_000), 'less than one optimizer step'), (dict(hours=0), 'hours'),
                                         (dict(tokens_per_sec=-1), 'tokens/s'), (dict(mfu=2), 'fraction')])
def test_plan_run_errors(kw, message):
    with pytest.raises(ValueError, match='Fix') as e: plan_run('h100', **{'gpu': 'h100', **kw})
    assert message in str(e.value)


def test_measured_table_sources_and_fallbacks():
    for k, m in MEASURED_MFU.items():
        assert m['source'] and (('12_bench' in m['source']) if k[1] != 'cpu' else ('bench-cpu' in m['source']))
    assert measured_mfu('h100', 'h200')['measured'] and not measured_mfu('h100', 'h100')['measured']
    assert measured_mfu('a100', 'a100')['row'] == ('a100', 'h200', 'bf16')
    assert measured_mfu('custom', 'h200')['source'].startswith('stated guess')


def test_seed_claims_table():
    t = seed_claims_table()
    by = t.set_index('claim')
    assert by.loc['CPU recipe: 4K-tiny parameters', 'calculator'] == 2_220_418
    assert by.loc['CPU recipe: 4K-tiny parameters', 'seed'] == 4.7e3
    assert by.loc['cipher_cloud_h100: total parameters', 'ratio'] == pytest.approx(105_068_568 / 200e6)
    implied = by.loc['... MFU that 144M tokens implies', 'seed']
    assert implied == pytest.approx(144e6 * flops_per_token('h100', 2048)['total'] / (8 * 3600 * 989e12))
    assert implied < 0.01
    assert {'claim', 'seed', 'calculator', 'ratio', 'unit', 'note'} <= set(t.columns)


def test_plot_and_presets_table():
    fig = plot_tokens_vs_params(hours=4, mfu=0.2, gpus=('a100',), presets=['h100'])
    x, y = fig.axes[0].lines[0].get_data()
    assert y[-1] * 6 * x[-1] == pytest.approx(312e12 * 0.2 * 4 * 3600)
    t = presets_table(gpu='a100')
    assert list(t.index) == list(PRESETS) and (t.device == 'a100').all()


def test_presets_a100_h200_follow_the_sizing_rule():
    for gpu, seq in (('a100', 2048), ('h200', 4096)):
        s = size_for_budget(gpu, seq_len=seq)
        assert (s.model, s.train) == (PRESETS[gpu].model, PRESETS[gpu].train)
        r = report(gpu, mfu=0.4)   # the rule's MFU (at the measured one the preset's plan takes about 8x longer)
        assert 6.9 < r['planned_hours'] < 7.0 and r['fits_memory']


@pytest.mark.parametrize('call, message', [
    (lambda: count_params('h1OO'), 'tiny, small, med, h100, a100, h200, cipher'),
    (lambda: report('nope'), 'Fix: use one of tiny'),
    (lambda: report('h100', gpu='v100'), 'a100, h100, h200, cpu'),
    (lambda: tokens_in_budget('h100', 8, gpu='tpu'), 'a100, h100, h200, cpu'),
    (lambda: peak_flops('h100', 'fp8'), "'bf16' or 'fp32'"),
    (lambda: activation_bytes('h100', 2048, 'fp16'), "'bf16' or 'fp32'"),
    (lambda: attention_keys('h100', 0), 'seq_len'),
    (lambda: throughput('h100', mfu=40), 'fraction'),
    (lambda: throughput('h100', mfu=0), 'fraction'),
    (lambda: tokens_in_budget('h100', -1), 'hours'),
    (lambda: chinchilla_optimal(0), 'FLOPs'),
    (lambda: optimizer_steps(100, 1, 0, 8), 'grad_accum'),
    (lambda: device_memory('v100'), 'a100, h100, h200, cpu'),
    (lambda: size_for_budget('cpu'), 'CPU presets'),
])
def test_errors_name_problem_and_fix(call, message):
    with pytest.raises(ValueError, match='Fix') as e: call()
    assert message in str(e.value)


def test_wrong_type_is_a_type_error():
    with pytest.raises(TypeError, match='Fix'): count_params(42)


def _cli(*args, env=None):
    return subprocess.run([sys.executable, '-m', 'fsi_nb.sizing', *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_cli_json():
    p = _cli('h100', '--hours', '8', '--gpu', 'h100', '--mfu', '0.4', '--json')
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert (r['params_total'], r['params_active']) == (105_068_568, 39_008_280)
    assert r['tokens_in_budget'] == tokens_in_budget('h100', 8, 'h100', 0.4)
    assert r['flops_per_token'] == pytest.approx(flops_per_token('h100', 2048)['total'])
    assert r['peak_source'].startswith('stated:')
    assert r['mfu'] == 0.4 and r['mfu_source'] == 'given (mfu override)'


def test_cli_default_mfu_is_the_measured_table_and_the_plan_is_capped():
    p = _cli('h100', '--corpus-tokens', '13900000')
    assert p.returncode == 0, p.stderr
    assert 'at MFU 0.0702' in p.stdout and "12_bench 'Results on a GPU': one H200" in p.stdout and 'fallback: h100 not measured on h100' in p.stdout
    assert 'capped at 2 epochs = 27.8M tokens (max_steps 282)' in p.stdout and '-p epochs E' in p.stdout
    q = json.loads(_cli('h100', '--corpus-tokens', '2000000000', '--mfu', '0.01', '--json').stdout)['plan']
    assert q['mfu'] == 0.01 and not q['capped'] and q['warning'] is None                    # 1% MFU buys 1.1G tokens: under 2 passes of 2G
    assert q['max_steps'] == int(0.01 * 989e12 / flops_per_token('h100', 2048)['total'] * 8 * 0.97 * 3600 // 98_304)


def test_cli_text_and_measured_cpu_peak(tmp_path):
    p = _cli('tiny', '--gpu', 'cpu', '--hours', '1', env={'HOME': str(tmp_path)})
    assert p.returncode == 0, p.stderr
    assert '2,220,418' in p.stdout and 'measured:' in p.stdout
    assert (tmp_path / '.cache' / 'fsi_nb' / 'cpu_peak.json').exists()


@pytest.mark.parametrize('args, message', [(['h1OO'], 'tiny, small, med'), (['h100', '--gpu', 'v100'], 'a100, h100, h200, cpu'),
                                           (['h100', '--mfu', '40'], 'fraction')])
def test_cli_errors(args, message):
    p = _cli(*args)
    assert p.returncode == 2 and message in p.stderr and 'Traceback' not in p.stderr


def test_cli_imports_nothing_heavy():
    code = "import sys, fsi_nb.sizing; print([m for m in ('torch', 'pandas', 'matplotlib') if m in sys.modules])"
    p = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.stdout.strip() == '[]', p.stdout + p.stderr


def test_no_widget_frontend_outside_jupyter():
    assert has_widget_frontend() is False


def test_sizing_notebook_under_papermill(tmp_path):
    out_nb, out_dir = tmp_path / 'sz.ipynb', tmp_path / 'sizing'
    p = subprocess.run([sys.executable, '-m', 'papermill', 'nbs/sizing.ipynb', str(out_nb), '-k', 'python3', '--cwd', 'nbs',
                        '-p', 'preset', 'h100', '-p', 'hours', '8', '-p', 'out_dir', str(out_dir)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    nb = json.loads(out_nb.read_text())
    text = '\n'.join(''.join(o.get('text', '')) for c in nb['cells'] if c['cell_type'] == 'code' for o in c.get('outputs', []))
    for name in PRESETS:   # total and active parameters of every preset are printed
        c = count_params(name)
        assert f"{c.total:,}" in text and f"{c.active:,}" in text, name
    assert 'widgets skipped' in text
    assert any('image/png' in o.get('data', {}) for c in nb['cells'] for o in c.get('outputs', []))
    assert {f.name for f in out_dir.iterdir()} == {'presets.csv', 'seed_claims.csv', 'tokens_vs_params.png'}
    injected = [c for c in nb['cells'] if 'injected-parameters' in c['metadata'].get('tags', [])]
    assert injected and "preset = \"h100\"" in ''.join(injected[0]['source'])   # the parameters tag survived nbdev-clean


SHRUNK = {'tiny': {}, 'h100': dict(n_layers=2, d_model=256, expert_d_ff=64, vocab_size=4096, window_size=32)}  # MoE, all head kinds


def saved_per_token(model, cfg, seq_len, precision, loss):
    "Bytes per token autograd keeps for one step of `model` (saved tensors + returned logits), by the batch-2 minus batch-1 difference."
    import torch
    def per_step(batch):
        seen = {}
        def pack(t): seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes(); return t
        ids = torch.randint(0, cfg.vocab_size, (batch, seq_len))
        with torch.autocast('cpu', dtype=torch.bfloat16, enabled=precision == 'bf16'), \
             torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(input_ids=ids, labels=ids, return_logits=loss == 'plain')
        if out.logits is not None:
            held = out.logits.untyped_storage()    # alive until the step ends, saved or not
            seen.setdefault(held.data_ptr(), held.nbytes())
        return sum(seen.values())
    return (per_step(2) - per_step(1)) / seq_len           # the batch difference leaves only per-token tensors

def shrunk_model(name):
    import torch
    model_mod = pytest.importorskip('fsi_nb.model')
    cfg = replace(PRESETS[name].model, **SHRUNK[name])
    torch.manual_seed(0)
    return model_mod.FSIEdgeModel(cfg), cfg


@pytest.mark.parametrize('name, seq_len', [('tiny', 128), ('h100', 128)])   # 128 > window: Helix clusters in play
@pytest.mark.parametrize('precision', ['fp32', 'bf16'])
def test_activation_estimate_matches_the_real_model(name, seq_len, precision):
    """Per-token activations of the built model (saved tensors + the returned logits) against `activation_bytes`."""
    model, cfg = shrunk_model(name)
    measured = saved_per_token(model, cfg, seq_len, precision, 'plain')
    a = activation_bytes(cfg, seq_len, precision, loss='plain')
    estimate = cfg.n_layers * a['layer'] + a['head'] - 4 * cfg.vocab_size   # hooks cannot see the logits' gradient
    assert measured / estimate == pytest.approx(1, abs=0.1), (measured, estimate)


@pytest.mark.parametrize('name', ['tiny', 'h100'])
@pytest.mark.parametrize('precision', ['fp32', 'bf16'])
def test_fused_loss_head_estimate_matches_the_real_model(name, precision):
    """What the trainer's fused loss saves per token, against `activation_bytes(loss='chunked')`: the same model run
    both ways, so the layers cancel and only the head is compared."""
    model, cfg = shrunk_model(name)
    fused, full = (saved_per_token(model, cfg, 128, precision, loss) for loss in ('chunked', 'plain'))
    est = {loss: activation_bytes(cfg, 128, precision, loss)['head'] for loss in ('chunked', 'plain')}
    assert full - fused == pytest.approx(est['plain'] - 4 * cfg.vocab_size - est['chunked'], rel=0.02), (full - fused, est)


def test_sizing_notebook_explorer_in_a_real_kernel(tmp_path):
    """Outside papermill (here nbclient, as JupyterLab would) the explorer is shown and draws its table and plot widgets."""
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.read(ROOT / 'nbs' / 'sizing.ipynb', as_version=4)
    params = nb.cells[0]
    assert 'parameters' in params.metadata.get('tags', [])
    params.source += f"\nout_dir = {str(tmp_path)!r}\npreset = 'a100'\ngpu = 'a100'"
    NotebookClient(nb, kernel_name='python3', timeout=300, store_widget_state=True,
                   resources={'metadata': {'path': str(ROOT / 'nbs')}}).execute()
    state = nb.metadata['widgets']['application/vnd.jupyter.widget-state+json']['state']
    tables = [m['state'].get('value', '') for m in state.values() if m['model_name'] == 'HTMLModel']
    assert any('533,271,748' in t for t in tables)                                                 # the a100 table
    plots = [b for m in state.values() if m['model_name'] == 'ImageModel' for b in m['state'].get('buffers', []) + m.get('buffers', [])]
    assert any(b.get('path') == ['value'] and len(b.get('data', '')) > 10_000 for b in plots)      # the plot, a real PNG
    shown = [o for c in nb.cells if c.cell_type == 'code' for o in c.get('outputs', [])]
    assert any('application/vnd.jupyter.widget-view+json' in o.get('data', {}) for o in shown)


# ---- FLOPs per token against an independent count (torch.utils.flop_counter) on a real forward + backward

def _counted(model, ids, **kw):
    "Matmul FLOPs torch counts for one forward + backward, by op (SDPA's math path, so its matmuls are counted)."
    from torch.utils.flop_counter import FlopCounterMode
    from torch.nn.attention import sdpa_kernel, SDPBackend
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        out = model(input_ids=ids, labels=ids, **kw)
        (out if isinstance(out, torch.Tensor) else out.loss).backward()
    return {str(k).split('.')[-1]: v for k, v in fc.get_flop_counts()['Global'].items()}

@pytest.mark.parametrize('moe', [False, True], ids=['dense', 'moe'])
def test_flops_per_token_match_torch_flop_counter(moe):
    "The matmuls outside attention (projections, FFN or active experts, router, lm_head) equal the formula exactly."
    from fsi_nb.model import FSIEdgeModel
    from fsi_nb.attention import _code_like_ids
    kw = dict(vocab_size=512, d_model=48, n_layers=2, n_heads=6, kv_heads=2, d_ff=96, max_seq_len=128, window_size=16,
              struct_lines=4, local_heads=2, struct_heads=2, global_heads=2)
    if moe: kw.update(n_routed=8, n_shared=1, top_k=2, expert_d_ff=32)
    cfg, (B, T) = FSIEdgeConfig(**kw), (2, 128)
    torch.manual_seed(0)
    c = _counted(FSIEdgeModel(cfg), _code_like_ids(B, T, 512, seed=1))   # the plain loss: the lm_head on all T rows
    f = flops_per_token(cfg, T)
    assert c['mm'] + c.get('addmm', 0) == (f['matmul'] + f['lm_head']) * B * T, (c, f)
    # attention runs as batched matmuls over each kernel's keys, a superset of the keys a query uses, which f counts
    useful = (f['attention_local'] + f['attention_struct'] + f['attention_global']) * B * T
    assert useful <= c['bmm'] <= 3 * useful, (c['bmm'], useful)

def test_dense_baseline_flops_match_torch_flop_counter():
    from fsi_nb.bench import DenseDecoder, dense_flops_per_token
    from fsi_nb.attention import _code_like_ids
    cfg, (B, T) = FSIEdgeConfig(vocab_size=512, d_model=48, n_layers=2, n_heads=6, kv_heads=2, d_ff=96, max_seq_len=128), (2, 128)
    torch.manual_seed(0)
    d = DenseDecoder(cfg)
    c = _counted(d, _code_like_ids(B, T, 512, seed=1))
    matmul = sum(p.numel() for p in d.parameters() if p.dim() == 2)
    assert c['mm'] == 6 * matmul * B * T - 6 * 512 * 48 * B                   # its plain loss drops each row's last position
    attention = (dense_flops_per_token(d, T) - 6 * matmul) * B * T          # (T+1)/2 keys per query: the ones it uses
    assert c['bmm'] == pytest.approx(attention * 2 * T / (T + 1))            # the math kernel scores all T
