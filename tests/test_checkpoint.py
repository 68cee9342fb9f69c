"Checkpoint files: atomic saves, checksums, corruption, kills mid-write and full disks (real files and processes)."
import errno, os, random, signal, subprocess, sys, textwrap, time
from pathlib import Path

import pytest, torch

from fsi_nb.checkpoint import (CheckpointError, checkpoint_path, latest_valid_checkpoint, list_checkpoints, load_checkpoint,
                          rng_state, save_checkpoint, set_rng_state, verify_checkpoint)

def _state(step, n=64):
    torch.manual_seed(step)
    lin = torch.nn.Linear(n, n)
    opt = torch.optim.AdamW(lin.parameters())
    lin(torch.randn(3, n)).sum().backward(); opt.step()
    return dict(step=step, model=lin.state_dict(), optimizer=opt.state_dict(), rng=rng_state(), token_offset=step * 100)

def test_roundtrip_keeps_everything(tmp_path):
    st = _state(5)
    p = save_checkpoint(st, tmp_path, 5)
    ck = load_checkpoint(p)
    assert ck['step'] == 5 and ck['token_offset'] == 500
    assert all(torch.equal(ck['model'][k], v) for k, v in st['model'].items())
    assert torch.equal(ck['optimizer']['state'][0]['exp_avg'], st['optimizer']['state'][0]['exp_avg'])
    set_rng_state(ck['rng'])   # restorable from a weights_only load
    # the .sha256 file is in `sha256sum -c` format
    r = subprocess.run(['sha256sum', '-c', p.name + '.sha256'], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0 and 'OK' in r.stdout

def test_keeps_last_three_and_cleans_orphans(tmp_path):
    (tmp_path/'step_0000001.pt.sha256').write_text('0' * 64 + '  step_0000001.pt\n')   # its .pt never landed
    for s in range(2, 8): save_checkpoint(_state(s, 8), tmp_path, s)
    assert [p.name for p in list_checkpoints(tmp_path)] == ['step_0000005.pt', 'step_0000006.pt', 'step_0000007.pt']
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f'step_000000{s}.pt{x}' for s in (5, 6, 7) for x in ('', '.sha256'))

@pytest.mark.parametrize('damage', ['truncate', 'bitflip', 'no_sha', 'empty'])
def test_damaged_latest_falls_back_to_previous(tmp_path, damage):
    for s in (10, 20, 30): save_checkpoint(_state(s), tmp_path, s)
    p = checkpoint_path(tmp_path, 30)
    b = p.read_bytes()
    if damage == 'truncate': p.write_bytes(b[: len(b) // 3])
    if damage == 'bitflip':
        i = random.Random(0).randrange(len(b)); bb = bytearray(b); bb[i] ^= 1 << random.Random(1).randrange(8); p.write_bytes(bytes(bb))
    if damage == 'no_sha': p.with_name(p.name + '.sha256').unlink()
    if damage == 'empty': p.write_bytes(b'')
    best, skipped = latest_valid_checkpoint(tmp_path)
    assert best == checkpoint_path(tmp_path, 20)
    assert [s for s, _ in skipped] == [p] and skipped[0][1]
    with pytest.raises(CheckpointError, match='does not verify'): load_checkpoint(p)
    assert load_checkpoint(best)['step'] == 20

def test_damaged_newer_checkpoints_never_push_out_good_ones(tmp_path):
    "Resumed from 20 past a damaged 30: saves 21 and 22 keep three good ones (20, 21, 22) and leave 30 to be overwritten."
    for s in (10, 20, 30): save_checkpoint(_state(s), tmp_path, s)
    checkpoint_path(tmp_path, 30).write_bytes(b'junk')
    for s in (21, 22): save_checkpoint(_state(s), tmp_path, s)
    assert [int(p.stem.split('_')[1]) for p in list_checkpoints(tmp_path)] == [20, 21, 22, 30]
    assert latest_valid_checkpoint(tmp_path)[0] == checkpoint_path(tmp_path, 22)

def test_nothing_valid(tmp_path):
    assert latest_valid_checkpoint(tmp_path/'missing') == (None, [])
    save_checkpoint(_state(1), tmp_path, 1)
    checkpoint_path(tmp_path, 1).write_bytes(b'junk')
    best, skipped = latest_valid_checkpoint(tmp_path)
    assert best is None and len(skipped) == 1

_SAVER = textwrap.dedent('''
    import sys, torch
    from fsi_nb.checkpoint import save_checkpoint
    d, n = sys.argv[1], int(sys.argv[2])
    w = torch.arange(n * n, dtype=torch.float32).view(n, n)
    for step in range(1, 10**6):
        save_checkpoint(dict(step=step, w=w + step), d, step)
        print(step, flush=True)
''')

def test_kill_9_mid_save_never_leaves_a_bad_latest(tmp_path):
    "A process saving ~16 MB checkpoints in a loop is killed at random moments; what is left always verifies."
    rng = random.Random(0)
    for trial in range(4):
        d = tmp_path/f't{trial}'
        p = subprocess.Popen([sys.executable, '-c', _SAVER, str(d), '2048'], stdout=subprocess.PIPE, text=True)
        for _ in range(2): p.stdout.readline()           # at least two saves done
        time.sleep(rng.uniform(0, 0.3))                  # then somewhere inside a later save
        p.send_signal(signal.SIGKILL); p.wait(); p.stdout.close()
        best, skipped = latest_valid_checkpoint(d)
        assert best is not None and not skipped, (best, skipped)
        ck = load_checkpoint(best)
        assert torch.equal(ck['w'] - ck['step'], torch.arange(2048 * 2048, dtype=torch.float32).view(2048, 2048))
        assert not list(d.glob('step_*.pt')) or all(verify_checkpoint(x) is None for x in list_checkpoints(d))

_FULL = textwrap.dedent('''
    import resource, signal, sys, torch
    from fsi_nb.checkpoint import save_checkpoint, CheckpointError
    d, limit = sys.argv[1], int(sys.argv[2])
    save_checkpoint(dict(step=1, w=torch.zeros(256, 256)), d, 1)     # 256 KiB: fits
    if limit:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)                # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    try: save_checkpoint(dict(step=2, w=torch.ones(1024, 1024)), d, 2)  # 4 MiB: does not fit
    except CheckpointError as e: print('ERROR', e); sys.exit(0)
    print('SAVED'); sys.exit(1)
''')

def _check_full(d, out):
    assert out.startswith('ERROR'), out
    assert 'checkpoint' in out and 'step_0000001.pt is intact' in out and 'Fix:' in out
    assert [p.name for p in list_checkpoints(d)] == ['step_0000001.pt']
    assert not list(Path(d).glob('*.tmp')) and not (Path(d)/'step_0000002.pt.sha256').exists()
    assert load_checkpoint(checkpoint_path(d, 1))['step'] == 1

def test_file_size_limit_during_save_leaves_previous_intact(tmp_path):
    r = subprocess.run([sys.executable, '-c', _FULL, str(tmp_path), str(1 << 20)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    _check_full(tmp_path, r.stdout)
    assert 'larger than this process may write' in r.stdout

def _mount_tmpfs(path, size):
    if os.geteuid() != 0: return False
    path.mkdir()
    return subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', str(path)], capture_output=True).returncode == 0

def test_full_disk_during_save_leaves_previous_intact(tmp_path):
    "A real ENOSPC: a 1 MiB tmpfs (needs root and mount rights; skipped otherwise — the RLIMIT test above still runs)."
    mnt = tmp_path/'small'
    if not _mount_tmpfs(mnt, '1m'): pytest.skip('cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN)')
    try:
        r = subprocess.run([sys.executable, '-c', _FULL, str(mnt), '0'], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        _check_full(mnt, r.stdout)
        assert 'the disk is full' in r.stdout and f'errno {errno.ENOSPC}' in r.stdout
    finally:
        subprocess.run(['umount', str(mnt)])
