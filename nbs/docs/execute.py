"""Execute the notebooks the way `nbdev-test` does and keep the executed copies, outside the sources, for the docs.

`python nbs/docs/execute.py [--n-workers N] [--force] [NAME.ipynb ...]` runs each notebook with nbdev's own `test_nb`
(in `nbs/`, `IN_TEST=1`, the cells flagged in `tst_flags` skipped, the first error fails the notebook) and writes the
executed notebook to `_proc/executed/` instead of back into `nbs/`. By default: every numbered notebook, plus the run
notebooks in `RUN_NOTEBOOKS`, which have a small `IN_TEST` path. A copy is reused while its key (the notebook, the
library and this file) is unchanged. CI runs this as its notebook test step; the mkdocs hook (`hooks.py`) runs it for
copies that are missing or stale, so `mkdocs build` alone also works.
"""
from __future__ import annotations
import argparse, hashlib, json, os, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NBS, OUT = ROOT/'nbs', ROOT/'_proc'/'executed'
RUN_NOTEBOOKS = ('sizing.ipynb', 'train.ipynb')   # run notebooks cheap enough under IN_TEST to show with outputs

def default_notebooks() -> list[Path]:
    "The numbered notebooks and `RUN_NOTEBOOKS`."
    return sorted(NBS.glob('[0-9]*.ipynb')) + [NBS/n for n in RUN_NOTEBOOKS]

def key(nb:Path) -> str:
    "What an executed copy depends on: the notebook, every library module, and this file."
    h = hashlib.sha256()
    for p in [nb, Path(__file__), *sorted((ROOT/'fsi_nb').glob('*.py'))]: h.update(p.name.encode() + b'\0' + p.read_bytes())
    return h.hexdigest()

def executed(nb:Path) -> Path: return OUT/nb.name

def is_fresh(nb:Path) -> bool:
    "Whether `_proc/executed/` holds a copy of `nb` executed from its current sources."
    try: return json.loads(executed(nb).read_text())['metadata'].get('fsi_nb_docs', {}).get('key') == key(nb)
    except (OSError, ValueError, KeyError): return False

def _execute(nb:Path, **kwargs):
    "One notebook, in a worker process: nbdev's `test_nb`, its save redirected to `_proc/executed/`."
    import nbdev.test as T
    from nbdev.config import get_config
    from fastcore.nbio import write_nb
    cfg, k = get_config(), key(nb)
    def save(doc, fn):
        doc['metadata']['fsi_nb_docs'] = dict(key=k, executed=time.strftime('%Y-%m-%d %H:%M:%S'))
        OUT.mkdir(parents=True, exist_ok=True)
        tmp = executed(nb).with_suffix('.tmp'); write_nb(doc, tmp); os.replace(tmp, executed(nb))
    T.write_nb = save   # test_nb(save=True) writes here, never into nbs/
    flags = cfg.tst_flags.split() if isinstance(cfg.tst_flags, str) else list(cfg.tst_flags or [])
    return T.test_nb(nb, skip_flags=flags, save=True, basepath=cfg.config_path, cell_timeout=cfg.cell_timeout or None)

def run(notebooks:list[Path], n_workers:int=None) -> list[Path]:
    "Execute `notebooks` in parallel (in `nbs/`, as nbdev-test); the ones that failed."
    from fastcore.parallel import parallel
    from fastcore.xtras import working_directory
    if not notebooks: return []
    n_workers = min(os.cpu_count() or 1, 8) if n_workers is None else n_workers
    if str(Path(__file__).parent) not in sys.path: sys.path.insert(0, str(Path(__file__).parent))
    import execute   # by an importable name, for worker processes that are started fresh rather than forked
    with working_directory(NBS):
        results = parallel(execute._execute, notebooks, n_workers=n_workers if len(notebooks) > 1 else 0, pause=0.01)
    return [nb for nb, (ok, _) in zip(notebooks, results) if not ok]

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog='python nbs/docs/execute.py', description=__doc__.split('\n\n')[0])
    ap.add_argument('notebooks', nargs='*', help='names in nbs/ (default: the numbered notebooks and RUN_NOTEBOOKS)')
    ap.add_argument('--n-workers', type=int, default=None)
    ap.add_argument('--force', action='store_true', help='execute even the notebooks whose copy is fresh')
    a = ap.parse_args(argv)
    nbs = [NBS/n for n in a.notebooks] or default_notebooks()
    missing = [str(n) for n in nbs if not n.exists()]
    if missing: ap.error(f"no such notebook: {', '.join(missing)}")
    todo = [n for n in nbs if a.force or not is_fresh(n)]
    t0 = time.time()
    failed = run(todo, a.n_workers)
    print(f"executed {len(todo)} of {len(nbs)} notebooks ({len(nbs) - len(todo)} fresh copies reused) in {time.time() - t0:.0f}s; "
          f"copies in {OUT.relative_to(ROOT)}/")
    if failed:
        print('failed: ' + ', '.join(n.name for n in failed) + ' (tracebacks above)', file=sys.stderr)
        return 1
    return 0

if __name__ == '__main__': sys.exit(main())
