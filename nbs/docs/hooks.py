"""mkdocs hooks: the site is built from executed copies of the notebooks, with nbdev's plumbing left out.

`on_config` executes the notebooks whose copy in `_proc/executed/` is missing or stale (`execute.py`), then lays out
the pages in `_proc/site/` and points `docs_dir` there; nothing is written into `nbs/`:
- the numbered notebooks and `execute.RUN_NOTEBOOKS` with their outputs; the other run notebooks as templates;
- without nbdev's plumbing: `#| default_exp` and `#| hide` cells, the exported imports above the title, and the
  `#|` lines of every other cell;
- a navigation built from the files (Library, Run notebooks, Lab notes from `nbs/notes/`, API), so adding a page
  needs no edit here.
`on_page_content` rebuilds each notebook page's table of contents from its rendered headings: mkdocs-jupyter's own
drops code spans ("Sizing the `a100` and `h200` presets" became "Sizing the and presets", with a dead anchor).
"""
from __future__ import annotations
import html, json, logging, re, shutil, sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.toc import get_toc

HERE = Path(__file__).resolve().parent
ROOT, NBS = HERE.parents[1], HERE.parent
SITE_SRC = ROOT/'_proc'/'site'
log = logging.getLogger('mkdocs.hooks.fsi_nb')

def _execute_module():
    "`execute.py`, imported by name (its worker function must pickle into worker processes)."
    if str(HERE) not in sys.path: sys.path.insert(0, str(HERE))
    import execute
    return execute

_PLUMBING = re.compile(r'^#\|\s*(default_exp|hide)\b')
_DIRECTIVE = re.compile(r'^#\|.*\n?', re.M)

def page_notebook(nb:dict, template_note:str|None=None) -> dict:
    "A notebook as the docs show it: plumbing cells dropped, directive lines removed, the title first."
    cells, title_at = [], None
    for c in nb['cells']:
        src = ''.join(c['source'])
        if c['cell_type'] == 'markdown' and title_at is None and re.match(r'#\s', src): title_at = len(cells)
        if c['cell_type'] == 'code':
            if _PLUMBING.match(src): continue
            if title_at is None and re.match(r'#\|\s*export', src): continue   # the exported imports above the title
            src = _DIRECTIVE.sub('', src).strip('\n')
            if not src and not c.get('outputs'): continue
        cells.append(dict(c, source=src, metadata={}))   # execnb's timings are not valid nbformat metadata
    if title_at:   # code above the title (a run notebook's parameters) goes right below it
        cells = [cells[title_at], *cells[:title_at], *cells[title_at + 1:]]
    if template_note: cells.insert(1, dict(cell_type='markdown', id='template-note', metadata={}, source=template_note))
    return dict(nb, cells=cells)

def _title(nb:Path) -> str:
    "A notebook's first H1."
    for c in json.loads(nb.read_text())['cells']:
        m = re.match(r'#\s+(.+)', ''.join(c['source'])) if c['cell_type'] == 'markdown' else None
        if m: return m[1].strip()
    return nb.stem

def on_config(config, **kwargs):
    ex = _execute_module()
    todo = [nb for nb in ex.default_notebooks() if not ex.is_fresh(nb)]
    if todo:
        log.info(f"executing {len(todo)} notebooks whose executed copy is missing or stale: {', '.join(n.name for n in todo)}")
        failed = ex.run(todo)
        if failed: raise PluginError(f"notebooks failed: {', '.join(n.name for n in failed)} (tracebacks above). Fix them, then build again.")
    shutil.rmtree(SITE_SRC, ignore_errors=True)
    SITE_SRC.mkdir(parents=True)
    library, runs = [], []
    for nb in sorted(NBS.glob('*.ipynb')):
        numbered, shown = nb.name[0].isdigit(), ex.executed(nb) if ex.executed(nb).exists() and ex.is_fresh(nb) else nb
        note = None if numbered or nb.name == 'index.ipynb' or shown != nb else (
            f"> A run notebook, shown as the template papermill runs (`papermill nbs/{nb.name} runs/<name>.ipynb -k python3 --cwd nbs`); "
            "the executed copy in the run's folder is the record, with the outputs.")
        (SITE_SRC/nb.name).write_text(json.dumps(page_notebook(json.loads(shown.read_text()), note)))
        if nb.name != 'index.ipynb': (library if numbered else runs).append({_title(nb): nb.name})
    shutil.copytree(HERE/'api', SITE_SRC/'docs'/'api')
    if (NBS/'notes').is_dir(): shutil.copytree(NBS/'notes', SITE_SRC/'notes', ignore=shutil.ignore_patterns('*.py'))   # the lab notes, not their scripts
    shutil.copy(HERE/'extra.css', SITE_SRC/'extra.css')
    pages = lambda d, prefix: [f'{prefix}/{p.name}' for p in sorted(d.glob('*.md'))]
    config['docs_dir'] = str(SITE_SRC)
    config['nav'] = [{'Home': 'index.ipynb'}, {'Library': library}, {'Run notebooks': runs},
                     {'Lab notes': pages(NBS/'notes', 'notes')}, {'API': pages(HERE/'api', 'docs/api')}]
    return config

def _toc_tokens(content:str) -> list[dict]:
    "Nested TOC tokens from the `<hN id=...>` headings of rendered HTML, their text in full (code spans included)."
    root, stack = [], []
    for m in re.finditer(r'<h([1-6]) id="([^"]+)"[^>]*>(.*?)</h\1>', content, re.S):
        inner = re.sub(r'<a class="anchor-link".*?</a>', '', m[3], flags=re.S)
        tok = dict(level=int(m[1]), id=m[2], name=html.unescape(re.sub(r'<[^>]+>', '', inner)).strip(), children=[])
        while stack and stack[-1]['level'] >= tok['level']: stack.pop()
        (stack[-1]['children'] if stack else root).append(tok); stack.append(tok)
    return root

def on_page_content(content, page, **kwargs):
    if page.file.src_path.endswith('.ipynb'): page.toc = get_toc(_toc_tokens(content))
    return content
