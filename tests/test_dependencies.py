"fsi_nb imports only what pyproject.toml declares: CI installs the dev extras, so a missing runtime dependency would otherwise only show on a user's fresh machine."
import re, subprocess, sys, tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORT_NAMES = {'ipykernel': ['ipykernel', 'IPython'], 'ipywidgets': ['ipywidgets']}  # distribution -> modules it provides

GUARD = r'''
import sys, importlib, pathlib
allowed = set(sys.argv[1].split(','))
class Guard:
    "Refuse a third-party import made directly by fsi_nb code unless it is a declared dependency."
    def find_spec(self, name, path=None, target=None):
        top = name.split('.')[0]
        if top in allowed or top in sys.stdlib_module_names or top == 'fsi_nb': return None
        f = sys._getframe(1)
        while f and f.f_code.co_filename.startswith('<frozen'): f = f.f_back
        if f and f.f_globals.get('__name__', '').startswith('fsi_nb'):
            raise ImportError(f"{f.f_globals['__name__']} imports {name!r}, which pyproject.toml does not declare")
        return None
sys.meta_path.insert(0, Guard())
for p in sorted(pathlib.Path('fsi_nb').glob('[!_]*.py')): importlib.import_module(f'fsi_nb.{p.stem}')
print('ok')
'''

def test_library_imports_only_declared_dependencies():
    deps = tomllib.loads((ROOT/'pyproject.toml').read_text())['project']['dependencies']
    names = [re.split(r'[<>=!~\[ ]', d)[0].strip().lower() for d in deps]
    allowed = [m for n in names for m in IMPORT_NAMES.get(n, [n.replace('-', '_')])]
    r = subprocess.run([sys.executable, '-c', GUARD, ','.join(allowed)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip().endswith('ok'), r.stderr[-2000:]
