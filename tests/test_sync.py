"""fsi_nb.sync, fsi_nb.tb and the cloud runbook on a real run: a shrunk tiny model trained a few steps by `python -m fsi_nb.train`
(checkpoints with their .sha256 sidecars), copied with `python -m fsi_nb.sync`, damaged at the destination, killed with -9 halfway
through a large file and resumed; its log mirrored to TensorBoard by a follower running beside the trainer; `nbs/cloud.ipynb` under
papermill in its dry mode; the Dockerfile read as Docker would."""
import hashlib, json, os, re, shutil, signal, subprocess, sys, time
from pathlib import Path

import pytest

from fsi_nb.checkpoint import list_checkpoints, load_checkpoint, verify_checkpoint

ROOT = Path(__file__).resolve().parents[1]
ENV = os.environ | {'TOKENIZERS_PARALLELISM': 'false', 'OMP_NUM_THREADS': '1'}


def files(d):
    "{relative path: bytes} of every file under `d`."
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(Path(d).rglob('*')) if p.is_file()}


def sync(src, dst, *extra):
    return subprocess.run([sys.executable, '-m', 'fsi_nb.sync', str(src), str(dst), *extra], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope='module')
def run_dir(tmp_path_factory):
    "A real run: 6 steps of a shrunk tiny model, a checkpoint every 2; a TensorBoard follower ran beside it."
    from fsi_nb.data import prepare
    tmp = tmp_path_factory.mktemp('run')
    prepare(tmp / 'data', sources=('synthetic', 'coldstart'), num_synthetic=200, num_coldstart=60, vocab_size=1500, workers=1, progress=False)
    run = tmp / 'runs' / 'r'
    follower = subprocess.Popen([sys.executable, '-m', 'fsi_nb.tb', str(run), '--follow', '--interval', '0.2'], env=ENV,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    r = subprocess.run([sys.executable, '-m', 'fsi_nb.train', '--preset', 'tiny', '--set', 'd_model=32', '--set', 'warmup_steps=2',
                        '--batch-size', '2', '--seq-len', '32', '--log-interval', '1', '--save-interval', '2', '--threads', '1',
                        '--no-progress', '--data-dir', str(tmp / 'data'), '--runs-dir', str(tmp / 'runs'), '--run-name', 'r', '--max-steps', '6'],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out, err = follower.communicate(timeout=60)                           # it stops by itself once the run has finished
    assert follower.returncode == 0, err[-2000:]
    assert len(list_checkpoints(run / 'checkpoints')) >= 2 and all((c.parent / (c.name + '.sha256')).exists() for c in list_checkpoints(run / 'checkpoints'))
    return run


def test_sync_copies_a_real_run_and_a_rerun_skips_it(run_dir, tmp_path):
    r = sync(run_dir.parent, tmp_path / 'runs')                           # a whole runs folder
    assert r.returncode == 0, r.stderr
    assert files(tmp_path / 'runs' / 'r') == files(run_dir)
    assert re.search(r'copied \d+ .* skipped 0, failed 0', r.stdout)
    again = sync(run_dir.parent, tmp_path / 'runs', '--json', str(tmp_path / 'report.json'))
    rep = json.loads((tmp_path / 'report.json').read_text())
    assert again.returncode == 0 and rep['copied'] == [] and len(rep['skipped']) == len(files(run_dir.parent))
    for c in list_checkpoints(tmp_path / 'runs' / 'r' / 'checkpoints'):
        assert verify_checkpoint(c) is None
    assert load_checkpoint(list_checkpoints(tmp_path / 'runs' / 'r' / 'checkpoints')[-1])


def test_a_corrupted_destination_is_found_and_copied_again(run_dir, tmp_path):
    assert sync(run_dir, tmp_path / 'r').returncode == 0
    ckpt = list_checkpoints(tmp_path / 'r' / 'checkpoints')[-1]
    raw = bytearray(ckpt.read_bytes()); raw[len(raw) // 2] ^= 0x01; ckpt.write_bytes(bytes(raw))      # one flipped bit, same size
    log = tmp_path / 'r' / 'log.jsonl'; log.write_bytes(log.read_bytes()[:-10])                       # a truncated file without a sidecar
    r = sync(run_dir, tmp_path / 'r', '--json', str(tmp_path / 'rep.json'))
    assert r.returncode == 0, r.stderr
    redone = {e['path']: e['why'] for e in json.loads((tmp_path / 'rep.json').read_text())['copied']}
    assert set(redone) == {f'checkpoints/{ckpt.name}', 'log.jsonl'} and all(w.startswith('the destination differed') for w in redone.values())
    assert files(tmp_path / 'r') == files(run_dir)


def test_a_checkpoint_damaged_at_the_source_fails_the_sync(run_dir, tmp_path):
    src = tmp_path / 'src'; shutil.copytree(run_dir, src)
    ckpt = list_checkpoints(src / 'checkpoints')[0]
    raw = bytearray(ckpt.read_bytes()); raw[100] ^= 0xFF; ckpt.write_bytes(bytes(raw))
    r = sync(src, tmp_path / 'dst')
    assert r.returncode == 1
    assert f'checkpoints/{ckpt.name}: the source does not match its .sha256' in r.stderr and 'Fix' in r.stderr
    assert not (tmp_path / 'dst' / 'checkpoints' / ckpt.name).exists()                                 # never placed unverified
    assert sync(tmp_path / 'nowhere', tmp_path / 'dst').returncode == 2


def test_kill_9_mid_copy_of_a_big_file_then_resume(run_dir, tmp_path):
    src = tmp_path / 'src'; shutil.copytree(run_dir, src)
    big = src / 'checkpoints' / 'step_9999999.pt'
    data = hashlib.sha256(b'seed').digest() * (48 * 2**20 // 32)                                      # 48 MB
    big.write_bytes(data); (src / 'checkpoints' / (big.name + '.sha256')).write_text(f'{hashlib.sha256(data).hexdigest()}  {big.name}\n')
    dst, tmp = tmp_path / 'dst', tmp_path / 'dst' / 'checkpoints' / (big.name + '.sync-tmp')
    p = subprocess.Popen([sys.executable, '-m', 'fsi_nb.sync', str(src), str(dst), '--bwlimit', '12'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    while not (tmp.exists() and tmp.stat().st_size > 8 * 2**20):
        assert p.poll() is None and time.monotonic() - t0 < 60, 'the copy ended before it could be killed'
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL); p.wait()
    assert not (dst / 'checkpoints' / big.name).exists() and 0 < tmp.stat().st_size < len(data)         # only the temp name holds the partial copy
    r = sync(src, dst, '--json', str(tmp_path / 'rep.json'))
    assert r.returncode == 0, r.stderr
    why = {e['path']: e['why'] for e in json.loads((tmp_path / 'rep.json').read_text())['copied']}
    assert why[f'checkpoints/{big.name}'] == 'a partial copy was redone'
    assert files(dst) == files(src) and not list(dst.rglob('*.sync-tmp'))


def test_the_tensorboard_follower_mirrored_every_logged_step(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    recs = [json.loads(l) for l in (run_dir / 'log.jsonl').read_text().splitlines()]
    ea = EventAccumulator(str(run_dir / 'tb')); ea.Reload()
    got = [(e.step, e.value) for e in ea.Scalars('loss')]
    assert [s for s, _ in got] == [r['step'] for r in recs] == list(range(6))
    assert all(abs(v - r['loss']) < 1e-5 for (_, v), r in zip(got, recs))
    assert {'lr', 'grad_norm', 'tokens_per_sec'} <= set(ea.Tags()['scalars'])


def test_dockerfile_builds_on_ngc_pytorch_without_reinstalling_torch(tmp_path):
    text = (ROOT / 'Dockerfile').read_text()
    lines = re.sub(r'\\\n', ' ', text).splitlines()                                                   # continuation lines joined, as Docker reads them
    instr = [l.split(None, 1) for l in lines if l.strip() and not l.lstrip().startswith('#')]
    assert {i[0] for i in instr} <= {'ARG', 'FROM', 'WORKDIR', 'COPY', 'RUN', 'ENV', 'ENTRYPOINT', 'CMD'}
    froms = [i[1] for i in instr if i[0] == 'FROM']
    assert froms == ['nvcr.io/nvidia/pytorch:${NGC_TAG}-py3']
    assert re.fullmatch(r'NGC_TAG=\d{2}\.\d{2}', next(i[1] for i in instr if i[0] == 'ARG'))
    runs = ' '.join(i[1] for i in instr if i[0] == 'RUN')
    for cmd in re.findall(r'pip install[^&]*', runs):
        assert not re.search(r'\btorch\b', cmd.replace('torch.', '')), cmd                            # no `pip install torch`, no PyPI torch
    assert '--no-deps /opt/fsi_nb' in runs
    for src in (i[1].split()[:-1] for i in instr if i[0] == 'COPY'):
        assert all((ROOT / s).exists() for s in src), src
    json.loads(next(i[1] for i in instr if i[0] == 'ENTRYPOINT'))
    # the requirements line the image installs: every dependency of pyproject.toml except torch
    script = re.search(r'python -c "(import tomllib.*?)"', runs).group(1).replace('/opt/fsi_nb/', str(ROOT) + '/').replace('/tmp/requirements.txt', str(tmp_path / 'req.txt'))
    subprocess.run([sys.executable, '-c', script], check=True)
    import tomllib
    deps = tomllib.loads((ROOT / 'pyproject.toml').read_text())['project']['dependencies']
    assert (tmp_path / 'req.txt').read_text().splitlines() == [d for d in deps if not d.startswith('torch')] and any(d.startswith('torch') for d in deps)


@pytest.mark.slow
def test_cloud_runbook_dry_run_under_papermill(tmp_path):
    out = tmp_path / 'cloud.ipynb'
    r = subprocess.run([sys.executable, '-m', 'papermill', str(ROOT / 'nbs' / 'cloud.ipynb'), str(out), '-k', 'python3', '--cwd', str(ROOT / 'nbs'),
                        '-p', 'work_dir', str(tmp_path / 'work'), '-p', 'budget_hours', '7.5'], capture_output=True, text=True, timeout=400, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    nb = json.loads(out.read_text())
    shown = ''.join(''.join(o.get('text', '')) + ''.join(o.get('data', {}).get('text/plain', '')) for c in nb['cells'] for o in c.get('outputs', []))
    assert "'all_verified': True" in shown and "'dry_run': True" in shown
    assert '--budget-hours 7.5 --save-minutes 30' in shown and 'gsutil -m rsync' in shown and 'FROM nvcr.io/nvidia/pytorch' in shown
    local = tmp_path / 'work' / 'local' / 'h100' / 'checkpoints'
    assert len(list_checkpoints(local)) == 2 and all(verify_checkpoint(c) is None for c in list_checkpoints(local))
    # the plan: at most 2 epochs of the corpus it prepared, and a schedule that ends inside the budget at the table's rate
    from fsi_nb.config import get_preset
    from fsi_nb.sizing import MEASURED_MFU, flops_per_token
    corpus = int(re.search(r'\(([\d,]+) train\)', shown)[1].replace(',', ''))
    max_steps = int(re.search(r'python -m fsi_nb\.train .*--max-steps (\d+)', shown)[1])
    step_tokens = get_preset('h100').train.tokens_per_step                                     # 16 x 3 x 2048
    rate = MEASURED_MFU[('h100', 'h200', 'bf16')]['mfu'] * 989e12 / flops_per_token('h100', 2048)['total']   # an H100 takes the H200 row
    assert corpus > step_tokens and max_steps * step_tokens <= 2 * corpus and max_steps == 2 * corpus // step_tokens
    assert max_steps * step_tokens / rate <= 7.5 * 3600
    assert 'MFU 0.0702 (fallback: h100 not measured on h100' in shown and f'--set warmup_steps={max(1, max_steps // 10)}' in shown
    assert re.search(rf'WARNING +budget buys .* passes over the .*-token corpus; capped at 2 epochs = .* tokens \(max_steps {max_steps}\)', shown)
