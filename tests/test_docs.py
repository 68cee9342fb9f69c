"Every library module has an API page in the offline docs."
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def test_every_module_has_an_api_page():
    modules = sorted(p.stem for p in (ROOT/'fsi_nb').glob('*.py') if not p.stem.startswith('_'))
    missing = [m for m in modules if not (ROOT/f'nbs/docs/api/{m}.md').exists()]
    assert not missing, f"no API page for {missing}. Fix: add nbs/docs/api/<module>.md containing '::: fsi_nb.<module>'"
    for m in modules: assert f'::: fsi_nb.{m}' in (ROOT/f'nbs/docs/api/{m}.md').read_text()
