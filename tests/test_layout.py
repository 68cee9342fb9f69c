"""The notebooks' layout: every numbered notebook has a number of its own, so the file order is the flow order
(config -> sizing -> tokenizer -> data -> model -> train -> eval -> export) with no tie to break."""
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_numbered_notebooks_have_unique_numbers():
    by_number = defaultdict(list)
    for nb in sorted((ROOT/'nbs').glob('[0-9]*.ipynb')):
        by_number[re.match(r'\d+[a-z]*', nb.name)[0]].append(nb.name)
    shared = {n: names for n, names in by_number.items() if len(names) > 1}
    assert by_number and not shared, f"notebooks that share a number: {shared}. Fix: renumber one (and every reference to it)"
