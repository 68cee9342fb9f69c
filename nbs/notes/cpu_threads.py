"""Training next to other work, measured: tokens/s of `tiny`'s real training step (fp32, batch 4 x 128) with and
without a competing busy process, for the thread choices below; rounds interleaved, medians reported.

    python nbs/notes/cpu_threads.py [--rounds 3] [--secs 15] [--json out.json]

Each trial is a fresh process (OpenMP reads OMP_WAIT_POLICY once, when torch loads) that trains for `--secs` seconds
after two warm-up steps; the competitor is `python -c 'while True: pass'`, started just before the trial and killed
after it. Results: nbs/notes/cpu-threads.md."""
import argparse, itertools, json, os, statistics, subprocess, sys, time

CONFIGS = {'before: a thread per core': dict(threads='all'),
           'after: CPUShare (threads = 0)': dict(threads='auto'),
           'one thread': dict(threads='1'),
           'a thread per core, OMP_WAIT_POLICY=PASSIVE': dict(threads='all', env=dict(OMP_WAIT_POLICY='PASSIVE'))}

def trial(threads:str, secs:float) -> dict:
    "One trial in this process: tokens/s of the training step for `secs` seconds."
    import torch
    from fsi_nb.bench import train_step
    from fsi_nb.config import get_preset
    from fsi_nb.model import FSIEdgeModel
    from fsi_nb.runs import CPUShare
    torch.manual_seed(0)
    share = CPUShare() if threads == 'auto' else None   # as `train` does for threads = 0
    if share is None: torch.set_num_threads(len(os.sched_getaffinity(0)) if threads == 'all' else int(threads))
    bs, seq = 4, 128
    step, _ = train_step(FSIEdgeModel(get_preset('tiny').model), bs, seq, precision='fp32')
    for _ in range(2): step()
    t0, n, c0 = time.perf_counter(), 0, time.process_time()
    while time.perf_counter() - t0 < secs:
        step(); n += 1
        if share: share.check()
    dt = time.perf_counter() - t0
    return dict(tokens_per_sec=n * bs * seq / dt, steps=n, cpu_cores=(time.process_time() - c0) / dt,
                threads=torch.get_num_threads(), changes=share.changes if share else [])

def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--rounds', type=int, default=3); ap.add_argument('--secs', type=float, default=15.0)
    ap.add_argument('--json'); ap.add_argument('--trial', nargs=2, metavar=('THREADS', 'SECS'), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.trial: print(json.dumps(trial(a.trial[0], float(a.trial[1])))); return
    results = []
    for r in range(a.rounds):
        for busy, (name, c) in itertools.product((False, True), CONFIGS.items()):
            env = {k: v for k, v in os.environ.items() if k not in ('OMP_WAIT_POLICY', 'OMP_NUM_THREADS')} | c.get('env', {})
            comp = subprocess.Popen([sys.executable, '-c', 'while True: pass']) if busy else None
            try:
                load = os.getloadavg()[0]
                p = subprocess.run([sys.executable, __file__, '--trial', c['threads'], str(a.secs)], capture_output=True, text=True, env=env)
            finally:
                if comp: comp.kill(); comp.wait()
            res = json.loads(p.stdout.strip().splitlines()[-1]) | dict(config=name, busy=busy, round=r, load1=load)
            results.append(res); print(json.dumps(res), flush=True)
    if a.json: json.dump(results, open(a.json, 'w'), indent=1)
    print(f"\nmedian tokens/s of {a.rounds} rounds ({os.cpu_count()} cores; 1-minute load average "
          f"{min(x['load1'] for x in results):.1f}-{max(x['load1'] for x in results):.1f} during the trials)")
    for name in CONFIGS:
        alone, busy = ([x['tokens_per_sec'] for x in results if x['config'] == name and x['busy'] == b] for b in (False, True))
        print(f"{name:45s} alone {statistics.median(alone):7.0f}   next to a busy process {statistics.median(busy):7.0f}")

if __name__ == '__main__': main()
