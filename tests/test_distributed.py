"""Training on two processes: real `torchrun` jobs with two gloo ranks on this CPU (one thread each), a shrunk tiny model.
DDP (dense) and FSDP2 (MoE) against one process with the same global batch; a NaN and a signal on one rank, kill -9
of one rank, resumes from 1 rank to 2 and from 2 to 1; the router bias the same on every rank. One process is `grad_accum=2`,
two are `grad_accum=1` each: the same micro-batches per step (`fsi_nb.batches.global_micro`).

Tolerances, fp32: losses 1e-6 relative, weights 1e-5 relative + 1e-6 absolute, gradient norms 1e-4 relative.
Why not bit for bit: the logged loss of a step is each rank's fp32 sum of its micro-batch losses, summed over ranks in
float64, where one process sums them all in fp32 (half an fp32 ulp: 4.8e-7 at a loss of 10.4). Under DDP the update is
the same bits (averaging two ranks' gradients halves them exactly, as dividing each micro-batch's loss by grad_accum
does): the dense test's weights agree to the last bit. FSDP2 differs in the last bits twice: it takes the gradient
norm shard by shard (2e-5 relative over a million-entry embedding gradient; it would move the weights only when
clipping is active, and it is not here), and the fused AdamW updates each shard in its own vectorised passes (one
ulp here and there: 2e-8 absolute after ten steps)."""
import json, math, os, shutil, signal, subprocess, sys, time
from pathlib import Path

import pytest, torch

from fsi_nb.checkpoint import checkpoint_path, list_checkpoints, load_checkpoint
from fsi_nb.distributed import torchrun_command

STEPS, SAVE = 10, 3
ARGS = ['--preset', 'tiny', '--set', 'd_model=32', '--set', 'warmup_steps=2', '--batch-size', '2', '--seq-len', '32', '--log-interval', '1',
        '--save-interval', str(SAVE), '--set', 'keep_checkpoints=9', '--threads', '1', '--no-progress', '--set', "precision='fp32'", '--max-steps', str(STEPS)]
MOE = ['--set', 'n_routed=4', '--set', 'n_shared=1', '--set', 'top_k=2', '--set', 'expert_d_ff=32']
ENV = dict(OMP_NUM_THREADS='1', TOKENIZERS_PARALLELISM='false')
REL = 1e-6


def args(data, runs, name, *extra):
    return [*ARGS, '--data-dir', str(data), '--runs-dir', str(runs), '--run-name', name, *extra]

def one_process(data, runs, name, *extra, env=None, wait=True):
    "One process, grad_accum 2 (the same micro-batches per step as two ranks of grad_accum 1); its output, or the process."
    p = subprocess.Popen([sys.executable, '-m', 'fsi_nb.train', *args(data, runs, name, '--grad-accum', '2', *extra)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, **ENV, **(env or {})})
    if not wait: return p
    err = p.communicate(timeout=300)[1]
    assert p.returncode == 0, err[-3000:]
    return err

def two_ranks(data, runs, name, *extra, env=None):
    "A torchrun job of two ranks, started (not waited for)."
    return subprocess.Popen(torchrun_command(2, args(data, runs, name, '--grad-accum', '1', *extra)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, **ENV, **(env or {})})

def finish(p, timeout=300):
    out = p.communicate(timeout=timeout)[0]
    return p.returncode, out

def records(run_dir):
    return [json.loads(l) for l in (Path(run_dir)/'log.jsonl').read_text().splitlines()]

def close(a, b, keys=('loss', 'avg_loss', 'grad_norm')):
    "Two runs' logs: the same steps, lr and tokens; losses within REL (see the module's docstring)."
    assert [(x['step'], x['lr'], x['tokens'], x['bad_steps']) for x in a] == [(x['step'], x['lr'], x['tokens'], x['bad_steps']) for x in b]
    for x, y in zip(a, b):
        for k in keys:
            assert (x[k] is None and y[k] is None) or x[k] == pytest.approx(y[k], rel=REL if k != 'grad_norm' else 1e-4), (x['step'], k, x[k], y[k])

def final_weights(run_dir):
    return load_checkpoint(list_checkpoints(Path(run_dir)/'checkpoints')[-1])['model']

def same_weights(a, b):
    assert list(a) == list(b)
    for k in a: torch.testing.assert_close(a[k].float(), b[k].float(), rtol=1e-5, atol=1e-6, msg=k)

def rank_pid(torchrun_pid, rank, timeout=60):
    "The pid of rank `rank` among torchrun's worker processes (its RANK variable)."
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        kids = []
        for task in Path(f'/proc/{torchrun_pid}/task').iterdir():
            try: kids += (task/'children').read_text().split()
            except OSError: pass
        for pid in kids:
            try: env = Path(f'/proc/{pid}/environ').read_bytes().split(b'\0')
            except OSError: continue
            if f'RANK={rank}'.encode() in env: return int(pid)
        time.sleep(0.05)
    raise TimeoutError(f'no rank {rank} under torchrun {torchrun_pid}')

def wait_for_steps(log, n, proc, timeout=180):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if log.exists() and len(log.read_text().splitlines()) >= n: return
        assert proc.poll() is None, f'job ended before step {n}: {proc.returncode}\n{proc.stdout.read()[-3000:]}'
        time.sleep(0.01)
    raise TimeoutError(f'no step {n} in {log} after {timeout}s')

def resume_from(src, dst, step):
    "A copy of run folder `src` as if the machine had died after saving `step`."
    shutil.copytree(src, dst)
    assert checkpoint_path(dst/'checkpoints', step).exists()
    log = dst/'log.jsonl'; log.write_text(''.join(log.read_text().splitlines(keepends=True)[:step]))
    for p in list_checkpoints(dst/'checkpoints'):
        if int(p.stem.split('_')[1]) > step: p.unlink(); p.with_name(p.name + '.sha256').unlink()


@pytest.fixture(scope='module')
def dense_one(prepared_data, tmp_path_factory):
    "One process, grad_accum 2: the reference of the dense runs."
    runs = tmp_path_factory.mktemp('dense1')
    one_process(prepared_data, runs, 'one')
    return runs/'one'


def test_ddp_resume_from_1_to_2_ranks_kill_9_of_one_rank_then_resume_through_train_nproc(prepared_data, tmp_path, dense_one):
    """A one-process run's checkpoint (step 3) resumed on two ranks (DDP); kill -9 of rank 1 stops the job (torchrun tears
    it down, no rank waits forever); the resume through `train(nproc=2)`, as the notebook calls it, ends on the
    reference's losses and weights."""
    from fsi_nb.train import train
    run = tmp_path/'d'
    resume_from(dense_one, run, 3)
    p = two_ranks(prepared_data, tmp_path, 'd')                      # 1 -> 2 processes
    wait_for_steps(run/'log.jsonl', 2 * SAVE + 1, p)                 # past the save of step 6 (rank 0 wrote it: both ranks took part)
    t0 = time.monotonic()
    os.kill(rank_pid(p.pid, 1), signal.SIGKILL)
    code, out = finish(p, timeout=120)
    assert code != 0 and time.monotonic() - t0 < 90, (code, out[-3000:])
    assert 'resuming d from' in out and 'saved by 1 process(es), this run has 2' in out, out[-3000:]
    ck = load_checkpoint(checkpoint_path(run/'checkpoints', 2 * SAVE))
    assert ck['world_size'] == 2 and len(ck['rng_ranks']) == 2 and not torch.equal(ck['rng_ranks'][0]['torch'], ck['rng_ranks'][1]['torch'])
    ref = load_checkpoint(checkpoint_path(dense_one/'checkpoints', 2 * SAVE))
    assert list(ck['model']) == list(ref['model']) and list(ck['optimizer']['state']) == list(ref['optimizer']['state'])   # one-process format

    seen = []
    r = train('tiny', 'd', progress=False, callback=seen.append, nproc=2, data_dir=prepared_data, runs_dir=tmp_path, d_model=32,
              warmup_steps=2, batch_size=2, seq_len=32, log_interval=1, save_interval=SAVE, keep_checkpoints=9, threads=1,
              precision='fp32', max_steps=STEPS, grad_accum=1)
    assert (r.stopped, r.step, r.resumed_from) == ('finished', STEPS, checkpoint_path(run/'checkpoints', 2 * SAVE))
    assert [x['step'] for x in seen] == list(range(2 * SAVE, STEPS))  # rank 0's new records reached the callback
    assert json.loads((run/'config.json').read_text())['world_size'] == 2
    close(records(run), records(dense_one))
    a, b = final_weights(run), final_weights(dense_one)
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)   # DDP: the same update, bit for bit


def test_fsdp2_moe_matches_one_process_agrees_on_nan_signal_and_bias_then_resumes_on_one(prepared_data, tmp_path):
    """FSDP2 on a tiny MoE: two ranks (grad_accum 1) against one process (grad_accum 2). A NaN on rank 1 alone at step 2:
    both ranks skip the step, as one process skips its NaN step. The ranks draw different windows. SIGTERM to rank 1
    alone: both ranks finish the step, save it and stop. `check_replicas` compared the ranks' router biases before every
    save. Then the 2-rank checkpoint resumes on one process, to the one-process run's losses and weights, router bias
    included, bit for bit."""
    from fsi_nb.batches import Batcher, global_micro
    from fsi_nb.runs import resolve_run
    from fsi_nb.train import build_model
    run = tmp_path/'two'
    p = two_ranks(prepared_data, tmp_path, 'two', *MOE, env=dict(FSI_NB_INJECT_NAN='2', FSI_NB_INJECT_NAN_RANK='1'))
    ref = one_process(prepared_data, tmp_path, 'one', *MOE, env=dict(FSI_NB_INJECT_NAN='2'), wait=False)   # meanwhile
    wait_for_steps(run/'log.jsonl', 5, p)
    os.kill(rank_pid(p.pid, 1), signal.SIGTERM)                      # the signal reaches one rank only
    code, out = finish(p)
    ref_err = ref.communicate(timeout=300)[1]
    assert ref.returncode == 0, ref_err[-3000:]
    st = json.loads((run/'status.json').read_text())
    assert st['state'] == 'signal' and st['signum'] == signal.SIGTERM, (st, out[-3000:])   # rank 0 stopped with it, and says why
    assert "copies of ['" not in out, out[-3000:]   # check_replicas found the router biases equal on both ranks at every save
    stopped_at, one = st['step'], records(tmp_path/'one')
    assert 5 <= stopped_at < STEPS and list_checkpoints(run/'checkpoints')[-1] == checkpoint_path(run/'checkpoints', stopped_at)
    two = records(run)
    assert len(two) == stopped_at and two[2]['loss'] is None and two[-1]['bad_steps'] == 1 and 'step 2: loss nan' in out
    close(two, one[:stopped_at])

    # the ranks drew different windows: step 0's loss is the mean of micro-batches 0 (rank 0's) and 1 (rank 1's), which differ
    spec = resolve_run('tiny', 'x', data_dir=prepared_data, runs_dir=tmp_path, d_model=32, n_routed=4, n_shared=1, top_k=2,
                       expert_d_ff=32, precision='fp32', device='cpu')
    n = torch.get_num_threads(); torch.set_num_threads(1)
    try:
        model, bt = build_model(spec, prepared_data).train(), Batcher(prepared_data, seed=spec.train.seed, max_steps=STEPS, verify=False)
        with torch.no_grad():
            losses = [model(**bt.get_batch(0, global_micro(0, rank, 1), 2, 32), return_logits=False).loss.item() for rank in (0, 1)]
    finally: torch.set_num_threads(n)
    assert abs(losses[0] - losses[1]) > 1e-3 and two[0]['loss'] == pytest.approx(sum(losses) / 2, rel=REL), (losses, two[0]['loss'])

    err = one_process(prepared_data, tmp_path, 'two', *MOE)            # 2 -> 1 process, grad_accum 2: the same windows
    assert 'saved by 2 process(es), this run has 1' in err and 'changed training settings' not in err, err[-2000:]
    close(records(run), one)
    a, b = final_weights(run), final_weights(tmp_path/'one')
    same_weights(a, b)
    biases = [k for k in a if k.endswith('router_bias')]
    assert biases and all(torch.equal(a[k], b[k]) for k in biases) and any(a[k].abs().sum() > 0 for k in biases)
    ck = load_checkpoint(checkpoint_path(run/'checkpoints', stopped_at))
    assert ck['world_size'] == 2 and ck['model']['lm_head.weight'] is ck['model']['tok_embeddings.weight']   # tied, as one process saves
    assert list(ck['optimizer']['state']) == list(load_checkpoint(checkpoint_path(tmp_path/'one'/'checkpoints', STEPS))['optimizer']['state'])


def test_activation_checkpointing_same_loss_and_gradients(prepared_data):
    """One fp32 step of a tiny MoE model (with dropout) on real windows, with `'moe'` and `'all'` against without: the same
    loss, every parameter's gradient and the experts' counts (tolerance 1e-6; bit for bit on this CPU)."""
    from dataclasses import replace
    from fsi_nb.batches import Batcher
    from fsi_nb.config import get_preset
    from fsi_nb.distributed import activation_checkpointing
    from fsi_nb.model import FSIEdgeModel
    from fsi_nb.moe import MoEFFN
    cfg = replace(get_preset('tiny').model, d_model=32, n_routed=4, n_shared=1, top_k=2, expert_d_ff=32, dropout=0.1)
    batch = Batcher(prepared_data, seed=0, max_steps=1, verify=False).get_batch(0, 0, 2, 32)
    def step(mode):
        torch.manual_seed(0); m = FSIEdgeModel(cfg).train()
        wrapped = activation_checkpointing(m, mode)
        torch.manual_seed(1); loss = m(**batch, return_logits=False).loss; loss.backward()
        load = torch.cat([b.ffn.expert_load for b in m.layers if isinstance(b.ffn, MoEFFN)])
        return loss.detach(), {n: p.grad for n, p in m.named_parameters()}, load, len(wrapped)
    n = torch.get_num_threads(); torch.set_num_threads(1)
    try: (loss0, grads0, load0, _), runs = step('none'), {mode: step(mode) for mode in ('moe', 'all')}
    finally: torch.set_num_threads(n)
    assert load0.sum() > 0 and all(g is not None for g in grads0.values())
    for mode, (loss, grads, load, wrapped) in runs.items():
        assert wrapped == cfg.n_layers, mode
        torch.testing.assert_close(loss, loss0, rtol=1e-6, atol=0)
        for k in grads0: torch.testing.assert_close(grads[k], grads0[k], rtol=1e-6, atol=1e-9, msg=f'{mode}: {k}')
        assert torch.equal(load, load0), mode                      # counted once, not again in the recomputation


def test_activation_checkpointing_trains_the_same(prepared_data, tmp_path):
    "`activation_checkpointing='all'` in a real run: the same losses as without it (bit for bit here)."
    from fsi_nb.train import train
    common = dict(data_dir=prepared_data, runs_dir=tmp_path, d_model=32, warmup_steps=2, batch_size=2, seq_len=32, log_interval=1,
                  save_interval=SAVE, threads=1, precision='fp32', max_steps=3, grad_accum=2, progress=False)
    n = torch.get_num_threads()
    try:
        plain = train('tiny', 'plain', **common)
        ac = train('tiny', 'ac', activation_checkpointing='all', **common)
    finally: torch.set_num_threads(n)
    assert [x['loss'] for x in records(ac.run_dir)] == [x['loss'] for x in records(plain.run_dir)]


def test_bad_launch_arguments_stop_before_torchrun(tmp_path):
    from fsi_nb.config import load_settings
    from fsi_nb.train import train
    with pytest.raises(ValueError, match='unknown setting'):
        train('tiny', 'x', nproc=2, runs_dir=tmp_path, max_step=3)
    with pytest.raises(ValueError, match='settings.ini itself'):
        train('tiny', 'x', nproc=2, settings=load_settings(threads=3), runs_dir=tmp_path)
    assert not (tmp_path/'x').exists()
