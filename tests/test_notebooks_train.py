"""`nbs/train.ipynb` and `nbs/eval.ipynb` end to end with papermill, as the README runs them: a tiny run, a GPU preset
refused without a GPU, and that preset's CPU smoke test."""
import json, math, os, subprocess, sys
from pathlib import Path

import pandas as pd, pytest, torch

NBS = Path(__file__).resolve().parents[1]/'nbs'

def papermill(nb, out, *params, env=None, yaml=None):
    cmd = [sys.executable, '-m', 'papermill', str(NBS/nb), str(out), '-k', 'python3', '--cwd', str(NBS), '--log-level', 'WARNING']
    for k, v in params: cmd += ['-p', k, str(v)]
    if yaml: cmd += ['-y', yaml]   # parameters papermill's -p would pass as strings (a dict)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, **(env or {})})

def outputs(nb_path):
    "(text of all outputs, number of image/png outputs, MIME types seen)."
    nb, texts, pngs, mimes = json.loads(Path(nb_path).read_text()), [], 0, set()
    for c in nb['cells']:
        for o in c.get('outputs', []):
            if o['output_type'] == 'stream': texts.append(''.join(o['text']))
            if o['output_type'] == 'error': texts.append(o['ename'] + ': ' + o['evalue'])
            d = o.get('data', {})
            mimes.update(d)
            if 'image/png' in d: pngs += 1
            if 'text/plain' in d: texts.append(''.join(d['text/plain']))
    return '\n'.join(texts), pngs, mimes

def test_train_then_eval_tiny(prepared_data, tmp_path):
    out = tmp_path/'train-tiny.ipynb'
    r = papermill('train.ipynb', out, ('preset', 'tiny'), ('max_steps', 8), ('batch_size', 4), ('data_dir', prepared_data),
                  ('runs_dir', tmp_path), ('run_name', 'pm'), ('eval_batches', 2), ('max_new_tokens', 8))
    assert r.returncode == 0, r.stderr[-3000:]
    text, pngs, mimes = outputs(out)
    assert pngs >= 1 and 'application/vnd.jupyter.widget-view+json' not in mimes     # a real image, no widget state
    assert 'step 0/8  loss' in text and 'step 7/8' in text                           # the dashboard's log lines
    assert 'finished 8/8 steps' in text and 'validation loss' in text and 'random init (ceiling)' in text
    recs = [json.loads(l) for l in (tmp_path/'pm'/'log.jsonl').read_text().splitlines()]
    assert recs[-1]['step'] == 7 and abs(recs[0]['loss'] - math.log(32768)) < 0.1
    assert (tmp_path/'pm'/'training.png').exists() and (tmp_path/'pm'/'checkpoints'/'step_0000008.pt').exists()

    out = tmp_path/'eval-tiny.ipynb'   # the whole battery with small parameters: a few HumanEval problems, n=2, a few FIM lines
    r = papermill('eval.ipynb', out, ('run_name', 'pm'), ('runs_dir', tmp_path), ('val_batches', 2), ('max_new_tokens', 8),
                  ('category_tokens', 2048), ('fim_lines', 8), ('humaneval_problems', 3), ('humaneval_samples', 2),
                  ('humaneval_max_new_tokens', 24), ('sandbox_workers', 2), ('threads', 1))
    assert r.returncode == 0, r.stderr[-3000:]
    text, pngs, _ = outputs(out)
    assert pngs >= 2 and 'validation_loss' in text and 'step_0000008.pt' in text and 'def fibonacci(n):' in text
    assert 'bits_per_byte' in text and 'harness: 3/3 canonical solutions pass, 3/3 empty bodies fail' in text
    report = (tmp_path/'pm'/'report.md').read_text()
    for section in ['## Config', '## Sizing: estimate against measured', '## Loss curves', "## The seeds' loss gates",
                    '## Held-out loss per data category', '## Fill-in-the-middle', '## HumanEval', '## Routing health', '## Samples']:
        assert section in report, section
    for row in ['| code |', '| all |', 'of 8 held-out code lines', '| pass@1 | pass@2 |', 'Harness check: 3/3']: assert row in report, row
    for png in ('report_training.png', 'report_categories.png'): assert (tmp_path/'pm'/png).read_bytes()[:4] == b'\x89PNG'
    ev = json.loads((tmp_path/'pm'/'eval.json').read_text())
    assert ev['step'] == 8 and ev['fim']['n'] == 8 and ev['humaneval']['harness']['canonical_passed'] == 3
    assert set(ev['humaneval']['pass_at']) == {'pass@1', 'pass@2'} and sum(ev['humaneval']['outcomes'].values()) == 6
    assert {c['category'] for c in ev['categories']} >= {'code', 'all'}

def test_gpu_preset_without_gpu_stops_in_the_first_cell(tmp_path):
    out = tmp_path/'h100.ipynb'
    r = papermill('train.ipynb', out, ('preset', 'h100'), ('runs_dir', tmp_path), ('data_dir', tmp_path/'data'),
                  env={'CUDA_VISIBLE_DEVICES': ''})     # no GPU visible, on a GPU machine too
    assert r.returncode != 0
    assert 'NeedsGPUError' in r.stderr and "preset 'h100' needs a CUDA GPU" in r.stderr and '-p smoke True' in r.stderr
    text, _, _ = outputs(out)
    assert 'Fix:' in text and not (tmp_path/'data').exists()    # nothing was prepared or trained

def test_misspelt_parameter_stops_before_anything_runs(tmp_path):
    "papermill only warns about a -p name the notebook lacks; the notebook itself stops, before preparing or training."
    r = papermill('train.ipynb', tmp_path/'typo.ipynb', ('max_step', 5), ('runs_dir', tmp_path), ('data_dir', tmp_path/'data'))
    assert r.returncode != 0 and 'unknown parameter(s) max_step' in r.stderr and 'max_steps' in r.stderr, r.stderr[-2000:]
    assert not (tmp_path/'data').exists() and not (tmp_path/'tiny').exists()

def test_gpu_preset_smoke_passes_on_the_cpu(prepared_data, tmp_path):
    out = tmp_path/'h100-smoke.ipynb'
    r = papermill('train.ipynb', out, ('preset', 'h100'), ('smoke', True), ('data_dir', prepared_data), ('runs_dir', tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    text, pngs, _ = outputs(out)
    assert 'finished 2/2 steps' in text and pngs >= 2          # training curves + routing health (MoE)
    recs = [json.loads(l) for l in (tmp_path/'h100-smoke'/'log.jsonl').read_text().splitlines()]
    assert [x['step'] for x in recs] == [0, 1] and all(math.isfinite(x['loss']) for x in recs)
    assert len(recs[0]['routing']['load']) == 12 and len(recs[0]['routing']['load'][0]) == 32    # the real architecture
    cfg = json.loads((tmp_path/'h100-smoke'/'config.json').read_text())
    assert cfg['smoke'] and cfg['model']['d_model'] == 512 and cfg['train']['batch_size'] == 1 and cfg['device'] == 'cpu'

def test_the_whole_pipeline_from_train_ipynb(prepared_data, tmp_path):
    "`-p stages` with every stage of the CPU seed's launch command, each two steps (-p smoke True): one run per stage, the table."
    out = tmp_path/'pipeline.ipynb'
    stages = 'stage1,stage1b,stage2,stage2b,stage3,stage3b,stage4,stage5'
    r = papermill('train.ipynb', out, ('preset', 'tiny'), ('stages', stages), ('smoke', True), ('data_dir', prepared_data),
                  ('runs_dir', tmp_path), ('run_name', 'pipe'))
    assert r.returncode == 0, r.stderr[-3000:]
    text, pngs, _ = outputs(out)
    assert pngs >= 1 and 'grpo_execution' in text and 'val_reward_margin' in text
    for s in stages.split(','): assert json.loads((tmp_path/'pipe'/s/'status.json').read_text())['state'] == 'finished', s
    assert 'stage5' in text and 'validation loss' in text

def test_compare_hybrid_and_dense(prepared_data, tmp_path):
    "Two real runs on the same data, hybrid and dense, side by side through compare.ipynb."
    from fsi_nb.train import train
    small = dict(data_dir=prepared_data, runs_dir=tmp_path, d_model=32, batch_size=2, seq_len=64, max_steps=6, warmup_steps=1,
                 log_interval=1, eval_interval=3, eval_batches=1, threads=1, progress=False)
    for name, arch in (('hyb', 'hybrid'), ('den', 'dense')): train('tiny', name, arch=arch, **small)
    out = tmp_path/'compare.ipynb'
    r = papermill('compare.ipynb', out, ('runs', 'hyb,den'), ('runs_dir', tmp_path), ('smooth', 2))
    assert r.returncode == 0, r.stderr[-3000:]
    text, pngs, _ = outputs(out)
    assert pngs == 1 and 'lowest validation loss' in text and 'dense' in text and 'hybrid' in text
    table = (tmp_path/'compare-hyb-vs-den'/'compare.csv').read_text()
    assert table.count('\n') == 3 and (tmp_path/'compare-hyb-vs-den'/'comparison.png').stat().st_size > 10_000

def test_a_micro_sweep_from_sweep_ipynb(prepared_data, tmp_path):
    "2 seeds x 2 variants, a few steps each, probes at one distance: the table with intervals and the figure, under papermill."
    out = tmp_path/'sweep.ipynb'
    r = papermill('sweep.ipynb', out, ('preset', 'tiny'), ('seeds', 2), ('variants', 'hybrid,dense'), ('name', 'micro'), ('max_steps', 4),
                  ('probe_distances', '32'), ('probe_n', 4), ('data_dir', prepared_data), ('runs_dir', tmp_path),
                  yaml='overrides: {d_model: 32, batch_size: 2, seq_len: 32, warmup_steps: 1, eval_interval: 2, eval_batches: 1, threads: 1}')
    assert r.returncode == 0, r.stderr[-3000:]
    sdir = tmp_path/'micro'
    summary = pd.read_csv(sdir/'summary.csv', index_col='variant')
    assert list(summary.index) == ['hybrid', 'dense'] and (summary.equal_tokens_n == 2).all() and summary.loc['dense', 'equal_flops_verdict']
    assert (sdir/'sweep.png').stat().st_size > 1000 and len(pd.read_csv(sdir/'probes.csv')) == 2 * 3   # 2 variants x 3 probe kinds
    assert 'paired difference' in out.read_text()
