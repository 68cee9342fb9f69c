"""The evaluation battery against answers known in advance: pass@k by hand, the HumanEval harness on canonical and
broken solutions (every program through `fsi_nb.sandbox`), bits per byte recomputed by hand on a hand-made corpus,
and fill-in-the-middle on a model taught one answer."""
import math

import numpy as np, pytest, torch

from fsi_nb.config import FSIEdgeConfig
from fsi_nb.evaluate import category_metrics, fim_exact_match, fim_examples, token_byte_lengths
from fsi_nb.humaneval import check_harness, load_problems, outcome, pass_at_k, pass_at_ks, run_samples, truncate_at_stops
from fsi_nb.model import FSIEdgeModel
from fsi_nb.shards import stream_shards
from fsi_nb.stream import Spool
from fsi_nb.tasks import Doc
from fsi_nb.tokenizer import SPECIAL_TOKENS, load_tokenizer, structure_tables, train_tokenizer


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads(); torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

# ---------------------------------------------------------------- pass@k

@pytest.mark.parametrize('n, c, k, want', [
    (1, 1, 1, 1.0), (1, 0, 1, 0.0), (2, 1, 1, 0.5), (4, 1, 2, 0.5),        # C(3,2)/C(4,2) = 3/6 of the pairs miss it
    (5, 2, 2, 0.7), (10, 3, 1, 0.3), (10, 8, 3, 1.0), (3, 0, 3, 0.0),
    (200, 1, 100, 0.5), (200, 1, 1, 0.005), (20, 2, 10, 29 / 38)])                  # 1 - C(18,10)/C(20,10) = 1 - 90/380
def test_pass_at_k_by_hand(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(want, abs=1e-12)

def test_pass_at_k_equals_exact_integer_arithmetic():
    "The stable product equals 1 - C(n-c, k)/C(n, k) in exact integers, where the floats of C(200, 100) ~ 9e58 would lose it."
    from fractions import Fraction
    for n in (1, 2, 7, 20, 200):
        for c in sorted({0, 1, n // 3, n // 2, n - 1, n}):
            for k in sorted({1, 2, 10, 100, n} & set(range(1, n + 1))):
                exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
                assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12), (n, c, k)

def test_pass_at_ks_means_over_problems_and_refuses_k_above_n():
    assert pass_at_ks([(4, 0), (4, 4), (4, 1)], ks=(1, 2, 10)) == pytest.approx({'pass@1': (0 + 1 + 0.25) / 3, 'pass@2': (0 + 1 + 0.5) / 3})
    with pytest.raises(ValueError, match='Fix:'): pass_at_k(3, 1, 5)
    with pytest.raises(ValueError, match='Fix:'): pass_at_ks([])

# ---------------------------------------------------------------- the harness

def test_every_canonical_solution_passes_in_the_sandbox():
    "All 164: a harness that failed known-good code would report 0% for the wrong reason."
    problems = load_problems()
    h = check_harness(problems[:20], workers=2)
    assert h['ok'] and (h['canonical_passed'], h['bad_failed']) == (20, 20), h
    res = run_samples(problems[20:], [[p['canonical_solution']] for p in problems[20:]], workers=2, timeout=10.0)
    broken = [(p['task_id'], outcome(r[0]), r[0].error) for p, r in zip(problems[20:], res) if not r[0].passed]
    assert len(problems) == 164 and not broken, broken

def test_broken_completions_fail_each_in_its_own_way():
    p = load_problems(['HumanEval/2'])[0]        # truncate_number(number) -> the decimal part
    cases = {'    return number\n': 'failed',                        # wrong answer
             '    return number % 1.0 +\n': 'error (program)',          # does not parse
             '    while True:\n        pass\n': 'timeout',             # never returns
             '    raise ValueError(number)\n': 'failed',               # raises inside the test
             '    import sys\n    sys.exit(0)\n': 'failed'}            # exits "successfully" from inside check()
    res = run_samples([p] * len(cases), [[c] for c in cases], workers=2, timeout=2.0)
    assert [outcome(r[0]) for r in res] == list(cases.values()), [(r[0].status, r[0].error) for r in res]

def test_stop_sequences_cut_what_follows_the_body():
    "A completion that goes on after a correct body (a new top-level def, a print, a test at column 0) passes once cut."
    p = load_problems(['HumanEval/2'])[0]
    tails = ['\n\ndef main():\n    return 1/0\n', '\nprint(1/0)\n', '\nif True:\n    raise SystemExit(1)\n', '\n# more\nx = 1/0\n']
    comps = [truncate_at_stops(p['canonical_solution'] + t) for t in tails]
    assert all(c.rstrip() == p['canonical_solution'].rstrip() for c in comps), comps
    assert all(r[0].passed for r in run_samples([p] * len(comps), [[c] for c in comps], workers=2))
    uncut = run_samples([p], [[p['canonical_solution'] + tails[1]]], workers=2)[0][0]
    assert outcome(uncut) == 'error (program)' and 'ZeroDivisionError' in uncut.error      # without the cut it would not

# ---------------------------------------------------------------- a hand-made corpus

TEXTS = {'code': ['def area(w, h):\n    return w * h\n', 'def greet(name):\n    return "héllo " + name\n'],
         'nlp': ['The café was closed, so we walked on — naïvely hoping.\n', 'Tokyo is 東京 in Japanese.\n'],
         'reasoning': ['Q: 2 + 3 = ?\nThought: two plus three.\nA: 5\n']}

@pytest.fixture(scope='module')
def hand_corpus(tmp_path_factory):
    "A data folder whose every document is in val, with a tokenizer trained on the same texts."
    out = tmp_path_factory.mktemp('hand')/'data'
    docs = [Doc(id=f'{cat}:{i}', source='hand', lang={'code': 'python', 'nlp': 'english', 'reasoning': 'reasoning'}[cat], text=t)
            for cat, ts in TEXTS.items() for i, t in enumerate(ts)]
    train_tokenizer([d.text for d in docs] * 20 + ['def f(x):\n    return x\n'] * 20, out/'tokenizer', vocab_size=400)
    spool = Spool(tmp_path_factory.mktemp('hand-spool'))
    for d in docs: spool.add(d)
    spool.close()
    stream_shards(spool, lambda doc_id: 'val', out/'tokenizer', out, workers=1, progress=False)
    return out

def tiny_model(vocab:int, seed:int=0) -> FSIEdgeModel:
    torch.manual_seed(seed)
    cfg = FSIEdgeConfig(vocab_size=vocab, d_model=32, n_layers=2, n_heads=4, kv_heads=2, d_ff=64, max_seq_len=64, window_size=16)
    return FSIEdgeModel(cfg)

def test_bits_per_byte_by_hand(hand_corpus):
    tok = load_tokenizer(hand_corpus/'tokenizer')
    model = tiny_model(tok.get_vocab_size())
    model.set_structure_tables(**structure_tables(tok))
    with torch.no_grad():
        for p in model.parameters(): p.add_(0.3 * torch.randn_like(p))     # far from uniform, so nats differ token by token
    eot = tok.token_to_id('<|endoftext|>')
    for seq_len in (200, 7):                         # one window per category, and many overlapping windows
        got = category_metrics(model, hand_corpus, tok, seq_len=seq_len, batch_size=3, max_tokens=None)
        assert list(got.index) == ['code', 'nlp', 'reasoning', 'all']
        for cat, texts in TEXTS.items():
            ids = [t for x in texts for t in tok.encode(x).ids + [eot]]            # the val stream: each document, then <|endoftext|>
            nats = 0.0
            with torch.no_grad():
                for s in range(0, len(ids) - 1, seq_len - 1):                         # each token after the first, once
                    w = torch.tensor(ids[s:s + seq_len])
                    logp = torch.log_softmax(model(w[None]).logits[0, :-1].double(), -1)
                    nats -= float(logp[torch.arange(len(w) - 1), w[1:]].sum())
            nbytes = sum(len(x.encode('utf-8')) for x in texts) - len(tok.decode(ids[:1]).encode('utf-8'))   # the first token is context only
            row = got.loc[cat]
            assert (row.tokens, row.bytes, row.documents) == (len(ids) - 1, nbytes, len(texts))
            assert row.nats == pytest.approx(nats, rel=1e-5)
            assert row.bits_per_byte == pytest.approx(nats / math.log(2) / nbytes, rel=1e-5)
            assert row.loss == pytest.approx(nats / (len(ids) - 1), rel=1e-5)
        assert got.loc['all', 'bits_per_byte'] == pytest.approx(got.nats[:3].sum() / math.log(2) / got.bytes[:3].sum(), rel=1e-9)
    lengths = token_byte_lengths(tok)
    assert all(lengths[tok.token_to_id(t)] == 0 for t in SPECIAL_TOKENS)

def test_fim_exact_match_on_a_taught_answer(hand_corpus):
    "A model taught one infilled line (written as training writes FIM) fills it in; one taught another line writes that one."
    tok = load_tokenizer(hand_corpus/'tokenizer')
    exs = fim_examples(hand_corpus, tok, n=10, seq_len=64, max_middle_tokens=16)
    assert [tok.decode(e['middle']) for e in exs] == ['return w * h', 'return "héllo " + name']   # the only lines with a newline on each side
    ex = exs[0]
    assert tok.decode(ex['prefix']) == 'def area(w, h):\n    ' and tok.decode(ex['suffix']) == '\n'
    eot = tok.token_to_id('<|endoftext|>')

    def taught(middle):
        model = tiny_model(tok.get_vocab_size())
        model.set_structure_tables(**structure_tables(tok))
        seq = torch.tensor([ex['prompt'] + tok.encode(middle).ids + [eot]])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(80):
            loss = model(input_ids=seq, labels=seq).loss; opt.zero_grad(); loss.backward(); opt.step()
        return model

    right = fim_exact_match(taught('return w * h'), tok, [ex])
    assert (right['exact_match'], right['examples'].prediction[0]) == (1.0, 'return w * h')
    wrong = fim_exact_match(taught('return w + h'), tok, [ex])
    assert (wrong['exact_match'], wrong['examples'].prediction[0]) == (0.0, 'return w + h')
    both = fim_exact_match(taught('return w * h'), tok, exs, batch_size=2)
    assert both['n'] == 2 and both['examples'].exact.tolist()[0]
