"""The training loop as a user runs it: `python -m fsi_nb.train` subprocesses killed with -9, stopped with SIGTERM and
SIGINT, fed NaN losses, given corrupted checkpoints and a full disk. A tiny-shrunk model keeps each run to seconds."""
import json, math, os, random, shutil, signal, subprocess, sys, textwrap, time
from pathlib import Path

import pytest, torch

from fsi_nb.config import get_stage
from fsi_nb.checkpoint import checkpoint_path, latest_valid_checkpoint, list_checkpoints, load_checkpoint

STEPS = 16
ARGS = ['--preset', 'tiny', '--set', 'd_model=32', '--set', 'warmup_steps=2', '--batch-size', '2', '--seq-len', '32',
        '--log-interval', '1', '--save-interval', '3', '--threads', '1', '--no-progress']

def cli(data, runs, name, *extra, env=None, **kw):
    "Command line of a small run; `extra` are more flags."
    return [sys.executable, '-m', 'fsi_nb.train', *ARGS, '--data-dir', str(data), '--runs-dir', str(runs), '--run-name', name,
            *(['--max-steps', str(kw.get('steps', STEPS))] if kw.get('steps', STEPS) is not None else []), *extra]

def run(cmd, env=None, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, **({"timeout": 300} | kw))

def records(run_dir):
    return [json.loads(l) for l in (Path(run_dir)/'log.jsonl').read_text().splitlines()]

def same_run(a, b):
    "Every logged number of two runs equal (bit-exact floats), timing fields aside."
    keys = ('step', 'loss', 'avg_loss', 'lr', 'grad_norm', 'tokens', 'seq_len', 'bad_steps')
    return [{k: r[k] for k in keys} for r in a] == [{k: r[k] for k in keys} for r in b]

def wait_for_steps(log, n, proc, timeout=120):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if log.exists() and len(log.read_text().splitlines()) >= n: return
        assert proc.poll() is None, f'run ended before step {n}: {proc.returncode}'
        time.sleep(0.005)
    raise TimeoutError(f'no step {n} in {log} after {timeout}s')

@pytest.fixture(scope='module')
def reference(prepared_data, tmp_path_factory):
    "One uninterrupted run: what every interrupted run must reproduce."
    runs = tmp_path_factory.mktemp('ref')
    r = run(cli(prepared_data, runs, 'ref'))
    assert r.returncode == 0, r.stderr
    recs = records(runs/'ref')
    assert [x['step'] for x in recs] == list(range(STEPS))
    assert recs[0]['loss'] > 10 and math.isfinite(recs[-1]['loss'])
    return recs

def test_kill_9_at_random_steps_then_resume_is_bit_exact(prepared_data, tmp_path, reference):
    "kill -9 the same run three times at random steps (maybe mid-save); each resume continues exactly."
    rng, log, resumed = random.Random(os.getpid()), tmp_path/'k'/'log.jsonl', []
    kills = sorted(rng.sample(range(2, STEPS - 1), 3))   # random each run; a failure names them
    for kill_at in kills:
        p = subprocess.Popen(cli(prepared_data, tmp_path, 'k'), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_for_steps(log, kill_at, p)
        time.sleep(rng.uniform(0, 0.05))
        p.send_signal(signal.SIGKILL); p.wait()
        resumed.append(p.stderr.read()); p.stderr.close()
    r = run(cli(prepared_data, tmp_path, 'k'))
    assert r.returncode == 0, r.stderr
    assert 'resuming k from' in r.stderr
    assert same_run(records(tmp_path/'k'), reference), f'killed after steps {kills}'
    assert [x['step'] for x in records(tmp_path/'k')] == list(range(STEPS))   # one line per step, none repeated
    st = json.loads((tmp_path/'k'/'status.json').read_text())
    assert st['state'] == 'finished' and st['step'] == STEPS

def test_loaded_checkpoint_reproduces_the_logged_loss(prepared_data, tmp_path):
    "`load_run` gives back the model that trained: on a step's own batch it computes the loss the log recorded, bit for bit."
    from fsi_nb.batches import Batcher
    from fsi_nb.run_folder import load_run
    r = run(cli(prepared_data, tmp_path, 'e', '--save-interval', '1', '--set', 'precision=fp32', steps=4))
    assert r.returncode == 0, r.stderr
    rec = records(tmp_path/'e')
    loaded = load_run(checkpoint_path(tmp_path/'e'/'checkpoints', 3))      # saved after 3 updates: the model of step 3
    t = loaded.train_config
    batch = Batcher(prepared_data, 'train', seed=t.seed, mix=get_stage(t.stage).data_mix, max_steps=t.max_steps).get_batch(
        3, 0, t.batch_size, rec[3]['seq_len'])
    n = torch.get_num_threads(); torch.set_num_threads(1)                  # as the run's --threads 1
    try: loss = loaded.model.train()(**batch, return_logits=False).loss.item()
    finally: torch.set_num_threads(n)
    assert loss == rec[3]['loss'], (loss, rec[3]['loss'])
    assert loss != rec[2]['loss']

def test_resuming_a_run_as_another_stage_is_refused(prepared_data, tmp_path):
    "A run folder belongs to one stage: continuing stage1's checkpoints as stage1b would mix two objectives in one run."
    assert run(cli(prepared_data, tmp_path, 'st', steps=3)).returncode == 0
    r = run(cli(prepared_data, tmp_path, 'st', '--stage', 'stage1b', '--init-from', 'scratch', steps=3))
    assert r.returncode == 2 and 'is a run of stage1, not stage1b' in r.stderr and 'Fix:' in r.stderr, r.stderr

def test_an_exception_is_written_to_status_json(prepared_data, tmp_path):
    "A watcher reads status.json: an error that ends the run (here a KeyboardInterrupt from a callback) must show there."
    from fsi_nb.train import train
    def interrupt(rec):
        if rec['step'] == 2: raise KeyboardInterrupt('second Ctrl-C')
    with pytest.raises(KeyboardInterrupt):
        train('tiny', 'x', callback=interrupt, progress=False, data_dir=prepared_data, runs_dir=tmp_path, max_steps=6,
              d_model=32, batch_size=2, seq_len=32, log_interval=1, threads=1)
    st = json.loads((tmp_path/'x'/'status.json').read_text())
    assert st['state'] == 'error' and 'KeyboardInterrupt' in st['message'] and st['step'] == 3, st

MOE = ['--set', 'n_routed=4', '--set', 'n_shared=1', '--set', 'top_k=2', '--set', 'expert_d_ff=32']

def test_moe_kill_9_then_resume_is_bit_exact(prepared_data, tmp_path):
    "An MoE run killed mid-run resumes exactly: the router bias and expert load come back with the weights."
    ref = run(cli(prepared_data, tmp_path, 'ref', *MOE, steps=10))
    assert ref.returncode == 0, ref.stderr
    p = subprocess.Popen(cli(prepared_data, tmp_path, 'k', *MOE, steps=10), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_steps(tmp_path/'k'/'log.jsonl', 7, p)    # past the save at step 6, before the next
    p.send_signal(signal.SIGKILL); p.wait()
    r = run(cli(prepared_data, tmp_path, 'k', *MOE, steps=10))
    assert r.returncode == 0 and 'resuming k from' in r.stderr, r.stderr
    assert same_run(records(tmp_path/'k'), records(tmp_path/'ref'))
    a, b = (load_checkpoint(latest_valid_checkpoint(tmp_path/n/'checkpoints')[0])['model'] for n in ('ref', 'k'))
    assert a.keys() == b.keys() and any(k.endswith('router_bias') for k in a)
    biases = [k for k in a if k.endswith('router_bias')]
    assert any(a[k].abs().sum() > 0 for k in biases), 'the bias moved during training'
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]

@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_a_checkpoint_and_exits_cleanly(prepared_data, tmp_path, reference, sig):
    "Preemption (SIGTERM) or Ctrl-C (SIGINT): the last complete step is saved, the exit code says which signal."
    p = subprocess.Popen(cli(prepared_data, tmp_path, 's', '--save-interval', '1000'), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    wait_for_steps(tmp_path/'s'/'log.jsonl', 4, p)
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 128 + sig, err
    assert f'{signal.Signals(sig).name} received' in err
    last = records(tmp_path/'s')[-1]['step']
    ckpt = checkpoint_path(tmp_path/'s'/'checkpoints', last + 1)
    assert list_checkpoints(tmp_path/'s'/'checkpoints') == [ckpt]          # no periodic save happened: this is the signal's
    ck = load_checkpoint(ckpt)
    assert ck['step'] == last + 1 and ck['token_offset'] == (last + 1) * 2 * 32
    st = json.loads((tmp_path/'s'/'status.json').read_text())
    assert st['state'] == 'signal' and json.loads(out.splitlines()[-1])['stopped'] == 'signal'
    if sig == signal.SIGTERM:                                                # and it resumes to the same end
        r = run(cli(prepared_data, tmp_path, 's', '--save-interval', '1000'))
        assert r.returncode == 0, r.stderr
        assert same_run(records(tmp_path/'s'), reference)

def test_damaged_checkpoints_are_skipped_with_reasons(prepared_data, tmp_path, reference):
    r = run(cli(prepared_data, tmp_path, 'd'))
    assert r.returncode == 0, r.stderr
    ck = tmp_path/'d'/'checkpoints'
    assert [p.name for p in list_checkpoints(ck)] == ['step_0000012.pt', 'step_0000015.pt', 'step_0000016.pt']
    p16, p15 = checkpoint_path(ck, 16), checkpoint_path(ck, 15)
    p16.write_bytes(p16.read_bytes()[:4096])                                # truncated by a crash
    b = bytearray(p15.read_bytes()); b[len(b) // 3] ^= 0x10; p15.write_bytes(bytes(b))   # one flipped bit
    r = run(cli(prepared_data, tmp_path, 'd'))
    assert r.returncode == 0, r.stderr
    assert f'skipping checkpoint {p16}' in r.stderr and f'skipping checkpoint {p15}' in r.stderr and 'mismatch' in r.stderr
    assert 'resuming d from' in r.stderr and 'step_0000012.pt (step 12)' in r.stderr
    assert same_run(records(tmp_path/'d'), reference)
    assert latest_valid_checkpoint(ck)[0] == checkpoint_path(ck, 16)

def test_checkpoints_that_none_verifies_are_refused_and_kept(prepared_data, tmp_path):
    "Checkpoints copied without their .sha256 files: the run stops with the fix; no checkpoint or log line is lost."
    assert run(cli(prepared_data, tmp_path, 'v', steps=7)).returncode == 0
    ck = tmp_path/'v'/'checkpoints'
    for sha in ck.glob('*.sha256'): sha.unlink()
    before = {p.name: p.read_bytes() for p in ck.iterdir()}, (tmp_path/'v'/'log.jsonl').read_text()
    r = run(cli(prepared_data, tmp_path, 'v', steps=7))
    assert r.returncode == 4, r.stderr
    assert 'none verifies' in r.stderr and 'no .sha256 file' in r.stderr and 'nothing was changed. Fix:' in r.stderr
    assert ({p.name: p.read_bytes() for p in ck.iterdir()}, (tmp_path/'v'/'log.jsonl').read_text()) == before

def test_smoke_test_refuses_to_replace_a_real_run(prepared_data, tmp_path):
    assert run(cli(prepared_data, tmp_path, 'real', steps=3)).returncode == 0
    before = sorted(p.name for p in (tmp_path/'real'/'checkpoints').iterdir())
    r = run(cli(prepared_data, tmp_path, 'real', '--smoke', steps=None))
    assert r.returncode == 2 and "holds a real run's checkpoints" in r.stderr and "'tiny-smoke'" in r.stderr, r.stderr
    assert sorted(p.name for p in (tmp_path/'real'/'checkpoints').iterdir()) == before
    r = run(cli(prepared_data, tmp_path, 'sm', '--smoke', steps=None))        # a smoke run's own folder: starts over
    assert r.returncode == 0, r.stderr
    assert run(cli(prepared_data, tmp_path, 'sm', '--smoke', steps=None)).returncode == 0
    r = run(cli(prepared_data, tmp_path, 'sm', '--smoke', steps=300))         # not a 300-step run by accident
    assert r.returncode == 2 and 'max_steps=300' in r.stderr and 'Fix:' in r.stderr, r.stderr

def test_full_disk_when_resuming_keeps_the_log(prepared_data, tmp_path):
    "A resume rewrites the log first (dropping steps it will train again); a write limit there is a clear error."
    assert run(cli(prepared_data, tmp_path, 'L', steps=7)).returncode == 0
    log = tmp_path/'L'/'log.jsonl'
    for s in (7,): checkpoint_path(tmp_path/'L'/'checkpoints', s).unlink()   # resume from 6: step 6's log line goes
    text = log.read_text()
    def preexec():
        import resource
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(text) // 2, len(text) // 2))
    r = subprocess.run(cli(prepared_data, tmp_path, 'L', steps=7), capture_output=True, text=True, preexec_fn=preexec, timeout=300)
    assert r.returncode == 4, (r.returncode, r.stderr[-2000:])
    assert 'could not rewrite' in r.stderr and 'intact. Fix:' in r.stderr and log.read_text() == text
    assert not list(log.parent.glob('*.tmp'))

def _mount_tmpfs(path, size):
    if os.geteuid() != 0: return False
    path.mkdir()
    return subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(path)], capture_output=True).returncode == 0

@pytest.mark.parametrize('how', ['file_size_limit', 'full_tmpfs'])
def test_full_disk_during_a_save_keeps_the_previous_checkpoint(prepared_data, tmp_path, how):
    "The machine dies after step 6 was saved; the resumed run's next save hits a full disk: clear error, step 6 intact."
    r = run(cli(prepared_data, tmp_path, 'f', steps=9))
    assert r.returncode == 0, r.stderr
    ck = tmp_path/'f'/'checkpoints'
    for s in (9,): checkpoint_path(ck, s).unlink(); checkpoint_path(ck, s).with_suffix('.pt.sha256').unlink()
    size = checkpoint_path(ck, 6).stat().st_size
    runs, preexec = tmp_path, None
    if how == 'full_tmpfs':
        mnt = tmp_path/'small'
        if not _mount_tmpfs(mnt, f'{int(size * 1.5) // 4096 * 4096}'): pytest.skip('cannot mount a tmpfs here (not root / no CAP_SYS_ADMIN)')
        for s in (3,): checkpoint_path(ck, s).unlink(); checkpoint_path(ck, s).with_suffix('.pt.sha256').unlink()
        shutil.rmtree(tmp_path/'f'/'best')   # room for one checkpoint and a half: the rolling one at step 6 alone
        shutil.copytree(tmp_path/'f', mnt/'f'); runs = mnt
    else:
        def preexec():
            import resource
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)            # EFBIG rather than a kill
            resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))
    try:
        r = subprocess.run(cli(prepared_data, runs, 'f', steps=9), capture_output=True, text=True, preexec_fn=preexec, timeout=300)
        assert r.returncode == 4, (r.returncode, r.stderr[-2000:])
        msg = r.stderr.splitlines()[-1]
        assert msg.startswith('error: could not write checkpoint') and 'step_0000006.pt is intact' in msg and 'Fix:' in msg, msg
        assert ('the disk is full' if how == 'full_tmpfs' else 'larger than this process may write') in msg
        left = runs/'f'/'checkpoints'
        assert [p.name for p in list_checkpoints(left)][-1] == 'step_0000006.pt' and not list(left.glob('*.tmp'))
        assert latest_valid_checkpoint(left) == (checkpoint_path(left, 6), [])
        assert load_checkpoint(checkpoint_path(left, 6))['step'] == 6
    finally:
        if how == 'full_tmpfs': subprocess.run(['umount', str(tmp_path/'small')])

def test_nan_steps_are_skipped_and_a_run_of_them_stops_with_a_checkpoint(prepared_data, tmp_path):
    r = run(cli(prepared_data, tmp_path, 'one'), env=dict(FSI_NB_INJECT_NAN='5'))
    assert r.returncode == 0, r.stderr
    recs = records(tmp_path/'one')
    assert 'step 5: loss nan' in r.stderr and 'step skipped' in r.stderr
    assert recs[5]['loss'] is None and recs[-1]['bad_steps'] == 1 and math.isfinite(recs[-1]['avg_loss'])   # NaN as null
    def no_constants(c): raise ValueError(f'{c} is not JSON')
    for line in (tmp_path/'one'/'log.jsonl').read_text().splitlines(): json.loads(line, parse_constant=no_constants)   # strict
    assert recs[4]['bad_steps'] == 0 and recs[5]['bad_steps'] == 1

    r = run(cli(prepared_data, tmp_path, 'many', '--set', 'max_bad_steps=4'), env=dict(FSI_NB_INJECT_NAN='6-100'))
    assert r.returncode == 3, r.stderr
    assert 'stopped after 4 non-finite steps in a row at step 10/16' in r.stderr and 'Fix:' in r.stderr
    ck = load_checkpoint(checkpoint_path(tmp_path/'many'/'checkpoints', 10))
    assert all(torch.isfinite(v).all() for v in ck['model'].values() if v.is_floating_point())
    assert ck['train_state']['bad_steps'] == 4 and json.loads((tmp_path/'many'/'status.json').read_text())['state'] == 'nan'
    # the weights are those after step 5, the last good update: training is resumable from there
    assert math.isfinite(ck['loss'])

def test_resume_with_other_data_is_an_error(prepared_data, tmp_path):
    data = tmp_path/'data'; shutil.copytree(prepared_data, data)
    assert run(cli(data, tmp_path, 'm', steps=3)).returncode == 0
    m = json.loads((data/'manifest.json').read_text()); m['note'] = 'another corpus'
    (data/'manifest.json').write_text(json.dumps(m))
    r = run(cli(data, tmp_path, 'm', steps=3))
    assert r.returncode == 2 and 'another data manifest' in r.stderr and 'Fix:' in r.stderr, r.stderr

def test_resume_false_refuses_to_overwrite_a_run(prepared_data, tmp_path):
    assert run(cli(prepared_data, tmp_path, 'x', steps=3)).returncode == 0
    r = run(cli(prepared_data, tmp_path, 'x', '--no-resume', steps=3))
    assert r.returncode == 2 and 'already has checkpoints' in r.stderr and 'Fix:' in r.stderr

def test_gpu_preset_without_gpu_is_refused_at_once(tmp_path):
    t0 = time.monotonic()
    r = run([sys.executable, '-m', 'fsi_nb.train', '--preset', 'h100', '--runs-dir', str(tmp_path), '--data-dir', str(tmp_path/'none')],
            env={'CUDA_VISIBLE_DEVICES': ''})     # no GPU visible, on a GPU machine too
    assert r.returncode == 2 and "preset 'h100' needs a CUDA GPU" in r.stderr and 'smoke' in r.stderr and 'Fix:' in r.stderr
    assert not (tmp_path/'none').exists() and time.monotonic() - t0 < 60     # refused before preparing or building anything
    r = run([sys.executable, '-m', 'fsi_nb.train', '--preset', 'tiny', '--device', 'cuda', '--runs-dir', str(tmp_path),
             '--data-dir', str(tmp_path/'none')], env={'CUDA_VISIBLE_DEVICES': ''})
    assert r.returncode == 2 and r.stderr.startswith('error:') and 'no CUDA GPU' in r.stderr and 'Fix:' in r.stderr, r.stderr

SEED_SMOKE = '''
import sys, os, torch, time
os.environ['TOKENIZERS_PARALLELISM'] = 'false'
sys.path.insert(0, '/FSI_Edge')
torch.set_num_threads(8)
from src.model import FSIEdgeModel, FSIEdgeConfig
from src.data import CodeDataset, collate_fn
from torch.utils.data import DataLoader
from torch.optim import AdamW
ds = CodeDataset('/FSI_Edge/data/train', '/FSI_Edge/fsi_edge_tokenizer', max_length=128)
loader = DataLoader(ds, batch_size=1, shuffle=True, collate_fn=collate_fn)
config = FSIEdgeConfig(d_model=64, n_layers=2, n_heads=4, kv_heads=2, d_ff=256, max_seq_len=128, window_size=32, local_heads=2, struct_heads=1, global_heads=1)
model = FSIEdgeModel(config)
opt = AdamW(model.parameters(), lr=3e-4)
for step, batch in enumerate(loader):
    if step >= 10: break
    out = model(**{k:v.to('cpu') for k,v in batch.items()})
    out.loss.backward(); opt.step(); opt.zero_grad()
    print(f'step {step+1} loss {out.loss.item():.4f}')
'''

def test_the_seeds_quick_smoke_test_runs_with_only_imports_and_paths_changed(prepared_data):
    "The CPU recipe's 'Quick smoke test', verbatim but for src.* -> fsi_nb.* and its two paths."
    code = (SEED_SMOKE.replace('from src.model', 'from fsi_nb.model').replace('from src.data', 'from fsi_nb.batches')
            .replace("'/FSI_Edge/data/train'", repr(str(prepared_data))).replace("'/FSI_Edge/fsi_edge_tokenizer'", repr(str(prepared_data/'tokenizer'))))
    r = run([sys.executable, '-c', code])
    assert r.returncode == 0, r.stderr
    losses = [float(l.split()[-1]) for l in r.stdout.splitlines() if l.startswith('step ')]
    assert len(losses) == 10 and all(math.isfinite(x) for x in losses) and abs(losses[0] - math.log(32768)) < 0.3

SEED_SUSTAINED = ('--model-size 4K --batch-size 1 --max-steps 100000 --device cpu '
                  '--stages stage1,stage1b,stage2,stage2b,stage3,stage3b,stage4,stage5 --output-dir /FSI_Edge/output --no-wandb')

def test_the_seeds_sustained_training_command_runs_as_written(prepared_data, tmp_path):
    "The CPU recipe's sustained-training command: `python -m fsi_nb.train` for its train.py, a CI-sized --max-steps, its own folder."
    argv = SEED_SUSTAINED.replace('--max-steps 100000', '--max-steps 1').replace('/FSI_Edge/output', str(tmp_path/'output')).split()
    (tmp_path/'settings.ini').write_text(f'[fsi_nb]\ndata_dir = {prepared_data}\n')   # the prepared corpus, as settings.ini names it
    r = run([sys.executable, '-m', 'fsi_nb.train', *argv], env={'FSI_NB_SETTINGS': str(tmp_path/'settings.ini')}, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    pdir = tmp_path/'output'/'tiny-pipeline'
    for stage in get_stage('stage5').name, 'stage1', 'stage3b':
        st = json.loads((pdir/stage/'status.json').read_text())
        assert st['state'] == 'finished' and st['step'] >= 1, (stage, st)
        cfg = json.loads((pdir/stage/'config.json').read_text())
        assert cfg['train']['batch_size'] == 1 and cfg['train']['device'] == 'cpu' and cfg['preset'] == 'tiny'
        assert len((pdir/stage/'loss_history.jsonl').read_text().splitlines()) == st['step']   # the seed's loss_history, one line per step
    assert json.loads((pdir/'stage3b'/'status.json').read_text())['sandbox'] in ('bwrap', 'unshare')   # the isolation it ran under
    lines = [l for l in r.stdout.splitlines() if l.startswith('step 0/')]   # no terminal, no bar: the seed's plain log line
    assert len(lines) >= 8 and all(' | loss ' in l and ' tok/s' in l for l in lines), r.stdout[-2000:]

def test_init_from_a_run_of_another_architecture_names_what_differs(prepared_data, tmp_path):
    "`--init-from` a run with another d_model or --arch: exit 2 with the differing fields, before anything trains."
    runs = tmp_path/'runs'
    assert run(cli(prepared_data, runs, 'base', steps=2)).returncode == 0
    for extra, says in ((['--set', 'd_model=64'], "'d_model': (32, 64)"), (['--arch', 'dense'], "'arch': ('hybrid', 'dense')")):
        r = run(cli(prepared_data, runs, 'next', '--stage', 'stage1b', '--init-from', str(runs/'base'), *extra, steps=2))
        assert r.returncode == 2 and 'has another architecture' in r.stderr and says in r.stderr and 'Fix:' in r.stderr, r.stderr[-2000:]
        assert not (runs/'next'/'checkpoints').exists()

def test_a_compiled_run_resumes_bit_exact_and_equals_eager(prepared_data, tmp_path):
    """`--compile`: SIGTERM mid-run, then a compiled resume (the graphs from inductor's cache) continues as an
    uninterrupted compiled run, bit for bit (the trainer orders inductor's scatter-adds: `ordered_scatter`); and
    compiled equals eager to fp32 reordering (the local heads' backward was once wrong)."""
    TWO = ('--precision', 'fp32', '--threads', '2',   # two threads: where inductor's unfold backward went wrong
           '--set', 'd_model=64', '--batch-size', '16', '--seq-len', '128')   # tiny's own shapes: enough rows for atomics to race
    env = dict(TORCHINDUCTOR_CACHE_DIR=str(tmp_path/'inductor'))            # a cold cache, then the resumes' warm one
    full = run(cli(prepared_data, tmp_path, 'full', '--compile', *TWO), env=env, timeout=600)
    assert full.returncode == 0, full.stderr
    assert 'compile: on (asked for)' in full.stderr
    p = subprocess.Popen(cli(prepared_data, tmp_path, 'cut', '--compile', *TWO, '--save-interval', '1000'),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
    wait_for_steps(tmp_path/'cut'/'log.jsonl', 5, p, timeout=300)
    p.send_signal(signal.SIGTERM); _, err = p.communicate(timeout=300)
    assert p.returncode == 128 + signal.SIGTERM, err
    r = run(cli(prepared_data, tmp_path, 'cut', '--compile', *TWO, '--save-interval', '1000'), env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert 'resuming cut from' in r.stderr
    cut, full = records(tmp_path/'cut'), records(tmp_path/'full')
    assert [x['step'] for x in cut] == [x['step'] for x in full] == list(range(STEPS))
    # bit for bit: with inductor's atomic scatter-adds (before ordered_scatter) two uninterrupted compiled runs on two
    # threads already differed in the last bits (a grad norm 1.2e-7 apart)
    assert same_run(cut, full), [(a['loss'], b['loss'], a['grad_norm'], b['grad_norm']) for a, b in zip(cut, full)]
    eager = run(cli(prepared_data, tmp_path, 'eager', *TWO))
    assert eager.returncode == 0, eager.stderr
    for a, b in zip(records(tmp_path/'eager'), records(tmp_path/'full')):
        assert abs(a['loss'] - b['loss']) <= 1e-5 * abs(a['loss']) and abs(a['grad_norm'] - b['grad_norm']) <= 1e-4 * a['grad_norm'], (a, b)
