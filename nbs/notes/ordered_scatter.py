"""Do compiled `tiny` runs repeat to the bit, with inductor's atomic scatter-adds (`atomic`) or ordered ones (`det`)?
Three fresh models compiled one after the other in one process, 15 steps each on the same batches, two threads.

    python nbs/notes/ordered_scatter.py det|atomic fp32|bf16 [DATA_DIR]

Results: nbs/notes/compile-pays.md."""
import sys, time, statistics, torch
from fsi_nb.runs import resolve_run
from fsi_nb.objectives import make_objective
from fsi_nb.train import build_model, make_optimizer, train_step, ordered_scatter
ordered_scatter(sys.argv[1] == 'det').__enter__()   # for the whole process, as the trainer's loop has it
torch.set_num_threads(2)
data = sys.argv[3] if len(sys.argv) > 3 else 'runs/data'
prec = sys.argv[2]
spec = resolve_run('tiny', 'prof', data_dir=data, runs_dir='/tmp/prof', precision=prec, threads=2)
t = spec.train; dev = torch.device('cpu')
obj = make_objective(spec, data)
runs = []
for rep in range(3):
    m = build_model(spec, data); fwd = torch.compile(m); opt = make_optimizer(m, t)
    out, ts = [], []
    for i in range(15):
        t0 = time.perf_counter(); r = train_step(fwd, opt, obj, i, t, dev); ts.append(time.perf_counter() - t0)
        out.append((r.loss, r.grad_norm))
    runs.append(out); print(rep, 'median ms', 1000 * statistics.median(ts[5:]), flush=True)
print('identical', [runs[0] == r for r in runs[1:]])
print(max(abs(a[1] - b[1]) / a[1] for r in runs[1:] for a, b in zip(runs[0], r)))
