"""fsi_nb.tokenizer on the real prepared corpus: exact round trip on every corpus file, special tokens, the SHA-256 pin,
transformers compatibility, and the structure tables checked against the text itself."""
import json, shutil

import pytest
import torch

from fsi_nb.sources import fetch_shakespeare, read_text_file, stdlib_files
from fsi_nb.tasks import synthetic_code
from fsi_nb.shards import verify_manifest
from fsi_nb.tokenizer import SPECIAL_TOKENS, load_tokenizer, structure_tables, token_text, tokenizer_sha256, train_tokenizer


@pytest.fixture(scope='module')
def tok(prepared_data):
    return load_tokenizer(prepared_data / 'tokenizer')


def _corpus_texts(prepared_data):
    "Every readable file the fixture's sources offered (rejected ones too: any UTF-8 text must round-trip)."
    texts = [t for t in (read_text_file(f)[0] for f in stdlib_files(150)) if t]
    if 'shakespeare' in verify_manifest(prepared_data)['prepare']['sources']:
        texts += [f.read_text() for f in sorted(fetch_shakespeare().glob('*.txt'))]
    return texts + [d.text for d in synthetic_code(200, seed=11)]


def test_round_trip_every_corpus_file(prepared_data, tok):
    texts = _corpus_texts(prepared_data)
    assert len(texts) > 300
    enc = tok.encode_batch_fast(texts, add_special_tokens=False)
    dec = tok.decode_batch([e.ids for e in enc], skip_special_tokens=False)
    bad = [i for i, (a, b) in enumerate(zip(texts, dec)) if a != b]
    assert not bad, f'{len(bad)} texts do not round-trip, e.g. #{bad[0]}'


def test_round_trip_odd_bytes(tok):
    for text in ['', '\x00\x01\x7f', 'naïve café ✓ 😀 \u200b', '\r\n\t \t\n', '<|endoftext|>x<|pad|>', 'a' * 10_000]:
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


def test_special_tokens_are_single_ids(tok):
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    ids = tok.encode('<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>    pass<|endoftext|>').ids
    assert ids[0] == 2 and 4 in ids and 3 in ids and ids[-1] == 0


def test_vocab_and_compression(prepared_data, tok):
    V = tok.get_vocab_size()
    assert V == verify_manifest(prepared_data)['vocab_size'] and 5_000 < V <= 32_768
    code = stdlib_files()[100].read_text()
    assert len(tok.encode(code).ids) / len(code.encode()) < 0.45     # BPE compresses code well below one token per byte


def test_hash_pins_the_file(prepared_data, tmp_path):
    d = tmp_path / 'tok'
    shutil.copytree(prepared_data / 'tokenizer', d)
    assert tokenizer_sha256(d) == (d / 'tokenizer.sha256').read_text().split()[0]
    j = json.loads((d / 'tokenizer.json').read_text())
    j['added_tokens'][0]['content'] = '<|eot|>'
    (d / 'tokenizer.json').write_text(json.dumps(j))
    with pytest.raises(ValueError, match=r'tokenizer.sha256 says .*Fix: restore'):
        load_tokenizer(d)
    (d / 'tokenizer.sha256').unlink()
    with pytest.raises(FileNotFoundError, match='cannot be verified'):
        load_tokenizer(d)
    with pytest.raises(FileNotFoundError, match='no tokenizer.json'):
        load_tokenizer(tmp_path / 'missing')


def test_training_is_deterministic(tmp_path):
    texts = [d.text for d in synthetic_code(300, seed=3)]
    a = train_tokenizer(texts, tmp_path / 'a', vocab_size=3000)
    b = train_tokenizer(texts, tmp_path / 'b', vocab_size=3000)
    assert tokenizer_sha256(a) == tokenizer_sha256(b)


def test_transformers_loads_it_offline(prepared_data, tok):
    transformers = pytest.importorskip('transformers')
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(prepared_data / 'tokenizer'), local_files_only=True)
    text = 'def f(x):\n    return x  # ok\n'
    assert hf(text)['input_ids'] == tok.encode(text).ids
    assert hf.decode(hf(text)['input_ids']) == text
    assert (hf.eos_token, hf.pad_token, hf.pad_token_id) == ('<|endoftext|>', '<|pad|>', 1)


def test_structure_tables_match_the_text(tok):
    t = structure_tables(tok)
    V = tok.get_vocab_size()
    assert all(v.shape == (V,) for v in t.values()) and t['newline'].dtype == torch.bool
    for f in stdlib_files(12):
        text = f.read_text()
        ids = torch.tensor(tok.encode(text, add_special_tokens=False).ids, dtype=torch.long)
        opens, closes = sum(text.count(c) for c in '([{'), sum(text.count(c) for c in ')]}')
        assert t['depth_delta'][ids].sum().item() == opens - closes          # exactly the text's bracket balance
        assert t['newline'][ids].sum().item() <= text.count('\n')
        # the indentation read off each newline token equals the indentation of the line it starts (when BPE kept it whole)
        enc = tok.encode(text, add_special_tokens=False)
        for k in torch.nonzero(t['newline'][ids]).flatten().tolist()[:200]:
            s = token_text(tok, ids[k].item())
            line = text[text.rfind('\n', 0, enc.offsets[k][1]) + 1:]
            width = len(line) - len(line.lstrip(' \t'))
            if len(s) - len(s.rstrip(' \t')) == width:                        # the whole indent is inside this token
                assert t['indent'][ids[k]].item() == (width + 3 * line[:width].count('\t')) // 4
    assert not t['newline'][:len(SPECIAL_TOKENS)].any() and not t['indent'][:len(SPECIAL_TOKENS)].any()
