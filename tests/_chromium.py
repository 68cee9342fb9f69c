"""Debian's chromium driven by Playwright, for the tests that look at pages as a person does (test_browser, test_docs).

The machine's own `chromium` (`apt-get install chromium`; `.ci/run` installs it as root), never Playwright's downloaded
browsers. Launched as it must run with no display and nothing beyond 127.0.0.1: no GPU, no QUIC, none of its own calls
home (component updates, sync, first-run pages), on a fresh profile (`--user-data-dir`) each time. Where chromium or
the `playwright` package is missing the tests skip, unless FSI_NB_REQUIRE_BROWSER=1 (set by `.ci/run` once it has
installed chromium): then they fail."""
import os, shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which('chromium') or '/usr/bin/chromium'
CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                 '--disable-background-networking', '--disable-component-update', '--disable-sync']

def missing() -> str:
    "Why the browser tests cannot run here ('' when they can)."
    try: import playwright  # noqa: F401
    except ImportError: return 'the playwright package is missing (pip install -e ".[dev]")'
    return '' if Path(CHROMIUM).exists() else f'no chromium at {CHROMIUM} (apt-get install chromium)'

def require(module:bool=False):
    "Skip (or, with FSI_NB_REQUIRE_BROWSER=1, fail) when the browser is missing; `module`: called at a test module's top."
    why = missing()
    if why and os.environ.get('FSI_NB_REQUIRE_BROWSER'): pytest.fail(f'browser tests required (FSI_NB_REQUIRE_BROWSER=1), but {why}')
    if why: pytest.skip(why, allow_module_level=module)

def launch(pw, profile:Path, viewport=None):
    "A chromium browser context on a fresh profile folder `profile` (passed as --user-data-dir)."
    shutil.rmtree(profile, ignore_errors=True); profile.mkdir(parents=True)
    return pw.chromium.launch_persistent_context(str(profile), executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True,
                                                 viewport=viewport or {'width': 1400, 'height': 1000})
