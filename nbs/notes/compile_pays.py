"""When does `torch.compile` pay back on a CPU preset? The real trainer (`python -m fsi_nb.train`), eager and compiled,
on the preset's own shapes and data: compile time with an empty inductor cache (a first run) and with a warm one (a
resume, or the next run of the same shapes), the steady step time of each mode, and the steps after which compiling
has paid for itself.

    python nbs/notes/compile_pays.py --preset tiny [--steps 300] [--data-dir runs/data] [--json out.json]

Each run is a fresh process with its own run folder. A run's log gives the wall time at every step; the steady step
time is the median over the last half of the steps, and a run's overhead is its wall time at its last step minus
the steps times its steady step time; a compiled run's compile time is its overhead minus the eager runs' (the
validations and first steps that both modes pay). The break-even is
compile time / (eager step - compiled step). Results: nbs/notes/compile-pays.md; the rule, `CPU_COMPILE` in
00_config."""
import argparse, json, os, statistics, subprocess, sys, tempfile
from pathlib import Path

def run(preset:str, steps:int, data_dir:str, runs:Path, name:str, compile:bool, cache:str, extra=()) -> list[dict]:
    "Train `preset` for `steps` steps in a fresh process; its log records."
    cmd = [sys.executable, '-m', 'fsi_nb.train', '--preset', preset, '--run-name', name, '--max-steps', str(steps),
           '--data-dir', data_dir, '--runs-dir', str(runs), '--log-interval', '1', '--no-progress', '--no-resume',
           '--threads', '0', '--set', f'eval_interval={10 * steps}', '--save-interval', str(10 * steps),
           '--compile' if compile else '--no-compile', *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | dict(TORCHINDUCTOR_CACHE_DIR=cache))
    if r.returncode: sys.exit(f'{name} failed:\n{r.stderr[-3000:]}')
    return [json.loads(l) for l in (runs/name/'log.jsonl').read_text().splitlines() if '"loss"' in l]

def steady(recs) -> float:
    "Median seconds per step over the last half of the run."
    t = [r['elapsed_hours'] * 3600 for r in recs]
    half = len(t) // 2
    return statistics.median(b - a for a, b in zip(t[half:], t[half + 1:]))

def overhead(recs, step_s) -> float:
    "What the run's steps cost beyond steady steps: compilation (and the first steps' warm-up)."
    return recs[-1]['elapsed_hours'] * 3600 - len(recs) * step_s

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--preset', default='tiny')
    ap.add_argument('--steps', type=int, default=300)
    ap.add_argument('--data-dir', default='runs/data')
    ap.add_argument('--json')
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        runs, cache = Path(tmp)/'runs', str(Path(tmp)/'inductor')
        eager = run(a.preset, a.steps, a.data_dir, runs, 'eager', False, cache)
        cold = run(a.preset, a.steps, a.data_dir, runs, 'cold', True, cache)     # the cache is empty: a first run
        warm = run(a.preset, a.steps, a.data_dir, runs, 'warm', True, cache)     # the same shapes again: a resume
        eager_again = run(a.preset, a.steps, a.data_dir, runs, 'eager2', False, cache)   # the machine may have drifted
    e = statistics.mean([steady(eager), steady(eager_again)])
    c = statistics.mean([steady(cold), steady(warm)])
    base = statistics.mean([overhead(eager, e), overhead(eager_again, e)])   # validations and first steps, in both modes
    res = dict(preset=a.preset, steps=a.steps, eager_step_ms=e * 1e3, compiled_step_ms=c * 1e3, speedup=e / c,
               eager_overhead_s=base, compile_cold_s=overhead(cold, c) - base, compile_warm_s=overhead(warm, c) - base)
    gain = e - c
    res |= dict(break_even_cold=res['compile_cold_s'] / gain if gain > 0 else float('inf'),
                break_even_warm=res['compile_warm_s'] / gain if gain > 0 else float('inf'),
                loss_eager=eager[-1]['loss'], loss_compiled=cold[-1]['loss'], loss_warm=warm[-1]['loss'])
    for k, v in res.items(): print(f'{k:18s} {v:.4g}' if isinstance(v, float) else f'{k:18s} {v}')
    if a.json: Path(a.json).write_text(json.dumps(res, indent=1))

if __name__ == '__main__': main()
