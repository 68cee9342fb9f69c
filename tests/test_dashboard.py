"""fsi_nb.dashboard: the routing alarm's lines, from a real tiny MoE that starves one expert, printed once each in log-line mode
(what a papermill notebook keeps) and shown under the live status line; `python -m fsi_nb.dashboard lab <typo>` is exit 2 naming the
run notebooks."""
import contextlib, io, json, os, subprocess, sys

from fsi_nb.dashboard import Dashboard, watch
from test_health import starved_records


def run_folder(tmp_path, routing_records):
    "A finished run folder whose log holds `routing_records` (real routing; the other fields filler a log line needs)."
    run = tmp_path/'starved'; run.mkdir()
    with open(run/'log.jsonl', 'w') as f:
        for r in routing_records:
            f.write(json.dumps(dict(r, loss=5.0, avg_loss=5.0, lr=1e-3, grad_norm=1.0, tokens_per_sec=100.0, elapsed_hours=0.01,
                                    total_steps=len(routing_records), time=1.7e9 + r['step'])) + '\n')
    (run/'config.json').write_text(json.dumps(dict(total_steps=len(routing_records), model=dict(vocab_size=256, n_routed=4))))
    (run/'status.json').write_text(json.dumps(dict(state='finished')))
    return run


def test_watch_prints_the_dead_expert_alarm_once(tmp_path):
    run = run_folder(tmp_path, starved_records(9))
    with contextlib.redirect_stdout(io.StringIO()) as out:
        dash = watch(run, interval=0.05, timeout=60, live=False, show=False)
    alarms = [l for l in out.getvalue().splitlines() if l.startswith('ALARM')]
    assert [a.split(';')[0] for a in alarms] == ['ALARM step 4: layer 1 expert 3 dead for 5 checks (load 0)'], out.getvalue()
    assert dash.alarms == alarms and (run/'routing.png').exists()


def test_the_live_status_line_shows_the_alarm(tmp_path):
    run = run_folder(tmp_path, starved_records(6))
    dash = Dashboard(run, live=True, redraw_s=0)
    for rec in (json.loads(l) for l in (run/'log.jsonl').read_text().splitlines()): dash(rec)
    assert 'ALARM step 4: layer 1 expert 3 dead' in dash._w['head'].value and dash._w['routing'].value[:4] == b'\x89PNG'


def test_lab_with_a_typo_is_exit_2_naming_the_run_notebooks(tmp_path):
    r = subprocess.run([sys.executable, '-m', 'fsi_nb.dashboard', 'lab', 'trian', '--dest', str(tmp_path/'lab')],
                       capture_output=True, text=True, timeout=120, env=os.environ | {'OMP_NUM_THREADS': '1'})
    assert r.returncode == 2 and r.stdout == '', r.stdout + r.stderr
    line, = r.stderr.splitlines()                                             # one line, no traceback
    assert line.startswith('error: no run notebook called trian. Fix: use one of ') and 'sizing' in line and 'train' in line, line
    assert not (tmp_path/'lab').exists() or not list((tmp_path/'lab').iterdir())
