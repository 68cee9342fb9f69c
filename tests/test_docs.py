"""The offline docs: an API page per module, and the site itself — notebook pages with their outputs (plots, tables),
no nbdev plumbing, a table of contents that matches the headings, no request outside the site, nothing cut off.

The site is `_docs/` when it is newer than its sources (CI builds it just before pytest), else built here."""
import json, os, re, shutil, socket, subprocess, sys, threading, time
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

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

def _sources() -> list[Path]:
    return [*(ROOT/'nbs').glob('*.ipynb'), *(ROOT/'nbs'/'docs').rglob('*.*'), *(ROOT/'nbs'/'notes').glob('*.*'), *(ROOT/'fsi_nb').glob('*.py')]

@pytest.fixture(scope='module')
def site(tmp_path_factory) -> Path:
    "The built site: `_docs/` if it is newer than every source, else a fresh build (the executed copies are reused)."
    built = ROOT/'_docs'/'index.html'
    if built.exists() and built.stat().st_mtime > max(p.stat().st_mtime for p in _sources()): return built.parent
    out = tmp_path_factory.mktemp('site')
    r = subprocess.run([sys.executable, '-m', 'mkdocs', 'build', '--strict', '-q', '-f', 'nbs/docs/mkdocs.yml', '-d', str(out)],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, 'NO_MKDOCS_2_WARNING': '1'}, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    return out

def _notebook_pages(site) -> list[Path]:
    return sorted(site/f'{p.stem}.html' for p in (ROOT/'nbs').glob('*.ipynb'))

def _text(html:str) -> str:
    "The visible text of a page: no scripts, styles or tags."
    html = re.sub(r'<(script|style)\b.*?</\1>', '', html, flags=re.S)
    return re.sub(r'<[^>]+>', ' ', html)

def test_notebook_pages_show_their_outputs_and_no_plumbing(site):
    for page in _notebook_pages(site):
        html = page.read_text()
        assert not re.search(r'(?m)^\s*#\|', _text(html)), f'{page.name} shows nbdev directives'
        assert 'default_exp' not in _text(html), f'{page.name} shows nbdev plumbing'
        if page.stem[0].isdigit() or page.stem in ('sizing', 'train'):
            assert html.count('jp-OutputArea-output') >= 3, f'{page.name} has no outputs'
    sizing = (site/'01_sizing.html').read_text()
    assert sizing.count('jp-OutputArea-output') > 20
    assert sizing.count('<img') >= 1 and 'data:image/png;base64' in sizing, 'the tokens-vs-parameters plot is missing'
    assert re.search(r'jp-OutputArea-output.{0,400}<table', sizing, re.S) and sizing.count('<table') >= 4, 'the tables are missing'
    # the page starts with its title, not with the exported imports
    body = sizing.split('<article', 1)[1]
    assert body.find('<h1') < re.search(r'<div[^>]*class="[^"]*jp-CodeCell', body).start(), 'code above the title'
    run_page = (site/'train.html').read_text()
    assert 'data:image/png;base64' in run_page and 'finished' in _text(run_page)   # the run's plot and its last line

def test_table_of_contents_matches_the_headings(site):
    html = (site/'01_sizing.html').read_text()
    ids = set(re.findall(r'<h[1-6] id="([^"]+)"', html))
    toc = re.findall(r'<a href="#([^"]+)" class="md-nav__link">\s*<span class="md-ellipsis">\s*(.*?)\s*</span>', html, re.S)
    assert toc and all(i in ids for i, _ in toc), [i for i, _ in toc if i not in ids]
    assert ('sizing-the-a100-and-h200-presets', 'Sizing the a100 and h200 presets') in [(i, re.sub(r'\s+', ' ', t)) for i, t in toc]

def test_navigation_titles_are_unique_and_sections_exist(site):
    "One title per page (not 'sizing' and 'Sizing'), and the pages grouped in sections."
    nav = (site/'01_sizing.html').read_text().split('md-nav--primary', 1)[1]
    links = dict(re.findall(r'<a href="([^"#]+\.html)" class="md-nav__link[^"]*">\s*<span class="md-ellipsis">\s*(.*?)\s*</span>', nav, re.S))
    titles = [re.sub(r'\s+', ' ', t).lower() for t in links.values()]
    assert len(links) > 40 and len(set(titles)) == len(titles), sorted(t for t in titles if titles.count(t) > 1)
    sections = re.findall(r'<label class="md-nav__link"[^>]*>\s*<span class="md-ellipsis">\s*(.*?)\s*</span>', nav, re.S)
    assert {'Library', 'Run notebooks', 'Lab notes', 'API'} <= set(sections), sections

def test_nothing_points_outside_the_site(site):
    "No page asks another server for anything (fonts, scripts, styles, images), and no docstring links a hosted copy."
    for page in site.rglob('*.html'):
        html = page.read_text()
        ext = re.findall(r'<(?:link|script|img|iframe|source)\b[^>]*?(?:href|src)="((?:https?:)?//[^"]+)"', html)
        assert not ext, f'{page.relative_to(site)} loads {ext[:3]}'
        assert 'fonts.googleapis' not in html and 'fsi-nb.github.io' not in html, page

# ---- in a real browser: requests, and lines that would be cut off

@pytest.fixture(scope='module')
def browser_page(site, tmp_path_factory):
    from _chromium import require, launch
    require()
    from playwright.sync_api import sync_playwright
    server = ThreadingHTTPServer(('127.0.0.1', 0), partial(SimpleHTTPRequestHandler, directory=str(site)))
    server.RequestHandlerClass.log_message = lambda *a: None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with sync_playwright() as pw:
        b = launch(pw, tmp_path_factory.mktemp('docs-browser')/'profile', viewport={'width': 1280, 'height': 900})
        page = b.new_page()
        requests = []
        page.on('request', lambda r: requests.append(r.url))
        yield page, f'http://127.0.0.1:{server.server_address[1]}', requests
        b.close()
    server.shutdown()

PAGES = ['index.html', '01_sizing.html', '10_dashboard.html', 'sizing.html', 'train.html', 'docs/api/sizing.html',
         'notes/cpu-threads.html']

def test_pages_in_a_browser_request_nothing_outside_and_cut_nothing_off(browser_page):
    "Each page loaded in chromium: every request goes to the site, and no line runs out of its box (the README's command)."
    page, base, requests = browser_page
    shots = ROOT/'runs'/'ci-artifacts'/'docs'
    shutil.rmtree(shots, ignore_errors=True); shots.mkdir(parents=True)
    for name in PAGES:
        requests.clear()
        page.goto(f'{base}/{name}', wait_until='networkidle')
        page.screenshot(path=str(shots/name.replace('/', '_').replace('.html', '.png')), full_page=name == 'index.html')
        outside = [u for u in requests if not u.startswith(base) and not u.startswith('data:')]
        assert not outside, f'{name} asked {outside[:3]}'
        cut = page.evaluate("""[...document.querySelectorAll('article pre, article code, .jp-OutputArea-output pre')]
            .filter(e => e.offsetParent !== null && getComputedStyle(e).overflowX !== 'auto' && getComputedStyle(e).overflowX !== 'scroll'
                         && e.scrollWidth > e.clientWidth + 1)
            .map(e => e.textContent.slice(0, 60))""")
        assert not cut, f'{name}: lines cut off: {cut[:3]}'
    page.goto(f'{base}/01_sizing.html', wait_until='networkidle')
    plot = page.locator('.jp-OutputArea-output img').first
    assert plot.evaluate('i => i.naturalWidth') > 300, 'the plot does not render'
