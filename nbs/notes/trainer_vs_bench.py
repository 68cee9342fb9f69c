"""The trainer's compiled tiny step against the bench's: the trainer's model (structure tables set) on real batches and on a fixed
random batch, and the bench's model (no tables) on that batch, compiled, interleaved with an eager arm in one process.

    python nbs/notes/trainer_vs_bench.py THREADS DATA_DIR

Results: nbs/notes/compile-pays.md."""
import sys, time, statistics, torch, os
from fsi_nb.runs import resolve_run
from fsi_nb.objectives import make_objective
from fsi_nb.train import build_model, make_optimizer, train_step
from fsi_nb.bench import FixedBatch
from fsi_nb.model import FSIEdgeModel
threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
torch.set_num_threads(threads)
data = sys.argv[2] if len(sys.argv) > 2 else 'runs/data'
spec = resolve_run('tiny', 'prof', data_dir=data, runs_dir='/tmp/prof', precision='bf16', threads=threads)
t = spec.train; dev = torch.device('cpu')
obj = make_objective(spec, data)
real = build_model(spec, data)
bare = FSIEdgeModel(spec.model); bare.load_state_dict(real.state_dict(), strict=False)
x = obj.batch(0, 0)['input_ids']
rnd = torch.randint(0, spec.model.vocab_size, x.shape, generator=torch.Generator().manual_seed(0))
arms = {'eager real/real': (real, obj, False), 'compiled real/real': (real, obj, True),
        'compiled real/fixed random': (real, FixedBatch(rnd, 'chunked'), True), 'compiled bare/fixed random': (bare, FixedBatch(rnd, 'chunked'), True)}
fwd = {k: torch.compile(m) if c else m for k, (m, o, c) in arms.items()}
opts = {k: make_optimizer(m, t) for k, (m, _, _) in arms.items()}
times = {k: [] for k in arms}
for i in range(28):
    for k, (m, o, c) in arms.items():
        t0 = time.perf_counter(); train_step(fwd[k], opts[k], o, i, t, dev); dt = time.perf_counter() - t0
        if i >= 8: times[k].append(dt)
    if i == 0: print('compiled the first steps', flush=True)
for k, v in times.items(): print(f'{k:28s} {1000 * statistics.median(v):7.1f} ms', flush=True)
