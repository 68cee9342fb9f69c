"""Sustained `tiny` training, compiled against eager, interleaved (issue 30's 10,000-step target).

Each arm is one real run of the trainer (`python -m fsi_nb.train --preset tiny --max-steps N`), trained in chunks: the
arms take turns, each chunk ends with a SIGTERM once the log reaches the chunk's last step (the trainer saves and
exits), and the next chunk of that arm resumes it. So both arms see the same drift of a shared machine, and each arm's
wall time holds everything a user waits for: process start-up, the compiled arm's first compile (a cold inductor cache)
and its resumes' cached compiles, validations and checkpoints.

    python nbs/notes/sustained.py --steps 10000 --chunks 5 --data-dir DATA --out /tmp/sustained

Results: nbs/notes/compile-pays.md."""
import argparse, json, os, signal, subprocess, sys, time
from pathlib import Path

def last_step(log:Path) -> int:
    "The last step the run's log.jsonl records (-1 before the first)."
    try: lines = log.read_text().splitlines()
    except FileNotFoundError: return -1
    for line in reversed(lines):
        try: return json.loads(line)['step']
        except (ValueError, KeyError): continue   # a line being written
    return -1

def run_chunk(cmd, log:Path, until:int|None, env) -> float:
    "Run `cmd` until its log reaches step `until` (then SIGTERM: it saves and exits) or it ends; its wall seconds."
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while p.poll() is None:
        if until is not None and last_step(log) >= until: p.send_signal(signal.SIGTERM); break
        time.sleep(0.2)
    _, err = p.communicate()
    if p.returncode not in (0, 128 + signal.SIGTERM, -signal.SIGTERM): sys.exit(f'{cmd}: exit {p.returncode}\n{err[-3000:]}')
    return time.perf_counter() - t0

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--steps', type=int, default=10_000); ap.add_argument('--chunks', type=int, default=5)
    ap.add_argument('--threads', type=int, default=2); ap.add_argument('--data-dir', required=True)
    ap.add_argument('--out', default='/tmp/sustained')
    a = ap.parse_args()
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, 'TORCHINDUCTOR_CACHE_DIR': str(out/'inductor')}   # cold: the compiled arm pays its first compile
    arms = {'eager': ['--no-compile'], 'compiled': []}                      # compiled: the preset's own 'auto' at 10,000 steps
    walls = {k: [] for k in arms}
    for c in range(a.chunks):
        until = (c + 1) * a.steps // a.chunks - 1 if c < a.chunks - 1 else None
        for arm, flags in arms.items():
            cmd = [sys.executable, '-m', 'fsi_nb.train', '--preset', 'tiny', '--max-steps', str(a.steps), '--threads', str(a.threads),
                   '--data-dir', a.data_dir, '--runs-dir', str(out/'runs'), '--run-name', arm, '--log-interval', '1',
                   '--no-progress', *flags]
            walls[arm].append(run_chunk(cmd, out/'runs'/arm/'log.jsonl', until, env))
            print(f'chunk {c} {arm:8s} {walls[arm][-1]:8.1f} s  at step {last_step(out/"runs"/arm/"log.jsonl")}', flush=True)
    res = {}
    for arm in arms:
        status = json.loads((out/'runs'/arm/'status.json').read_text())
        res[arm] = dict(wall_s=sum(walls[arm]), chunks_s=walls[arm], steps=status['step'], loss=status['loss'],
                        val_loss=status['evals'][-1].get('val_loss'), timings=status['timings'],
                        compile=json.loads((out/'runs'/arm/'config.json').read_text())['train']['compile'])
    res['speedup'] = res['eager']['wall_s'] / res['compiled']['wall_s']
    (out/'sustained.json').write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))

if __name__ == '__main__': main()
