"""`python -m fsi_nb.serve` as a user runs it: a real server in a subprocess on a free loopback port, serving a tiny run
trained here, hit over HTTP with httpx: completions, chat, streams, bad requests (the server stays up), a client that
hangs up mid-stream, and 16 concurrent clients."""
import contextlib, io, json, os, socket, subprocess, sys, time

import httpx, pytest, torch

from fsi_nb.serve import Chat, load_test, format_load_test, serve_process

PROMPT = 'def add(a, b):\n'

@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
    "A tiny run: a 1,024-token vocabulary from 20 stdlib files and generated code, d_model 32, 40 steps (about 6 s)."
    from fsi_nb.data import prepare
    from fsi_nb.train import train
    work = tmp_path_factory.mktemp('serve')
    prepare(work/'data', sources=('stdlib', 'synthetic', 'coldstart'), max_files=20, num_synthetic=100, num_coldstart=30,
            vocab_size=1024, progress=False, workers=1)
    res = train('tiny', 'tiny-serve', progress=False, data_dir=work/'data', runs_dir=work/'runs', vocab_size=1024, d_model=32,
                batch_size=8, seq_len=64, max_steps=40, warmup_steps=4, lr=1e-2, log_interval=10, save_interval=40, threads=1)
    return res.run_dir

@pytest.fixture(scope='module')
def url(tiny_run):
    "The server, two workers, one torch thread each, max_tokens up to 256."
    with serve_process(tiny_run, '--workers', 2, '--max-tokens-limit', 256) as u: yield u

def post(url, path, **body): return httpx.post(url + path, json=body, timeout=60)

def stream(url, path, **body) -> tuple[list, str]:
    "The JSON events of a streamed request, and the last `data:` line."
    with httpx.stream('POST', url + path, json=dict(body, stream=True), timeout=60) as r:
        assert r.status_code == 200 and r.headers['content-type'].startswith('text/event-stream'), r.read()
        data = [l.removeprefix('data: ') for l in r.iter_lines() if l.startswith('data: ')]
    return [json.loads(d) for d in data[:-1]], data[-1]

@pytest.mark.parametrize('sampling', [dict(temperature=0), dict(temperature=0.8, seed=7)], ids=['greedy', 'seeded'])
def test_completion_streamed_equals_not_streamed(url, sampling):
    out = post(url, '/v1/completions', prompt=PROMPT, max_tokens=24, **sampling).json()
    assert out['object'] == 'text_completion' and out['id'].startswith('cmpl-') and out['model'] == 'tiny-serve'
    choice = out['choices'][0]
    assert choice['finish_reason'] == 'length' and out['usage']['completion_tokens'] == 24 and out['usage']['total_tokens'] > 24
    events, last = stream(url, '/v1/completions', prompt=PROMPT, max_tokens=24, **sampling)
    assert last == '[DONE]' and len({e['id'] for e in events}) == 1 and all(e['object'] == 'text_completion' for e in events)
    assert ''.join(e['choices'][0]['text'] for e in events) == choice['text']
    assert [e['choices'][0]['finish_reason'] for e in events][-1] == 'length'
    assert post(url, '/v1/completions', prompt=PROMPT, max_tokens=24, **sampling).json()['choices'][0]['text'] == choice['text']

def test_stop_string_cuts_the_text_and_the_stream(url):
    full = post(url, '/v1/completions', prompt=PROMPT, max_tokens=24, temperature=0.8, seed=3).json()['choices'][0]['text']
    stop = full[6:9]
    out = post(url, '/v1/completions', prompt=PROMPT, max_tokens=24, temperature=0.8, seed=3, stop=[stop]).json()['choices'][0]
    assert out == dict(out, text=full[:full.find(stop)], finish_reason='stop')
    events, _ = stream(url, '/v1/completions', prompt=PROMPT, max_tokens=24, temperature=0.8, seed=3, stop=stop)
    assert ''.join(e['choices'][0]['text'] for e in events) == out['text']

def test_chat_streamed_equals_not_streamed_and_the_in_process_chat(url, tiny_run):
    msgs = [dict(role='user', content='Write a function that adds two numbers.')]
    out = post(url, '/v1/chat/completions', messages=msgs, max_tokens=20, temperature=0.8, seed=1).json()
    assert out['object'] == 'chat.completion' and out['id'].startswith('chatcmpl-')
    reply = out['choices'][0]['message']
    assert reply['role'] == 'assistant' and out['choices'][0]['finish_reason'] in ('stop', 'length')
    events, last = stream(url, '/v1/chat/completions', messages=msgs, max_tokens=20, temperature=0.8, seed=1,
                          stream_options=dict(include_usage=True))
    assert last == '[DONE]' and all(e['object'] == 'chat.completion.chunk' for e in events)
    assert events[0]['choices'][0]['delta'] == dict(role='assistant', content='')
    assert ''.join(e['choices'][0]['delta'].get('content', '') for e in events[:-1]) == reply['content']
    assert events[-1]['choices'] == [] and events[-1]['usage'] == out['usage']
    torch.set_num_threads(1)   # as the server computes
    over_http, in_process = Chat(url, max_tokens=20, temperature=0.8, seed=1), Chat(tiny_run, max_tokens=20, temperature=0.8, seed=1)
    assert over_http.say(msgs[0]['content']) == in_process.say(msgs[0]['content']) == reply['content']
    assert over_http.say('Again.') == in_process.say('Again.')   # the second turn sends the whole conversation

def test_models_and_health(url):
    models = httpx.get(url + '/v1/models').json()
    assert models['object'] == 'list' and [m['id'] for m in models['data']] == ['tiny-serve']
    h = httpx.get(url + '/health').json()
    assert (h['status'], h['model'], h['device'], h['workers'], h['torch_threads'], h['max_seq_len']) == ('ok', 'tiny-serve', 'cpu', 2, 1, 128)

LONG = 'x = 1\n' * 400
BAD = [  # (what, request kwargs for httpx, status, words in the message)
    ('malformed JSON', dict(content=b'{"prompt": "def f(", "max_tokens": 4', headers={'content-type': 'application/json'}), 400, 'not valid JSON'),
    ('a JSON array', dict(json=['def f():']), 400, 'body is a list, not a JSON object'),
    ('no body', dict(), 400, 'has no body'),
    ('JSON sent as text/plain', dict(content=b'{"prompt": "x"}', headers={'content-type': 'text/plain'}), 400, 'not read as JSON'),
    ('unknown field', dict(json=dict(prompt=PROMPT, max_token=4)), 400, "unknown field 'max_token'"),
    ('prompt past max_seq_len', dict(json=dict(prompt=LONG)), 400, "past the model's max_seq_len of 128"),
    ('huge prompt', dict(json=dict(prompt='y' * 2_000_000)), 400, "max_seq_len of 128 tokens can hold"),
    ('absurd max_tokens', dict(json=dict(prompt=PROMPT, max_tokens=10**12)), 400, "more than this server's limit of 256"),
    ('zero max_tokens', dict(json=dict(prompt=PROMPT, max_tokens=0)), 400, "'max_tokens'"),
    ('max_tokens as a string', dict(json=dict(prompt=PROMPT, max_tokens='16')), 400, "'max_tokens': input should be a valid integer"),
    ('temperature as a word', dict(json=dict(prompt=PROMPT, temperature='hot')), 400, "'temperature'"),
    ('prompt as a list', dict(json=dict(prompt=[1, 2])), 400, "'prompt': input should be a valid string"),
    ('empty prompt', dict(json=dict(prompt='')), 400, "'prompt'"),
    ('five stop strings', dict(json=dict(prompt=PROMPT, stop=['a', 'b', 'c', 'd', 'e'])), 400, 'at most 4'),
    ('n = 2', dict(json=dict(prompt=PROMPT, n=2)), 400, "'n'"),
    ('an unknown stream option', dict(json=dict(prompt=PROMPT, stream=True, stream_options=dict(usage=True))), 400, "'stream_options' takes include_usage"),
    ('a stream asking too much', dict(json=dict(prompt=PROMPT, stream=True, max_tokens=257)), 400, "limit of 256"),
    ('another model', dict(json=dict(prompt=PROMPT, model='gpt-4o')), 404, "use model 'tiny-serve'"),
    ('empty messages', dict(json=dict(messages=[]), path='/v1/chat/completions'), 400, "'messages' is empty"),
    ('a message without a role', dict(json=dict(messages=[dict(content='hi')]), path='/v1/chat/completions'), 400, "'messages[0].role' is required"),
    ('a role that does not exist', dict(json=dict(messages=[dict(role='tool', content='hi')]), path='/v1/chat/completions'), 400, "'messages[0].role'"),
    ('max_completion_tokens too large', dict(json=dict(messages=[dict(role='user', content='hi')], max_completion_tokens=300),
                                        path='/v1/chat/completions'), 400, 'max_completion_tokens=300'),
    ('messages past max_seq_len', dict(json=dict(messages=[dict(role='user', content=LONG)]), path='/v1/chat/completions'), 400, 'latest messages'),
    ('a prompt sent to chat', dict(json=dict(prompt=PROMPT), path='/v1/chat/completions'), 400, "unknown field 'prompt'"),
    ('a route that does not exist', dict(json=dict(prompt=PROMPT), path='/v1/engines'), 404, 'POST /v1/completions'),
    ('GET on a POST route', dict(method='GET'), 405, 'no GET /v1/completions'),
]

@pytest.mark.parametrize('what,req,status,words', BAD, ids=[b[0] for b in BAD])
def test_a_bad_request_is_refused_and_the_server_stays_up(url, what, req, status, words):
    req = dict(req)
    r = httpx.request(req.pop('method', 'POST'), url + req.pop('path', '/v1/completions'), timeout=60, **req)
    err = r.json()['error']
    assert r.status_code == status and words in err['message'] and 'Fix:' in err['message'], (r.status_code, err)
    assert err['type'] == 'invalid_request_error'
    ok = post(url, '/v1/completions', prompt=PROMPT, max_tokens=2, temperature=0)   # greedy: a sampled first token can be the end
    assert ok.status_code == 200 and ok.json()['usage']['completion_tokens'] == 2, ok.json()

def _idle(url, timeout=30):
    "/health once no generation is in progress."
    t0 = time.monotonic()
    while (h := httpx.get(url + '/health').json())['active'] and time.monotonic() - t0 < timeout: time.sleep(0.05)
    return h

def test_a_client_that_hangs_up_stops_its_generation(url):
    "Streamed or not, a request whose client leaves stops early and frees its slot."
    body = dict(prompt=PROMPT, max_tokens=256, temperature=0.8, seed=0)
    full = post(url, '/v1/completions', **body).json()['usage']['completion_tokens']   # what the request costs when its client stays
    assert full > 64, full
    for stream in (True, False):
        before = _idle(url)['tokens']
        try:
            with httpx.stream('POST', url + '/v1/completions', json=dict(body, stream=stream), timeout=0.2) as r:
                for _ in r.iter_lines(): break
        except httpx.TimeoutException: pass   # the non-streamed one: the client gives up before the reply
        h = _idle(url)
        assert h['active'] == 0 and h['tokens'] - before < full, (stream, h['tokens'] - before, full)
    assert post(url, '/v1/completions', prompt=PROMPT, max_tokens=2).status_code == 200

def test_load_16_clients_x_20_requests(url):
    "16 concurrent clients x 20 requests each, max_tokens 4: no errors, and /health answers throughout (figures printed, not judged)."
    res = load_test(url, clients=16, requests=20, max_tokens=4)
    print(format_load_test(res))
    assert res['errors'] == 0, res['error_examples']
    assert res['requests'] == 320 and 320 <= res['completion_tokens'] <= 1280 and res['health_probes'] > 0
    assert res['p50_s'] <= res['p95_s'] <= res['max_s']

def test_command_line_errors_name_the_fix(tiny_run, tmp_path, capsys):
    "Each mistake ends with exit code 2 and a message with the fix, before anything is served (`main` in-process: the server's own subprocess is above)."
    from fsi_nb.serve import main
    from fsi_nb.export import export_gguf
    with contextlib.redirect_stderr(io.StringIO()): gguf = export_gguf(tiny_run, tmp_path/'gguf')   # the kit's own export is not a run
    with socket.create_server(('127.0.0.1', 0)) as busy:
        for argv, words in [([tmp_path/'nothing', '--port', 0], 'does not exist. Fix:'),
                            ([tiny_run, '--workers', '-1'], '--workers -1: must be at least 0'),
                            ([tiny_run, '--port', '70000'], 'is not a TCP port. Fix:'),
                            ([tiny_run, '--port', busy.getsockname()[1]], 'cannot listen on 127.0.0.1'),
                            ([tiny_run, '--port', 0, '--device', 'tpu'], "--device 'tpu' is not one"),
                            ([gguf, '--port', 0], 'is a GGUF export'), ([tiny_run, '--port', 0, '--checkpoint', 'step 7'], 'no checkpoint of step 7')]:
            with pytest.raises(SystemExit) as e: main([str(a) for a in argv])
            err = capsys.readouterr().err
            assert e.value.code == 2 and words in err and 'Fix:' in err, err
