"""fsi_nb.tb on a real MoE run: a tiny preset shrunk to 4 experts, trained a few steps by `python -m fsi_nb.train`, mirrored by
`python -m fsi_nb.tb`; TensorBoard's own event reader finds routing health per layer (and the expert loads as histograms). The
same run raises no routing alarm. W&B's offline mirror where wandb is installed, its one-line error where it is not; the CLI's
answers to a run folder that is not there."""
import glob, importlib.util, json, os, select, struct, subprocess, sys, time
from pathlib import Path

import pytest

ENV = os.environ | {'TOKENIZERS_PARALLELISM': 'false', 'OMP_NUM_THREADS': '1'}
MOE = ['--set', 'n_routed=4', '--set', 'n_shared=1', '--set', 'top_k=2', '--set', 'expert_d_ff=32']
HAS_WANDB = importlib.util.find_spec('wandb') is not None


def tb(*args, env=ENV, timeout=120):
    return subprocess.run([sys.executable, '-m', 'fsi_nb.tb', *map(str, args)], capture_output=True, text=True, env=env, timeout=timeout)


def records(run) -> list[dict]: return [json.loads(l) for l in (run/'log.jsonl').read_text().splitlines()]


@pytest.fixture(scope='module')
def moe_run(tmp_path_factory):
    "A real MoE run: 8 steps, a log record each, mirrored to TensorBoard after it finished."
    from fsi_nb.data import prepare
    tmp = tmp_path_factory.mktemp('moe')
    prepare(tmp/'data', sources=('synthetic', 'coldstart'), num_synthetic=200, num_coldstart=60, vocab_size=1500, workers=1, progress=False)
    r = subprocess.run([sys.executable, '-m', 'fsi_nb.train', '--preset', 'tiny', *MOE, '--set', 'warmup_steps=2', '--batch-size', '4',
                        '--seq-len', '64', '--log-interval', '1', '--save-interval', '1000', '--threads', '1', '--no-progress',
                        '--data-dir', str(tmp/'data'), '--runs-dir', str(tmp/'runs'), '--run-name', 'moe', '--max-steps', '8'],
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    run = tmp/'runs'/'moe'
    m = tb(run)
    assert m.returncode == 0 and 'moe: 8 records ->' in m.stdout, m.stdout + m.stderr
    return run


def test_tensorboard_holds_routing_health_per_layer(moe_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    recs = records(moe_run)
    ea = EventAccumulator(str(moe_run/'tb'), size_guidance={'scalars': 0, 'histograms': 0}); ea.Reload()   # 0: keep every event
    tags = set(ea.Tags()['scalars'])
    for stat in ('entropy', 'dead_experts', 'max_load', 'min_load', 'bias_abs_mean', 'population_overlap'):
        assert {f'routing/{stat}/layer0', f'routing/{stat}/layer1'} <= tags, (stat, sorted(tags))
        for layer in (0, 1):
            got = [(e.step, e.value) for e in ea.Scalars(f'routing/{stat}/layer{layer}')]
            assert [s for s, _ in got] == [r['step'] for r in recs] == list(range(8))
            assert all(abs(v - r['routing'][stat][layer]) < 1e-6 for (_, v), r in zip(got, recs)), stat
    assert not any(t.startswith('routing/load') for t in tags)                  # per-expert loads are histograms, not 4 x 2 scalars
    assert sorted(ea.Tags()['histograms']) == ['routing/load/layer0', 'routing/load/layer1']
    h = ea.Histograms('routing/load/layer1')
    assert [e.step for e in h] == list(range(8)) and all(e.histogram_value.num == 4 for e in h)
    last = recs[-1]['routing']['load'][1]
    assert abs(h[-1].histogram_value.min - min(last)) < 1e-6 and abs(h[-1].histogram_value.max - max(last)) < 1e-6


def test_the_real_run_raises_no_routing_alarm(moe_run):
    from fsi_nb.health import RoutingAlarm, routing_alarms
    recs = records(moe_run)
    assert all(r.get('routing') for r in recs)
    assert routing_alarms(recs) == [] and routing_alarms(recs, RoutingAlarm(checks=1)) == []


def test_a_run_folder_that_is_not_there_is_exit_2_naming_it(moe_run, tmp_path):
    r = tb(moe_run.parent/'nope')
    assert r.returncode == 2 and r.stdout == '', r.stdout + r.stderr
    line, = r.stderr.splitlines()
    assert line.startswith(f"error: no run folder {moe_run.parent/'nope'}. Fix: name a run folder that exists ({moe_run})"), line
    assert '--follow' in line
    again = tb(moe_run)                                                       # an existing run, mirrored already: it says so
    assert again.returncode == 0 and again.stdout == f"moe: nothing new to mirror (mirrored up to step 7) in {moe_run/'tb'}\n", again.stdout


def test_follow_says_it_waits_for_a_run_that_is_not_there_yet(moe_run, tmp_path):
    run = tmp_path/'later'
    p = subprocess.Popen([sys.executable, '-m', 'fsi_nb.tb', str(run), '--follow', '--interval', '0.2'], env=ENV,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready, _, _ = select.select([p.stdout], [], [], 120)
        assert ready, 'the follower said nothing'
        assert p.stdout.readline() == f'waiting for {run} to start: no run folder there yet (Ctrl-C to stop)\n'
        run.mkdir()                                                           # the run appears, logs and finishes: the follower ends
        (run/'log.jsonl').write_text((moe_run/'log.jsonl').read_text())
        (run/'status.json').write_text(json.dumps(dict(state='finished')))
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None: p.kill()
    assert p.returncode == 0, err
    assert 'later: 8 records ->' in out and (run/'tb'/'mirrored_step').read_text() == '7\n'


def wandb_history(run_dir) -> list[dict]:
    "The history rows of the offline W&B run under `run_dir/wandb/`, read from its .wandb file (a LevelDB-style record log)."
    from wandb.proto import wandb_internal_pb2 as pb
    path, = glob.glob(str(run_dir/'wandb'/'offline-run-*'/'run-*.wandb'))
    data, rows, buf, pos, block = Path(path).read_bytes(), [], b'', 7, 32768
    assert data[:4] == b':W&B'
    while pos + 7 <= len(data):
        if block - pos % block < 7: pos += block - pos % block; continue     # a block's tail too short for a header: padding
        _, n, kind = struct.unpack('<IHB', data[pos:pos + 7]); pos += 7
        if kind == 0 and n == 0: break
        buf += data[pos:pos + n]; pos += n
        if kind in (1, 4):                                                    # a full record, or the last piece of one
            r = pb.Record(); r.ParseFromString(buf); buf = b''
            if r.WhichOneof('record_type') == 'history':
                rows.append({i.key or '/'.join(i.nested_key): json.loads(i.value_json) for i in r.history.item})
    return rows


@pytest.mark.skipif(not HAS_WANDB, reason='wandb is not installed (optional: pip install -e ".[wandb]")')
def test_wandb_mirror_logs_the_same_scalars_offline(moe_run, tmp_path):
    import shutil
    run = tmp_path/'moe'; shutil.copytree(moe_run, run, ignore=shutil.ignore_patterns('tb', 'checkpoints'))
    r = tb(run, '--wandb', env=ENV | {'WANDB_MODE': 'offline'}, timeout=300)
    assert r.returncode == 0 and 'moe: 8 records ->' in r.stdout, r.stdout + r.stderr
    rows, recs = wandb_history(run), records(run)
    assert [row['_step'] for row in rows] == [rec['step'] for rec in recs]
    for row, rec in zip(rows, recs):
        assert abs(row['loss'] - rec['loss']) < 1e-6
        assert abs(row['routing/entropy/layer1'] - rec['routing']['entropy'][1]) < 1e-6
        assert row['routing/load/layer0/_type'] == 'histogram'
    assert (run/'wandb'/'mirrored_step').read_text() == '7\n' and tb(run, '--wandb').stdout.startswith('moe: nothing new')


@pytest.mark.skipif(HAS_WANDB, reason='wandb is installed: the mirror itself is tested instead')
def test_wandb_missing_is_one_line_naming_the_extra(moe_run):
    r = tb(moe_run, '--wandb')
    assert r.returncode == 2, r.stdout + r.stderr
    line, = r.stderr.splitlines()
    assert line == 'error: mirroring to W&B needs the wandb package. Fix: pip install -e ".[wandb]" (log.jsonl stays the run\'s record either way).'
