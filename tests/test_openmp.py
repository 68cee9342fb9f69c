"""fsi_nb chooses OpenMP's passive wait policy before torch loads it (fsi_nb/__init__.py), and that changes no number:
the same run's fp32 losses are bit-identical with spinning (ACTIVE) and sleeping (PASSIVE) threads."""
import json, os, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def _env(**kw):
    env = {k: v for k, v in os.environ.items() if k != 'OMP_WAIT_POLICY'}
    return env | kw

def test_passive_wait_policy_is_set_before_torch_loads():
    code = "import fsi_nb, os, sys; assert 'torch' not in sys.modules; import fsi_nb.train; print(os.environ['OMP_WAIT_POLICY'])"
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=_env(), cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == 'PASSIVE', r.stderr[-2000:]
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=_env(OMP_WAIT_POLICY='ACTIVE'), cwd=ROOT)
    assert r.stdout.strip() == 'ACTIVE'   # a choice already made is kept

def test_wait_policy_changes_no_loss(prepared_data, tmp_path):
    "Eight fp32 steps of `tiny` on two threads, spinning and sleeping: the same losses to the last bit."
    losses = {}
    for policy in ('ACTIVE', 'PASSIVE'):
        r = subprocess.run([sys.executable, '-m', 'fsi_nb.train', '--preset', 'tiny', '--max-steps', '8', '--batch-size', '4',
                            '--precision', 'fp32', '--threads', '2', '--log-interval', '1', '--data-dir', str(prepared_data),
                            '--runs-dir', str(tmp_path), '--run-name', policy, '--no-progress', '--set', 'warmup_steps=2'],
                           capture_output=True, text=True, env=_env(OMP_WAIT_POLICY=policy), cwd=ROOT, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        losses[policy] = [json.loads(l)['loss'] for l in (tmp_path/policy/'log.jsonl').read_text().splitlines()]
    assert len(losses['ACTIVE']) == 8 and losses['ACTIVE'] == losses['PASSIVE']
