"""What a person sees in JupyterLab, in a real browser: JupyterLab on 127.0.0.1 driven by Debian's chromium through
Playwright. The sizing explorer's plot after every control change, the training dashboard (loss and routing plots,
no broken image, back after a page reload mid-run), and the run notebooks opened as working copies, so that the
sources stay untouched. A screenshot of every step is kept under runs/ci-artifacts/browser/ for a person to look at.

Needs `chromium` (Debian: apt-get install chromium) and the `playwright` package (tests/_chromium.py); `.ci/run`
installs both and sets FSI_NB_REQUIRE_BROWSER=1, so that there a missing browser fails instead of skipping."""
import hashlib, io, json, os, shutil, socket, subprocess, sys, time, urllib.request
from pathlib import Path

import numpy as np, pytest

from _chromium import require, launch
require(module=True)
from PIL import Image
from playwright.sync_api import sync_playwright, expect

pytestmark = pytest.mark.slow   # JupyterLab, chromium and three real runs: about two and a half minutes on two cores

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT/'runs'/'ci-artifacts'/'browser'

def free_port() -> int:
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); return s.getsockname()[1]

def png_spread(png:bytes) -> float:
    "Standard deviation of the grey levels of a screenshot: about 0 for a blank (all-white) image, tens for a plot."
    return float(np.asarray(Image.open(io.BytesIO(png)).convert('L'), dtype=float).std())

class Lab:
    "A JupyterLab server in `root` and a chromium page on it; `shot` keeps numbered screenshots."
    def __init__(self, root:Path, shots:Path, pw):
        self.root, self.shots, self.n = root, shots, 0
        self.port, self.token = free_port(), os.urandom(8).hex()
        # kernels' connection files under a path that names two notebook runners: widgets must stay on
        runtime = root.parent/'nbdev-papermill-runtime'
        settings = root.parent/'lab-settings'/'@jupyterlab'/'apputils-extension'
        settings.mkdir(parents=True, exist_ok=True)
        (settings/'notification.jupyterlab-settings').write_text('{"fetchNews": "false", "checkForUpdates": false}')
        env = {k: v for k, v in os.environ.items() if k not in ('FSI_NB_LIVE', 'IN_TEST')} | dict(JUPYTER_RUNTIME_DIR=str(runtime))
        self.proc = subprocess.Popen(
            [sys.executable, '-m', 'jupyter', 'lab', '--no-browser', '--allow-root', '--ip=127.0.0.1', f'--port={self.port}',
             f'--ServerApp.token={self.token}', f'--ServerApp.root_dir={root}', f'--LabApp.workspaces_dir={root.parent/"lab-ws"}',
             f'--LabApp.user_settings_dir={root.parent/"lab-settings"}'],
            cwd=root, env=env, stdout=open(root.parent/'jupyterlab.log', 'w'), stderr=subprocess.STDOUT)
        for _ in range(240):
            try: urllib.request.urlopen(f'http://127.0.0.1:{self.port}/api/status?token={self.token}', timeout=2); break
            except OSError: time.sleep(0.5)
        else: raise RuntimeError(f"JupyterLab did not start: {(root.parent/'jupyterlab.log').read_text()[-2000:]}")
        self.browser = launch(pw, root.parent/'chromium-profile')
        self.page = self.browser.new_page()

    def shot(self, name:str, el=None):
        self.n += 1
        path = self.shots/f'{self.n:02d}-{name}.png'
        png = (el or self.page).screenshot(path=str(path))
        ARTIFACTS.mkdir(parents=True, exist_ok=True); shutil.copy(path, ARTIFACTS/path.name)
        return png

    def api(self, path:str, method='GET'):
        req = urllib.request.Request(f'http://127.0.0.1:{self.port}/api/{path}?token={self.token}', method=method)
        body = urllib.request.urlopen(req, timeout=30).read()
        return json.loads(body) if body else None

    def open(self, name:str):
        "Open `name` alone (`?reset`: no tab of an earlier test comes back) once its kernel is idle and the page is connected to it."
        self.page.goto(f'http://127.0.0.1:{self.port}/lab/tree/{name}?reset&token={self.token}')
        for _ in range(480):
            k = next((s['kernel'] for s in self.api('sessions') if s['path'] == name), None)
            if k and k['execution_state'] == 'idle' and k['connections'] > 0: break
            time.sleep(0.25)
        else: raise AssertionError(f'no idle kernel for {name}')
        self.wait_idle()

    def wait_idle(self, timeout=120):
        expect(self.page.get_by_text('| Idle')).to_be_visible(timeout=timeout * 1000)

    def run_all(self):
        self.page.get_by_text('Run', exact=True).first.click()
        self.page.get_by_text('Run All Cells', exact=True).click()
        expect(self.page.locator('.jp-InputPrompt').filter(has_text='[1]')).to_have_count(1, timeout=60_000)   # it started

    def broken_images(self) -> int:
        "Images in the page that the browser could not show (the broken-image icon)."
        return self.page.evaluate("[...document.querySelectorAll('img')].filter(i => i.complete && i.naturalWidth === 0 && i.offsetParent !== null).length")

    def shutdown_kernels(self):
        "Stop every kernel (a notebook's remaining cells stop using the CPU the next test needs)."
        for k in self.api('kernels'): self.api(f"kernels/{k['id']}", method='DELETE')

    def close(self):
        self.browser.close(); self.proc.terminate(); self.proc.wait(30)

@pytest.fixture(scope='module')
def lab(tmp_path_factory, prepared_data):
    "JupyterLab on working copies of the run notebooks (`python -m fsi_nb.dashboard lab`), the sources' hashes kept."
    from fsi_nb.dashboard import lab_copies
    base = tmp_path_factory.mktemp('browser')
    root, shots = base/'lab', base/'screenshots'
    shots.mkdir(); shutil.rmtree(ARTIFACTS, ignore_errors=True)
    sources = {n: hashlib.sha256((ROOT/'nbs'/n).read_bytes()).hexdigest() for n in ('sizing.ipynb', 'train.ipynb')}
    lab_copies(dest=root)
    (root/'settings.ini').write_text(f"[fsi_nb]\ndata_dir = {prepared_data}\nruns_dir = runs\nthreads = 1\nlog_interval = 5\n")
    with sync_playwright() as pw:
        lab = Lab(root, shots, pw)
        try: yield lab
        finally: lab.close()
    for n, h in sources.items():   # a person works in the copies: the sources stay as committed
        assert hashlib.sha256((ROOT/'nbs'/n).read_bytes()).hexdigest() == h, f'nbs/{n} was written'

def set_parameters(nb_path:Path, **values):
    "Edit the parameters cell of a working copy, as a person would before running it."
    nb = json.loads(nb_path.read_text())
    cell = next(c for c in nb['cells'] if 'parameters' in c['metadata'].get('tags', []))
    cell['source'] = ''.join(cell['source']) + ''.join(f'\n{k} = {v!r}' for k, v in values.items())
    nb_path.write_text(json.dumps(nb))

def test_sizing_explorer_redraws_a_real_plot_after_every_change(lab):
    "Each change (preset, a slider, the GPU) brings a new table and a new picture, and the picture is a real plot."
    lab.open('sizing.ipynb'); lab.run_all()
    page = lab.page
    explorer = page.locator('.widget-hbox').filter(has=page.locator('.widget-image')).first
    image, table = explorer.locator('.widget-image'), explorer.locator('.widget-html')
    expect(image).to_be_visible(timeout=180_000)
    expect(page.locator('.jp-OutputArea-output').filter(has_text='widgets skipped')).to_have_count(0)   # not taken for a headless run
    shown = []
    def check(step:str, expect_in_table:str, change=None):
        before = image.get_attribute('src')
        if change: change()
        expect(table).to_contain_text(expect_in_table, timeout=60_000)
        if change:   # the picture is sent after the table: wait for the new one, not the one already there
            expect(image).not_to_have_attribute('src', before, timeout=60_000)
        image.scroll_into_view_if_needed()
        png = lab.shot(step, image)
        spread = png_spread(png)
        assert spread > 10, f'{step}: the plot is blank (grey-level spread {spread:.1f})'
        assert image.evaluate('i => i.complete && i.naturalWidth') > 300 and lab.broken_images() == 0
        digest = hashlib.sha256(png).hexdigest()
        assert digest not in shown, f'{step}: the picture did not change'
        shown.append(digest)
    check('sizing-explorer-h100', '105,068,568')
    check('sizing-preset-tiny', '2,220,418', lambda: explorer.locator('.widget-dropdown select').first.select_option('tiny'))
    layers = explorer.locator('.widget-slider').filter(has_text='layers').locator('.widget-readout')
    def four_layers():
        layers.click(); page.keyboard.press('Control+a'); page.keyboard.type('4'); page.keyboard.press('Enter')
    from fsi_nb.sizing import count_params, _explore_config
    from fsi_nb.config import get_preset
    check('sizing-layers-4', f"{count_params(_explore_config(get_preset('tiny'), 64, 4, 4, 0, 0, 128)).total:,}", four_layers)
    check('sizing-gpu-a100', '312 TFLOP/s', lambda: explorer.locator('.widget-dropdown').filter(has_text='GPU').locator('select').select_option('a100'))
    explorer.scroll_into_view_if_needed()
    lab.shot('sizing-page')
    lab.shutdown_kernels()

def read_json(path) -> dict:
    try: return json.loads(Path(path).read_text())
    except (OSError, ValueError): return {}

def dashboard_images(page):
    return page.locator('.widget-vbox').filter(has=page.locator('.widget-html pre')).locator('.widget-image')

def no_error_box(page):
    "Nothing in a red error-style box: the trainer's lines (stderr in a terminal) show as ordinary output."
    boxes = page.locator('[data-mime-type="application/vnd.jupyter.stderr"]')
    assert boxes.count() == 0, f'in a red box: {boxes.all_inner_texts()}'

def test_cpu_preset_run_to_the_end_without_a_broken_image(lab):
    "A dense CPU run of eight seconds, every cell to the summary: the loss plot, no broken-image icon, nothing in a red box."
    set_parameters(lab.root/'train.ipynb', preset='tiny', run_name='cpu', batch_size=2, budget_hours=8 / 3600, eval_batches=1, max_new_tokens=8)
    lab.open('train.ipynb'); lab.run_all()
    page, images = lab.page, dashboard_images(lab.page)
    head = page.locator('.widget-html pre').filter(has_text='cpu:')
    expect(head).to_contain_text('budget: stopped at step', timeout=300_000)   # the run's last word, as ordinary text
    images.first.scroll_into_view_if_needed()
    assert png_spread(lab.shot('cpu-dashboard', images.first)) > 10, 'the loss plot is blank'
    assert images.count() == 2 and not images.nth(1).is_visible()   # dense: the routing image stays hidden, not broken
    expect(page.locator('.jp-InputPrompt').filter(has_text='*')).to_have_count(0, timeout=300_000)   # every cell has run
    end = page.locator('.jp-OutputArea-output').filter(has_text='val_loss').filter(has_text='preset').filter(has_text='smoke').last
    expect(end).to_be_visible()   # the last cell's summary
    end.scroll_into_view_if_needed()
    lab.shot('cpu-notebook-end')
    assert lab.broken_images() == 0
    no_error_box(page)
    lab.shutdown_kernels()

def test_smoke_run_dashboard_comes_back_after_a_reload_mid_run(lab):
    "The h100 preset's real MoE architecture for two steps; the page reloaded while it trains; loss and routing plots after."
    shutil.copy(ROOT/'nbs'/'train.ipynb', lab.root/'smoke.ipynb')
    set_parameters(lab.root/'smoke.ipynb', preset='h100', smoke=True, run_name='smoke')
    lab.open('smoke.ipynb'); lab.run_all()
    page, images = lab.page, dashboard_images(lab.page)
    head = page.locator('.widget-html pre').filter(has_text='smoke:')
    expect(head).to_contain_text('trains', timeout=300_000)   # the dashboard is up as soon as the training process starts
    head.scroll_into_view_if_needed()
    lab.shot('smoke-dashboard-started')
    page.keyboard.press('Control+s')   # what autosave does every two minutes: the saved notebook refers to the dashboard's widgets
    for _ in range(120):
        if 'application/vnd.jupyter.widget-view+json' in (lab.root/'smoke.ipynb').read_text(): break
        time.sleep(0.25)
    else: raise AssertionError('the dashboard is not in the saved notebook')
    status = lambda: read_json(lab.root/'runs'/'smoke'/'status.json').get('state')
    for _ in range(480):   # the training process has set up its run folder (it then builds, validates and saves: a while)
        if status(): break
        time.sleep(0.25)
    assert status() == 'running', f'the run was not training at the reload: {status()}'
    page.reload()
    expect(page.get_by_text('Loading widget')).to_have_count(0, timeout=90_000)
    expect(head).to_be_visible(timeout=90_000)   # back, from the kernel, which the run does not hold
    expect(head).to_contain_text('finished 2/2 steps', timeout=600_000)   # and still following the run to its end
    for i, name in ((0, 'loss'), (1, 'routing')):
        expect(images.nth(i)).to_be_visible(timeout=60_000)
        images.nth(i).scroll_into_view_if_needed()
        assert png_spread(lab.shot(f'smoke-after-reload-{name}', images.nth(i))) > 10, f'the {name} plot is blank'
    assert lab.broken_images() == 0
    no_error_box(page)
    lab.shutdown_kernels()
