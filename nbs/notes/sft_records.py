"""The chain's SFT stages re-validated with records as units: each stage's objective on the weights it started from and those it ended with.
Used in 09a_stages: a chain run before SFT's validation took records as its units, re-measured with them."""
import json, sys, torch
from fsi_nb.runs import resolve_run
from fsi_nb.objectives import make_objective, paired_se
from fsi_nb.run_folder import load_run
torch.set_num_threads(2)
chain, data = sys.argv[1], sys.argv[2]   # python nbs/notes/sft_records.py CHAIN_DIR DATA_DIR
for stage, prev in (('stage2', 'stage1b'), ('stage2b', 'stage2')):
    spec = resolve_run('tiny', f'x-{stage}', stage=stage, init_from=f'{chain}/{prev}', data_dir=data, runs_dir='/tmp/sftrec', threads=2)
    obj = make_objective(spec, data)
    st = json.load(open(f'{chain}/{stage}/status.json'))
    ends = {'before': load_run(f'{chain}/{prev}', data, 'cpu', quiet=True).model, 'after': load_run(f'{chain}/{stage}', data, 'cpu', quiet=True, checkpoint=st['checkpoint']).model}
    ev = {k: obj.evaluate(m) for k, m in ends.items()}
    b, a = ev['before'], ev['after']; m = obj.metric
    se = paired_se(b[f'{m}_per_unit'], a[f'{m}_per_unit'], b[f'{m}_unit_weights'])
    ch = a[m] - b[m]
    print(f"{stage}: {m} {b[m]:.4f} ± {b[m + '_se']:.4f} -> {a[m]:.4f} ± {a[m + '_se']:.4f}; records {len(b[m + '_per_unit'])}; "
          f"change {ch:.4f} ± {se:.4f} paired ({abs(ch) / se:.1f} SE); the chain's (batches as units): {st['evals'][0][m]:.4f} -> {st['evals'][-1][m]:.4f}", flush=True)
