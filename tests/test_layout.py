"""The notebooks' layout: every numbered notebook has a number of its own, so the file order is the flow order
(config -> sizing -> tokenizer -> data -> model -> train -> eval -> export) with no tie to break; and the data rooms
(00_config ... 03g_batches) import only from modules whose notebooks come before theirs."""
import json, re
from collections import defaultdict
from pathlib import Path

from test_structure import import_graph

ROOT = Path(__file__).resolve().parents[1]


def test_numbered_notebooks_have_unique_numbers():
    by_number = defaultdict(list)
    for nb in sorted((ROOT/'nbs').glob('[0-9]*.ipynb')):
        by_number[re.match(r'\d+[a-z]*', nb.name)[0]].append(nb.name)
    shared = {n: names for n, names in by_number.items() if len(names) > 1}
    assert by_number and not shared, f"notebooks that share a number: {shared}. Fix: renumber one (and every reference to it)"


def _modules() -> dict[str, str]:
    "module name -> the stem of the notebook that exports it."
    out = {}
    for nb in sorted((ROOT/'nbs').glob('[0-9]*.ipynb')):
        for c in json.loads(nb.read_text())['cells']:
            if m := re.match(r'#\|\s*default_exp\s+(\S+)', ''.join(c['source'])): out[m[1]] = nb.stem
    return out


def test_data_modules_import_only_earlier_ones():
    mods, graph = _modules(), import_graph()   # the one reading of the imports (ast, function-level ones too)
    late = []
    for mod, stem in mods.items():
        if stem > '03z': continue
        for imp in sorted(graph[mod]):
            if imp in mods and mods[imp] >= stem: late.append(f'{mod} ({stem}) imports {imp} ({mods[imp]})')
    assert {'tasks', 'sources', 'stream', 'filters', 'shards', 'data', 'batches'} <= set(mods) and not late, late
