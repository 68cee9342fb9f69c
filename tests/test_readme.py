"""README.md is nbs/index.ipynb rendered (nbdev-readme needs Quarto, which these machines cannot install).

Regenerate after editing the notebook: `python tests/test_readme.py --write`.
"""
import json, re, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

def render_readme() -> str:
    "Markdown cells as they are, code cells as python blocks (outputs are cleaned away by nbdev-clean)."
    nb = json.loads((ROOT/'nbs/index.ipynb').read_text())
    parts = []
    for c in nb['cells']:
        src = ''.join(c['source']).strip()
        if not src or src.startswith('#| hide'): continue
        parts.append(src if c['cell_type'] == 'markdown' else f"```python\n{src}\n```")
    return '\n\n'.join(parts) + '\n'

def readme_commands(text: str) -> list[str]:
    "The bash blocks of the quick-start section: the two copy-paste commands."
    quick = text.split('## Quick start', 1)[1].split('\n## ', 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", quick, re.S)]

def test_readme_is_index_notebook():
    assert (ROOT/'README.md').read_text() == render_readme(), "README.md is stale. Fix: python tests/test_readme.py --write"

def test_readme_opens_with_exactly_two_commands():
    cmds = readme_commands(render_readme())
    assert len(cmds) == 2, cmds
    setup_and_train, setup_and_test = cmds
    for c in cmds:
        assert '\n' not in c, 'each command is one copy-paste line'
        assert 'torch==2.13.0' in c or '.ci/run' in c, 'the CPU torch build is installed before anything pulls a CUDA one'
    assert 'papermill nbs/train.ipynb' in setup_and_train and '-p preset tiny' in setup_and_train
    assert setup_and_test == 'bash .ci/run'
    ci = (ROOT/'.ci/run').read_text()
    assert 'pip install -q torch==2.13.0' in ci and 'pytest tests/' in ci and 'nbdev-test' in ci

if __name__ == '__main__' and '--write' in sys.argv:
    (ROOT/'README.md').write_text(render_readme()); print('wrote README.md')
