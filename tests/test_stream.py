"""The streaming prepare (fsi_nb.data.prepare over fsi_nb.stream, filters, shards) on real corpora: the same shards and manifest,
byte for byte, as its pieces run by hand on the built-in sources, with other workers and memory bound; your own corpora as JSONL,
Parquet, a folder of real files and a saved Hugging Face dataset, with their bad records rejected at read; results independent of
workers and of the memory bound; the tokenizer's sample; and the errors that stop a wrong source before any work."""
import json, os, shutil, subprocess, sys, sysconfig
from pathlib import Path

import numpy as np
import pytest

from fsi_nb.data import prepare
from fsi_nb.filters import stream_filter
from fsi_nb.sandbox import run_code
from fsi_nb.shards import SplitTracker, manifest_sha256, stream_shards, verify_manifest
from fsi_nb.sources import iter_sources
from fsi_nb.stream import Spool, ordered_map
from fsi_nb.tokenizer import load_tokenizer, train_tokenizer

STDLIB = Path(sysconfig.get_paths()['stdlib'])


def test_prepare_writes_what_its_pieces_write(tmp_path):
    "The built-in sources (real stdlib files, generated code, cold-start tasks) through prepare (2 workers, a 1 MB buffer) and through its pieces by hand (1 worker): same rejections, same manifest bytes."
    kw = dict(sources=('stdlib', 'synthetic', 'coldstart'), max_files=40, num_synthetic=300, num_coldstart=100, seed=1337)
    run_code('pass')          # this process keeps a free sandbox uid when prepare's workers fork: they must not share it (a CI failure)
    rep = prepare(tmp_path / 'stream', vocab_size=2000, workers=2, max_buffer_mb=1, shard_tokens=20_000, progress=False, **kw)
    # the same passes by hand: filter into a spool, split, tokenizer on the training documents, shards
    ref = tmp_path / 'pieces'
    spool, split = Spool(ref / 'spool'), SplitTracker(0.02)
    cands = iter_sources(kw['sources'], kw['max_files'], False, kw['num_synthetic'], kw['num_coldstart'], kw['seed'])
    counts = stream_filter(cands, lambda d: (spool.add(d), split.add(d)), workers=1, progress=False)
    spool.close()
    train_tokenizer((d.text for d in spool.docs(lambda m: split(m['id']) == 'train')), ref / 'tokenizer', 2000)
    params = json.loads((tmp_path / 'stream' / 'manifest.json').read_text())['prepare']
    stream_shards(spool, split, ref / 'tokenizer', ref, 20_000, workers=1, progress=False, meta=params)
    assert [(r['id'], r['stage'], r['reason']) for r in rep['rejected']] == [(r['id'], r['stage'], r['reason']) for r in counts.rejected]   # why, if they differ
    assert (ref / 'manifest.json').read_bytes() == (tmp_path / 'stream' / 'manifest.json').read_bytes()
    m = verify_manifest(tmp_path / 'stream')
    assert len(m['shards']) > 6 and {s['category'] for s in m['shards']} == {'code', 'reasoning'}       # several shards per stream: the cut matters
    assert rep['n_docs']['train'] + rep['n_docs']['val'] == spool.n == counts.kept
    assert set(params) == {'sources', 'max_files', 'vocab_size', 'seed', 'extra_code', 'num_synthetic', 'num_coldstart', 'val_fraction',
                           'max_file_bytes', 'near_dup_threshold', 'shard_tokens'}                       # defaults of the new knobs are not recorded
    assert not (tmp_path / 'stream' / '.prepare-spool').exists()


@pytest.fixture(scope='module')
def own_corpus(tmp_path_factory):
    "A corpus of your own in four forms: JSONL (text in `content`, with bad lines), Parquet (several row groups), a folder of real files, a saved dataset."
    import pyarrow as pa, pyarrow.parquet as pq
    d = tmp_path_factory.mktemp('own')
    real = sorted(STDLIB.glob('*.py'))[:60]
    texts = [p.read_text(encoding='utf-8') for p in real]
    with open(d / 'code.jsonl', 'w') as f:
        for p, t in zip(real[:30], texts[:30]): f.write(json.dumps(dict(content=t, path=p.name)) + '\n')
        f.write('{"content": "unfinished\n'); f.write(json.dumps(dict(content=None)) + '\n'); f.write(json.dumps(dict(content=7)) + '\n')
    pq.write_table(pa.table(dict(content=texts[30:] + [None], lang=['python'] * 30 + ['python'])), d / 'code.parquet', row_group_size=7)
    (d / 'files').mkdir()
    for p in sorted((STDLIB / 'json').glob('*.py')): shutil.copy(p, d / 'files' / p.name)
    (d / 'files' / 'binary.py').write_bytes(b'\x7fELF\0\0\1' * 50)
    from datasets import Dataset
    Dataset.from_dict(dict(content=[t.replace('def ', 'def  ') for t in texts[:20]], lang=['python'] * 20)).save_to_disk(str(d / 'hf'))
    return d


def test_own_corpora_stream_into_shards(own_corpus, tmp_path):
    d = own_corpus
    sources = (str(d / 'code.jsonl'), str(d / 'code.parquet'), str(d / 'files'), str(d / 'hf'))
    rep = prepare(tmp_path / 'data', sources=sources, text_field='content', vocab_size=1200, workers=2, max_buffer_mb=1, progress=False)
    st = rep['sources']
    assert [st[s]['candidates'] for s in sources] == [33, 31, len(list((d / 'files').iterdir())), 20]
    why = {r['id']: (r['stage'], r['reason']) for r in rep['rejected']}
    assert why[f'{sources[0]}:31'][0] == 'read' and why[f'{sources[0]}:31'][1].startswith('line 31 is not JSON')
    assert why[f'{sources[0]}:32'] == ('read', "field 'content' is null, not a string")
    assert why[f'{sources[0]}:33'] == ('read', "field 'content' is a int, not a string")
    assert why[f'{sources[1]}:30'] == ('read', "field 'content' is null, not a string")
    assert why[f'{sources[2]}:binary.py'] == ('read', 'binary (contains NUL bytes)')
    assert all(why[f'{sources[3]}:{i}'][0] == 'dedup' for i in range(20))       # the JSONL's files again, one space changed: near duplicates
    assert st[sources[0]]['kept'] > 25 and st[sources[1]]['kept'] > 25 and st[sources[2]]['kept'] >= 3
    m = verify_manifest(tmp_path / 'data')
    assert m['prepare']['text_field'] == 'content' and set(m['tokens']) == {'code', 'nlp', 'reasoning'}
    assert m['tokens']['nlp'] == {'train': 0, 'val': 0}                           # every record said python, or had a .py path
    tok = load_tokenizer(tmp_path / 'data')
    ids = np.concatenate([np.fromfile(tmp_path / 'data' / s['file'], dtype=np.uint16) for s in m['shards'] if s['split'] == 'train'])
    text = tok.decode(ids.tolist(), skip_special_tokens=False)
    first = json.loads((d / 'code.jsonl').read_text().splitlines()[0])['content']
    assert first in text or first in tok.decode(np.concatenate([np.fromfile(tmp_path / 'data' / s['file'], dtype=np.uint16) for s in m['shards']]).tolist())


def test_workers_and_memory_bound_do_not_change_the_corpus(own_corpus, tmp_path):
    srcs = (str(own_corpus / 'code.parquet'), str(own_corpus / 'code.jsonl'))
    a = prepare(tmp_path / 'a', sources=srcs, text_field='content', vocab_size=1000, workers=1, progress=False)
    b = prepare(tmp_path / 'b', sources=srcs, text_field='content', vocab_size=1000, workers=2, max_buffer_mb=1, progress=False)
    assert a['manifest_sha256'] == b['manifest_sha256'] == manifest_sha256(tmp_path / 'b')


def test_the_tokenizer_learns_from_a_bounded_sample(own_corpus, tmp_path):
    rep = prepare(tmp_path / 's', sources=(str(own_corpus / 'code.jsonl'),), text_field='content', vocab_size=800, workers=1,
                  tokenizer_sample_mb=0.25, progress=False)
    s, largest = rep['tokenizer']['sample'], max(len(p.read_bytes()) for p in sorted(STDLIB.glob('*.py'))[:30])   # the JSONL's files
    assert s['fraction'] < 1 and s['docs'] < s['train_docs'] and 0.25 * 2**20 <= s['bytes'] < 0.25 * 2**20 + largest   # within one document
    assert verify_manifest(tmp_path / 's')['prepare']['tokenizer_sample_mb'] == 0.25            # a changed knob is recorded


def test_a_wrong_source_stops_before_any_work(own_corpus, tmp_path):
    with pytest.raises(ValueError, match=r"code\.parquet has no column 'text' \(columns: content, lang\)\. Fix: pass text_field="):
        prepare(tmp_path / 'x', sources=('synthetic', str(own_corpus / 'code.parquet')), progress=False)
    with pytest.raises(ValueError, match=r"the first record has no 'body' field \(fields: content, path\)"):
        prepare(tmp_path / 'x', sources=(str(own_corpus / 'code.jsonl'),), text_field='body', progress=False)
    with pytest.raises(FileNotFoundError, match='matches no file'):
        prepare(tmp_path / 'x', sources=(str(own_corpus / '*.nothing'),), progress=False)
    assert not (tmp_path / 'x').exists()                                          # nothing was started
    bad = tmp_path / 'tasks.jsonl'
    bad.write_text(json.dumps(dict(prompt='p', thought='t', tests=[], text='x')) + '\n{"prompt": "unfinished\n')
    with pytest.raises(ValueError, match=r'tasks\.jsonl:2: malformed cold-start record'):
        prepare(tmp_path / 'y', sources=('synthetic', str(bad)), num_synthetic=20, progress=False)  # found while streaming
    assert not (tmp_path / 'y').exists()                                          # and no empty folder, no spool left behind
    code = f"import sys; sys.modules['datasets'] = None\nfrom fsi_nb.sources import collect_sources\ncollect_sources([{str(own_corpus / 'hf')!r}], text_field='content')"
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True)
    assert r.returncode == 1 and 'needs the `datasets` package, which is not installed. Fix: pip install datasets' in r.stderr


def test_ordered_map_reads_its_input_lazily():
    "What bounds memory: at most `inflight` items are taken from the stream before their results are consumed."
    taken = []
    def items():
        for i in range(40): taken.append(i); yield i
    for x, y in ordered_map(abs, items(), workers=2, inflight=3):
        assert y == x and len(taken) <= x + 4                                      # the item being returned, plus 3 in flight
