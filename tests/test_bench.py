"`python -m fsi_nb.bench --quick --json` runs end to end and reports every table; it never asserts a speed."
import json, math, os, subprocess, sys
from pathlib import Path
import torch

from fsi_nb.bench import _TITLES
from fsi_nb.config import PRESETS

COLUMNS = dict(  # what each table must report
    step=('hybrid_tokens_per_sec', 'dense_tokens_per_sec', 'ratio', 'hybrid_mfu', 'dense_mfu'),
    options=('hybrid_tokens_per_sec', 'dense_tokens_per_sec', 'ratio', 'hybrid_mfu', 'dense_mfu'),
    helix=('parallel_ms', 'loop_ms', 'speedup', 'parallel_us_per_token', 'loop_us_per_token'),
    moe=('moe_tokens_per_sec', 'dense_tokens_per_sec', 'ratio'),
    loop=('compute_ms', 'data_ms', 'log_ms_amortized', 'checkpoint_ms_amortized', 'step_ms', 'overhead'),
    rl=('loop_samples_per_sec', 'batched_samples_per_sec', 'speedup', 'greedy_equal'),
    ops=('hybrid_ops', 'dense_ops', 'ratio'))

def _bench(*args, tmp_path):
    return subprocess.run([sys.executable, '-m', 'fsi_nb.bench', *args], cwd=tmp_path, capture_output=True, text=True, timeout=600)

def _numbers(x):
    if isinstance(x, dict): x = list(x.values())
    if isinstance(x, list):
        for v in x: yield from _numbers(v)
    elif isinstance(x, (int, float)) and not isinstance(x, bool): yield x

def test_quick_json_has_every_table(tmp_path, prepared_data):
    out = tmp_path/'bench.json'
    # one thread: other tests run beside this one, and an OpenMP region waiting for a busy core costs a time slice
    r = _bench('--quick', '--threads', '1', '--json', str(out), '--data-dir', str(prepared_data), tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    res = json.loads(out.read_text())
    assert res['meta']['quick'] is True and res['meta']['threads'] == res['ceiling']['threads'] == 1
    assert res['ceiling']['fp32_gflops'] > 0 and res['ceiling']['bf16_gflops'] > 0
    for table, cols in COLUMNS.items():
        assert res.get(table), f'table {table!r} missing or empty'
        for row in res[table]:
            missing = [c for c in cols if c not in row]
            assert not missing, f'{table} row lacks {missing}: {row}'
        assert _TITLES[table] in r.stdout, f'{table} not printed'
    rows = {(row['preset'].split()[0], row['precision']) for row in res['step']}
    assert rows == {(p, q) for p in ('tiny', 'small', 'med', 'h100-cpu') for q in ('fp32', 'bf16')}
    bad = [v for v in _numbers(res) if not (math.isfinite(v) and v > 0)]
    assert not bad, f'non-positive or non-finite numbers: {bad}'
    assert 'Matmul ceiling' in r.stdout and 'MFU' in r.stdout and 'Targets' in r.stdout
    assert all(row['hybrid_ops'] > row['dense_ops'] for row in res['ops'])  # three head kinds and Helix: more operators
    assert all(row['greedy_equal'] for row in res['rl'])   # batched RL sampling draws the reference's samples

def test_unknown_table_names_the_fix(tmp_path):
    r = _bench('--only', 'step,warp', tmp_path=tmp_path)
    assert r.returncode != 0 and 'warp' in r.stderr and 'Fix:' in r.stderr
    r = _bench('--only', '', tmp_path=tmp_path)                  # nothing to run is a mistake, not a silent success
    assert r.returncode == 2 and 'names no table' in r.stderr and 'Fix:' in r.stderr
    if not torch.cuda.is_available():
        r = _bench('--only', 'gpu', tmp_path=tmp_path)
        assert r.returncode == 2 and 'needs a CUDA GPU' in r.stderr and 'Traceback' not in r.stderr

def test_the_gpu_script_dry_runs_on_a_cpu(tmp_path):
    "`bash .ci/gpu --dry-run`: the GPU script's commands on this CPU at toy shapes, so a GPU machine never meets a script that rotted."
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(['bash', str(root/'.ci'/'gpu'), '--dry-run', str(tmp_path)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, 'PYTHON': sys.executable})
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    res = json.loads((tmp_path/'bench.json').read_text())
    gpu_presets = [n for n, p in PRESETS.items() if p.train.device == 'cuda']
    assert {(x['preset'], x['model']) for x in res['gpu']} == {(f'{n}-dry', m) for n in gpu_presets for m in ('hybrid', 'dense')}
    assert all(math.isfinite(x['last_loss']) and x['tokens_per_sec'] > 0 for x in res['gpu'])
    assert 'test_gpu.py' in (tmp_path/'pytest.txt').read_text()   # the GPU tests were collected
