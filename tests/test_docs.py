"Every library module has an API page in the offline docs."
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def test_every_module_has_an_api_page():
    modules = sorted(p.stem for p in (ROOT/'fsi_nb').glob('*.py') if not p.stem.startswith('_'))
    missing = [m for m in modules if not (ROOT/f'nbs/docs/api/{m}.md').exists()]
    assert not missing, f"no API page for {missing}. Fix: add nbs/docs/api/<module>.md containing '::: fsi_nb.<module>'"
    for m in modules: assert f'::: fsi_nb.{m}' in (ROOT/f'nbs/docs/api/{m}.md').read_text()

def test_every_run_notebook_is_executed_by_papermill_in_a_test():
    run_nbs = sorted(p.name for p in (ROOT/'nbs').glob('*.ipynb') if not p.name[0].isdigit() and p.name != 'index.ipynb')
    tests = ''.join(p.read_text() for p in (ROOT/'tests').glob('test_*.py') if p.name != 'test_docs.py')
    untested = [n for n in run_nbs if f"nbs/{n}" not in tests and f"'{n}'" not in tests and f'"{n}"' not in tests]
    assert run_nbs and not untested, f"run notebooks with no papermill test: {untested}"
