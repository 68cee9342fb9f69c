"""The pipeline as a user runs it: `python -m fsi_nb.train --stages ...` chains one run per stage, each from the previous
one's final weights; a kill -9 inside a stage resumes it exactly and re-runs no finished stage; bad run folders get the fix."""
import json, os, shutil, signal, subprocess, sys, time
from pathlib import Path

import pytest, torch

from fsi_nb.config import STAGES
from fsi_nb.checkpoint import load_checkpoint
from fsi_nb.run_folder import pick_checkpoint

SMALL = ['--preset', 'tiny', '--set', 'd_model=32', '--set', 'warmup_steps=1', '--batch-size', '2', '--seq-len', '64',
         '--log-interval', '1', '--save-interval', '2', '--threads', '1', '--no-progress', '--set', 'eval_batches=1',
         '--set', 'group_size=2', '--set', 'max_new_tokens=12', '--set', 'num_prompts=4', '--set', 'epochs=0.0']

def cli(data, runs, name, stages, *extra, steps=6):
    return [sys.executable, '-m', 'fsi_nb.train', *SMALL, '--data-dir', str(data), '--runs-dir', str(runs), '--run-name', name,
            '--stages', stages, '--max-steps', str(steps), *extra]

def run(cmd, **kw): return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)

def records(run_dir): return [json.loads(l) for l in (Path(run_dir)/'log.jsonl').read_text().splitlines()]

def numbers(recs):
    keys = ('step', 'loss', 'avg_loss', 'lr', 'grad_norm', 'tokens', 'reward', 'reward_margin')
    return [{k: r.get(k) for k in keys} for r in recs]

ALL = ','.join(STAGES)

def test_whole_chain_smoke_from_one_command(prepared_data, tmp_path):
    "Every stage of the CPU seed's launch command, two steps each (--smoke), chained: each from the previous one's weights."
    r = run([sys.executable, '-m', 'fsi_nb.train', '--stages', ALL, '--smoke', '--no-progress', '--data-dir', str(prepared_data),
             '--runs-dir', str(tmp_path), '--run-name', 'chain'])
    assert r.returncode == 0, r.stderr[-3000:]
    for stage in STAGES: assert stage in r.stdout
    pdir, names = tmp_path/'chain', list(STAGES)
    table = (pdir/'pipeline.csv').read_text()
    assert table.count('finished') == len(names), table
    for prev, stage in zip(names, names[1:]):
        cfg = json.loads((pdir/stage/'config.json').read_text())
        assert cfg['init_from'] == str(pick_checkpoint(pdir/prev, 'best')[0]), (stage, cfg['init_from'])   # each from its previous stage's best
        assert cfg['stage'] == stage and cfg['objective']
    assert json.loads((pdir/'stage5'/'config.json').read_text())['model']['rope_base'] == STAGES['stage5'].model['rope_base']
    # the starting weights of a stage are the previous stage's final ones: stage2's first validation equals stage1b's last
    first = json.loads((pdir/'stage1b'/'status.json').read_text())['evals'][0]
    assert first['step'] == 0
    import pandas as pd   # the held-out scores follow the weights: a smoke run's 5-task suite and the pretraining loss, every stage
    csv = pd.read_csv(pdir/'pipeline.csv')
    assert list(csv.suite_tasks) == [5] * len(names), csv.suite_tasks
    for m in ('suite_pass1', 'suite_passk', 'pretrain_loss_128'):
        assert csv[f'{m}_before'].notna().all() and csv[f'{m}_after'].notna().all(), m
        assert list(csv[f'{m}_before'][1:]) == list(csv[f'{m}_after'][:-1]), m   # each set of weights scored once
    assert csv.suite_pass1_paired.all() and any(c.startswith('suite_arith_') for c in csv.columns)   # paired over tasks; per family
    units = {json.loads((pdir/st/'suite.json').read_text())['best']['pretrain_loss_128_units_of'] for st in names}
    assert len(units) == 1, units   # every stage's weights on the first stage's held-out batches, whatever its own batch size
    for stage in names:   # per-unit values: in status.json's first and latest validation (a change's paired error), never in the log
        st = json.loads((pdir/stage/'status.json').read_text())
        assert f"{st['metric']}_per_unit" in st['evals'][0] and f"{st['metric']}_per_unit" in st['evals'][-1], stage
        assert all(f"{st['metric']}_per_unit" not in e for e in st['evals'][1:-1]), stage
        assert not any(k.endswith('_per_unit') for r in records(pdir/stage) for k in r), stage

@pytest.mark.parametrize('stage', ['stage2', 'stage3', 'stage4'])
def test_kill_9_inside_a_stage_resumes_exactly(prepared_data, tmp_path, stage):
    "kill -9 mid-stage (SFT, GRPO, DPO); the rerun skips the finished stage and the losses equal an uninterrupted chain's."
    stages = f'stage1,{stage}'
    ref = run(cli(prepared_data, tmp_path/'ref', 'p', stages))
    assert ref.returncode == 0, ref.stderr[-3000:]
    log = tmp_path/'k'/'p'/stage/'log.jsonl'
    p = subprocess.Popen(cli(prepared_data, tmp_path/'k', 'p', stages), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    while not (log.exists() and len(log.read_text().splitlines()) >= 3):   # past the save at step 2 of the second stage
        assert p.poll() is None and time.monotonic() - t0 < 300, 'the chain ended before the kill'
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL); p.wait()
    r = run(cli(prepared_data, tmp_path/'k', 'p', stages))
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'stage1 is done (finished); not re-run' in r.stdout and f'resuming p/{stage} from' in r.stderr, (r.stdout, r.stderr[-2000:])
    for s in ('stage1', stage):
        assert numbers(records(tmp_path/'k'/'p'/s)) == numbers(records(tmp_path/'ref'/'p'/s)), s
    a, b = (load_checkpoint(pick_checkpoint(d/'p'/stage)[0])['model'] for d in (tmp_path/'ref', tmp_path/'k'))
    assert all(torch.equal(a[k], b[k]) for k in a)

def test_sft_stage_trains_on_the_reply_only(prepared_data, tmp_path):
    "The SFT objective's labels: -100 on every prompt token, the reply's tokens elsewhere; changing the prompt's text moves no label."
    from fsi_nb.runs import resolve_run
    from fsi_nb.objectives import make_objective, encode_example
    from fsi_nb.tokenizer import load_tokenizer
    spec = resolve_run('tiny', 'x', stage='stage2', init_from='scratch', data_dir=prepared_data, runs_dir=tmp_path)
    obj = make_objective(spec, prepared_data)
    x, y = obj.rows['train']
    assert len(x) > 0 and obj.steps() > 0
    tok = load_tokenizer(prepared_data/'tokenizer')
    user, assistant = tok.token_to_id('<|user|>'), tok.token_to_id('<|assistant|>')
    for row_x, row_y in zip(x[:50], y[:50]):   # from each <|user|> up to its <|assistant|>, no label
        inside = False
        for t, l in zip(row_x.tolist(), row_y.tolist()):
            if t == user: inside = True
            if inside: assert l == -100
            if t == assistant: inside = False
    from fsi_nb.train import build_model   # the validation's unit is a record: its token-weighted mean is the batches' reply loss
    from dataclasses import replace
    obj.cfg = replace(obj.cfg, eval_batches=3, precision='fp32'); model = build_model(spec, prepared_data).eval()
    val = obj.evaluate(model)
    xv, yv = obj.rows['val']
    with torch.no_grad():
        by_batch = [(model(input_ids=xv[s:s + obj.cfg.batch_size], labels=yv[s:s + obj.cfg.batch_size], return_logits=False).aux['lm_loss'].item(),
                     int((yv[s:s + obj.cfg.batch_size, 1:] != -100).sum())) for s in range(0, 3 * obj.cfg.batch_size, obj.cfg.batch_size)]
    assert len(val['val_reply_loss_per_unit']) == 3 * obj.cfg.batch_size and sum(val['val_reply_loss_unit_weights']) == sum(k for _, k in by_batch)
    assert abs(val['val_reply_loss'] - sum(l * k for l, k in by_batch) / sum(k for _, k in by_batch)) < 1e-4 * val['val_reply_loss']
    rec = obj.records('train')[0]
    a, b = encode_example(tok, rec), encode_example(tok, dict(rec, prompt=rec['prompt'] + ' Please hurry.'))
    assert [l for l in a[1] if l != -100] == [l for l in b[1] if l != -100]

def test_sft_records_cut_at_the_context_are_reported(prepared_data, tmp_path, capsys):
    "A record longer than seq_len is cut to it (no row spans two contexts): the objective counts them, says so once, and status.json keeps the note."
    from fsi_nb.runs import resolve_run
    from fsi_nb.objectives import make_objective, encode_example
    from fsi_nb.train import train
    spec = resolve_run('tiny', 'x', stage='stage2', init_from='scratch', data_dir=prepared_data, runs_dir=tmp_path, seq_len=32)
    obj = make_objective(spec, prepared_data)
    longer = sum(len(encode_example(obj.tok, r)[0]) > 32 for r in obj.records('train'))   # counted by hand
    assert obj.cut['train'] == (longer, len(obj.records('train'))) and longer > 0
    assert f'{longer} of {len(obj.records("train"))} training records' in capsys.readouterr().out
    wide = make_objective(resolve_run('tiny', 'y', stage='stage2', init_from='scratch', data_dir=prepared_data, runs_dir=tmp_path, seq_len=128,
                                      max_seq_len=4096), prepared_data)
    assert wide.cut['train'][0] < longer
    r = train('tiny', 'cut', progress=False, stage='stage2', init_from='scratch', data_dir=prepared_data, runs_dir=tmp_path, d_model=32,
              batch_size=2, seq_len=32, max_steps=1, warmup_steps=0, eval_batches=1)
    notes = json.loads((r.run_dir/'status.json').read_text())['notes']
    assert len(notes) == 1 and 'are longer than seq_len=32' in notes[0] and 'Fix:' in notes[0], notes

def test_read_only_runs_folder_is_a_clear_error(prepared_data, tmp_path):
    "A runs folder on a read-only filesystem (EROFS stops root too): exit 4 with the cause and the fix, no traceback."
    ro = tmp_path/'ro'; ro.mkdir()
    if subprocess.run(['mount', '-t', 'tmpfs', '-o', 'ro,size=1m', 'tmpfs', str(ro)], capture_output=True).returncode:
        pytest.skip('cannot mount a read-only tmpfs here (not root, or no CAP_SYS_ADMIN)')
    try:
        r = run([sys.executable, '-m', 'fsi_nb.train', '--preset', 'tiny', '--data-dir', str(prepared_data), '--runs-dir', str(ro),
                 '--run-name', 'x', '--max-steps', '2', '--no-progress'])
    finally: subprocess.run(['umount', str(ro)])
    assert r.returncode == 4, (r.returncode, r.stderr[-2000:])
    assert 'cannot write the run folder' in r.stderr and 'Read-only file system' in r.stderr and 'Fix: point runs_dir' in r.stderr
    assert 'Traceback' not in r.stderr, r.stderr

def test_grpo_reference_model_never_changes(prepared_data, tmp_path):
    "GRPO with a KL term: the policy moves, the frozen reference (the starting weights) does not, step after step."
    from fsi_nb.runs import resolve_run
    from fsi_nb.objectives import make_objective
    from fsi_nb.train import build_model, make_optimizer, train_step
    spec = resolve_run('tiny', 'g', stage='stage3', init_from='scratch', data_dir=prepared_data, runs_dir=tmp_path, d_model=32, batch_size=2,
                       group_size=4, max_new_tokens=8, kl_coef=0.1, lr=1e-2, precision='fp32', threads=1)
    obj, model = make_objective(spec, prepared_data), build_model(spec, prepared_data)
    obj.setup(model)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    opt = make_optimizer(model, spec.train)
    for step in range(3):
        r = train_step(model, opt, obj, step, spec.train, spec.device)
        assert r.ok and 'kl' in r.metrics
    assert all(torch.equal(v, start[k]) for k, v in obj.ref.state_dict().items())
    assert not all(torch.equal(v, start[k]) for k, v in model.state_dict().items())
    assert all(not p.requires_grad for p in obj.ref.parameters())

def test_dpo_epochs_set_the_steps_from_its_pairs(prepared_data, tmp_path):
    "DPO's pairs exist only after sampling; `epochs` must turn into steps from them, not fall back to the preset's max_steps."
    from fsi_nb.train import train
    r = train('tiny', 'd', progress=False, stage='stage4', init_from='scratch', data_dir=prepared_data, runs_dir=tmp_path, d_model=32, batch_size=2,
              grad_accum=1, group_size=2, max_new_tokens=8, num_prompts=6, epochs=1.0, eval_batches=1, threads=1)
    pairs = json.loads((tmp_path/'d'/'config.json').read_text())
    assert r.stopped == 'finished' and 1 <= r.total_steps <= 3, r.total_steps     # ceil(pairs / 2), at most 6 pairs
    assert pairs['train']['max_steps'] == r.total_steps

def test_dpo_selection_pairs_come_from_prompts_it_never_trains_on(prepared_data, tmp_path):
    "DPO's settings are chosen on selection pairs: training prompts past num_prompts, scored beside the held-out pairs, never in a batch."
    from fsi_nb.runs import resolve_run
    from fsi_nb.objectives import make_objective
    from fsi_nb.train import build_model
    spec = resolve_run('tiny', 'p', stage='stage4', init_from='scratch', data_dir=prepared_data, runs_dir=tmp_path, d_model=32,
                       batch_size=2, group_size=2, max_new_tokens=8, num_prompts=8, precision='fp32', threads=1)
    obj, model = make_objective(spec, prepared_data), build_model(spec, prepared_data)
    obj.setup(model)   # random weights pass nothing: every prompt makes a pair, its reference solution preferred
    def prompts(pairs):
        ids, labels = pairs['chosen']['input_ids'], pairs['chosen']['labels']
        return {tuple(i[:int((l != -100).nonzero()[0])].tolist()) for i, l in zip(ids, labels)}
    train, select, val = (prompts(obj.pairs[s]) for s in ('train', 'select', 'val'))
    assert len(train) == 8 and len(select) == 2 and val and not (train & select) and not (select & val)
    seen = {tuple(i[:int((l != -100).nonzero()[0])].tolist()) for step in range(8)
            for i, l in zip(obj.batch(step, 0)['chosen']['input_ids'], obj.batch(step, 0)['chosen']['labels'])}
    assert seen <= train and not (seen & select)
    scores = obj.evaluate(model)
    assert {'val_reward_margin', 'val_accuracy', 'select_reward_margin', 'select_accuracy', 'select_reward_margin_per_unit'} <= set(scores)
    assert scores['select_reward_margin'] == 0.0   # the starting weights are the reference: every margin is 0

def test_a_new_stage_is_one_row(prepared_data, tmp_path, monkeypatch):
    "A stage added to the table alone (SFT on the explain records only) trains in a pipeline; no other module is edited."
    from dataclasses import replace
    from fsi_nb.config import Stage
    from fsi_nb.runs import resolve_run
    from fsi_nb.objectives import make_objective
    from fsi_nb.stages import run_pipeline
    row = Stage('stage2x', 'sft', 'explain-this-code records only', 'stage1', dict(kinds=('explain',), epochs=1.0, lr=1e-3))
    monkeypatch.setitem(STAGES, 'stage2x', row)
    small = dict(data_dir=prepared_data, runs_dir=tmp_path, d_model=32, batch_size=2, seq_len=64, warmup_steps=1, log_interval=1,
                 eval_batches=1, threads=1)
    spec = resolve_run('tiny', 'x', stage='stage2x', init_from='scratch', **small)
    assert (spec.stage, spec.objective.kinds, spec.objective.epochs, spec.train.lr) == (row, ('explain',), 1.0, 1e-3)
    assert {r['kind'] for r in make_objective(spec, prepared_data).records('train')} == {'explain'}
    res = run_pipeline('stage1,stage2x', name='new', progress=False, max_steps=3, **small)
    assert list(res.table.state) == ['finished', 'finished'] and list(res.table.steps) == [3, 3]   # epochs capped by max_steps
    cfg = json.loads((res.pipeline_dir/'stage2x'/'config.json').read_text())
    assert cfg['objective_config']['kinds'] == ['explain'] and cfg['init_from'] == str(pick_checkpoint(res.pipeline_dir/'stage1', 'best')[0])

def test_max_steps_with_stages_is_pretraining_and_a_cap(prepared_data, tmp_path):
    "--max-steps N: the pretraining stage trains N, an epoch-based stage at most N (its own number when smaller)."
    from fsi_nb.stages import run_pipeline
    small = dict(data_dir=prepared_data, runs_dir=tmp_path, d_model=32, batch_size=2, seq_len=64, warmup_steps=1, log_interval=1,
                 eval_batches=1, threads=1)
    res = run_pipeline('stage1,stage2', name='cap', progress=False, max_steps=4, **small, **{'stage2.epochs': 1e-4})
    assert list(res.table.steps) == [4, 1]                  # stage2's own epochs make one step, fewer than the cap
    res = run_pipeline('stage1,stage2', name='cap2', progress=False, max_steps=3, **small)
    assert list(res.table.steps) == [3, 3]                  # tiny's 6 epochs of SFT capped at 3

def test_a_pipeline_that_runs_model_code_without_isolation_is_refused_before_it_starts(prepared_data, tmp_path):
    "No bwrap and no unshare on PATH, no FSI_SANDBOX_ALLOW_UNSAFE: refused with exit 2 and the fix, before stage1 trains an hour."
    env = {k: v for k, v in os.environ.items() if k != 'FSI_SANDBOX_ALLOW_UNSAFE'} | {'PATH': str(Path(sys.executable).parent)}
    r = subprocess.run([sys.executable, '-m', 'fsi_nb.train', '--stages', 'stage1,stage3b', '--data-dir', str(prepared_data),
                        '--runs-dir', str(tmp_path), '--max-steps', '2', '--no-progress'], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 2 and 'refusing to run model-written code with no isolation' in r.stderr and 'apt-get install bubblewrap' in r.stderr, r.stderr[-2000:]
    assert not (tmp_path/'tiny-pipeline'/'stage1'/'checkpoints').exists()   # nothing trained

def test_sft_replay_mixes_pretraining_windows_at_its_share(prepared_data, tmp_path):
    "replay=0.2: 2 pretraining windows beside 8 records, the same for a (step, micro) every time; the loss weighs each part by its rows."
    from fsi_nb.runs import resolve_run
    from fsi_nb.objectives import make_objective
    from fsi_nb.model import FSIEdgeModel
    spec = resolve_run('tiny', 'x', stage='stage2', init_from='scratch', data_dir=prepared_data, runs_dir=tmp_path,
                       batch_size=8, seq_len=64, replay=0.2, d_model=32)
    obj = make_objective(spec, prepared_data)
    b = obj.batch(3, 0)
    assert b['input_ids'].shape == (8, 64) and b['replay']['input_ids'].shape == (2, 64)
    assert (b['replay']['labels'] != -100).float().mean() > 0.9              # general text: the loss on (nearly) every token
    assert torch.equal(obj.batch(3, 0)['replay']['input_ids'], b['replay']['input_ids'])
    assert not torch.equal(obj.batch(4, 0)['replay']['input_ids'], b['replay']['input_ids'])
    torch.manual_seed(0)
    model = FSIEdgeModel(spec.model)
    loss, m = obj.loss(model, b)
    sft = model(input_ids=b['input_ids'], labels=b['labels']).loss
    lm = model(input_ids=b['replay']['input_ids'], labels=b['replay']['labels']).loss
    torch.testing.assert_close(loss, 0.8 * sft + 0.2 * lm, rtol=1e-5, atol=0)
    assert abs(m['replay_loss'] - lm.item()) < 1e-4 * lm.item() and obj.tokens(b) == 10 * 64
    plain = make_objective(resolve_run('tiny', 'y', stage='stage2', init_from='scratch', data_dir=prepared_data, runs_dir=tmp_path,
                                       batch_size=8, seq_len=64, replay=0.0, d_model=32), prepared_data)
    assert 'replay' not in plain.batch(3, 0) and torch.equal(plain.batch(3, 0)['input_ids'], b['input_ids'])   # the records unchanged
    with pytest.raises(ValueError, match='Fix'): resolve_run('tiny', 'z', stage='stage2', replay=1.0, data_dir=prepared_data, runs_dir=tmp_path)

def test_grpo_dynamic_sampling_replaces_groups_that_score_alike(prepared_data, tmp_path):
    "resample_rounds=2: groups whose samples all score alike are replaced by fresh prompts' mixed groups, up to two more draws; 0: the batch as drawn."
    from fsi_nb.runs import resolve_run
    from fsi_nb.objectives import make_objective
    from fsi_nb.model import FSIEdgeModel
    def objective(rounds):
        spec = resolve_run('tiny', f'g{rounds}', stage='stage3', init_from='scratch', data_dir=prepared_data, runs_dir=tmp_path,
                           batch_size=4, group_size=4, max_new_tokens=4, resample_rounds=rounds, d_model=32, precision='fp32')
        obj = make_objective(spec, prepared_data)
        train = obj.prompts['train']
        learnable = {r['prompt'] for r in train[::2]}   # half the prompts: samples score by their first token's parity; the rest all 0
        obj.rewards = lambda recs, comps: [float(r['prompt'] in learnable and c[0] % 2) for r, c in zip(recs, comps)]
        return obj, learnable, spec
    (plain, learnable, spec), (dyn, _, _) = objective(0), objective(2)
    torch.manual_seed(0)
    model = FSIEdgeModel(spec.model)
    a, b = plain.batch(0, 0, model), dyn.batch(0, 0, model)
    assert a['stats']['prompts_drawn'] == 4 and a['input_ids'].shape[0] == b['input_ids'].shape[0] == 16
    assert b['stats']['informative'] > a['stats']['informative'] and b['stats']['prompts_drawn'] > 4
    assert b['stats']['informative'] == 1.0 or b['stats']['prompts_drawn'] == 12   # all mixed, or every draw spent
    assert (b['advantages'].view(4, 4).abs().sum(-1) > 0).float().mean() == b['stats']['informative']
    c = dyn.batch(0, 0, model)
    assert torch.equal(c['input_ids'], b['input_ids']) and torch.equal(c['advantages'], b['advantages'])   # a pure function of (step, micro, weights)

def test_grpo_rewards_run_beside_the_logprobs_and_still_score_their_own_samples(prepared_data, tmp_path):
    """With every group kept (resample_rounds=0) a step's rewards may run in a thread while the old policy's logprobs
    are computed (`overlap_rewards`; by default on a GPU only). Either way the batch must equal the slow reference: the
    same samples, each sample's own reward and that reward's advantage, with a reward that ends long after the logprobs."""
    from fsi_nb.runs import resolve_run
    from fsi_nb.objectives import make_objective, group_advantages, completion_batch, sequence_logprobs
    from fsi_nb.model import FSIEdgeModel
    spec = resolve_run('tiny', 'g', stage='stage3', init_from='scratch', data_dir=prepared_data, runs_dir=tmp_path,
                       batch_size=4, group_size=4, max_new_tokens=4, d_model=32, precision='fp32')
    obj, seen = make_objective(spec, prepared_data), []
    assert obj.overlap_rewards is None and obj.device.type == 'cpu'   # the default: sequential on a CPU (the sandbox would fight the model)
    def slow_rewards(recs, comps):   # the parity of each sample's first token, returned after the logprobs are long done
        time.sleep(1.0); seen.append((recs, comps)); return [float(c[0] % 2) for c in comps]
    obj.rewards = slow_rewards
    torch.manual_seed(0)
    model = FSIEdgeModel(spec.model)
    batches = []
    for overlap in (True, False):
        obj.overlap_rewards = overlap
        b = obj.batch(0, 0, model); batches.append(b)
        recs, comps = seen[-1]
        rewards = torch.tensor([float(c[0] % 2) for c in comps]).view(4, 4)
        assert 0 < rewards.mean() < 1   # rewards that differ, so a mix-up would show
        assert torch.equal(b['advantages'], group_advantages(rewards).view(-1)) and b['stats']['reward'] == float(rewards.mean())
        ref = completion_batch([obj.prompt_ids(r) for r in recs], comps, obj.special['<|pad|>'], obj.device)   # the samples the rewards saw
        assert torch.equal(ref['input_ids'], b['input_ids']) and torch.equal(ref['labels'], b['labels'])
        with torch.no_grad(): assert torch.equal(sequence_logprobs(model, ref)[0].float(), b['old_logprobs'])
    assert all(torch.equal(batches[0][k], batches[1][k]) for k in ('input_ids', 'advantages', 'old_logprobs'))
