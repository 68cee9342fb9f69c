"""The kit's shape, read from its source with `ast`: the import graph has no cycle, and no module but the stage table
compares or keys on a stage's name (a stage is one row of `fsi_nb.config.STAGES`)."""
import ast, re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent/'fsi_nb'
MODULES = sorted(p.stem for p in PKG.glob('*.py') if p.stem not in ('__init__', '_modidx'))

def _is_main_guard(node) -> bool:
    "`if __name__ == '__main__':` - the block that runs when the module is the program, never on import."
    t = node.test if isinstance(node, ast.If) else None
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == '__name__'
            and any(isinstance(c, ast.Constant) and c.value == '__main__' for c in t.comparators)) or (
           isinstance(t, ast.BoolOp) and any(_is_main_guard(ast.If(test=v, body=[], orelse=[])) for v in t.values))

def _imports(tree) -> set[str]:
    "fsi_nb modules imported anywhere in `tree` (functions included), except under a `__main__` guard."
    found, todo = set(), [tree]
    while todo:
        node = todo.pop()
        if _is_main_guard(node): continue
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ''
            if node.level == 1: found |= {mod.split('.')[0]} if mod else {a.name for a in node.names}
            elif mod == 'fsi_nb': found |= {a.name for a in node.names}
            elif mod.startswith('fsi_nb.'): found.add(mod.split('.')[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split('.')[1] for a in node.names if a.name.startswith('fsi_nb.')}
        todo.extend(ast.iter_child_nodes(node))
    return found & set(MODULES)

def import_graph() -> dict[str, set[str]]:
    return {m: _imports(ast.parse((PKG/f'{m}.py').read_text())) - {m} for m in MODULES}

def find_cycle(graph):
    "One cycle of `graph` as a list of modules, or None."
    state, stack = {}, []
    def visit(m):
        state[m] = 'open'; stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 'open': return stack[stack.index(n):] + [n]
            if n not in state and (c := visit(n)): return c
        state[m] = 'done'; stack.pop()
    for m in sorted(graph):
        if m not in state and (c := visit(m)): return c

def test_find_cycle_finds_one():
    assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']
    assert find_cycle({'a': {'b'}, 'b': set(), 'c': {'a', 'b'}}) is None

def test_main_guard_imports_are_not_edges():
    tree = ast.parse("from .a import x\nif __name__ == '__main__' and True:\n    from .b import y\ndef f():\n    from fsi_nb.c import z\n")
    global MODULES
    saved, MODULES = MODULES, ['a', 'b', 'c']
    try: assert _imports(tree) == {'a', 'c'}
    finally: MODULES = saved

def test_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 20
    assert (c := find_cycle(graph)) is None, f"import cycle: {' -> '.join(c)}. Fix: move the code that needs the later module up a floor (e.g. into fsi_nb.cli)."

STAGE_NAME = re.compile(r'^stage\d+[a-z]?$')

def stage_name_uses(src:str) -> list[tuple[int, str]]:
    "(line, what) for each comparison with a stage name, and each dict keyed by one, in `src`."
    out = []
    for node in ast.walk(ast.parse(src)):
        consts = []
        if isinstance(node, ast.Compare): consts = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict): consts = node.keys
        elif isinstance(node, ast.Call):   # dict(stage2=...) keys; stage='stage5' passed along as if it were data
            consts = [ast.Constant(k.arg) for k in node.keywords if k.arg] if isinstance(node.func, ast.Name) and node.func.id == 'dict' else []
            consts += [k.value for k in node.keywords]
        elif isinstance(node, ast.arguments): consts = [*node.defaults, *node.kw_defaults]   # def f(stage='stage5')
        for c in consts:
            if isinstance(c, ast.Constant) and isinstance(c.value, str) and STAGE_NAME.match(c.value):
                out.append((getattr(c, "lineno", None) or getattr(node, "lineno", 0), c.value))
            elif isinstance(c, (ast.Tuple, ast.List, ast.Set)):
                out += [(getattr(node, "lineno", 0), e.value) for e in c.elts if isinstance(e, ast.Constant) and isinstance(e.value, str) and STAGE_NAME.match(e.value)]
    return out

def test_stage_name_uses_finds_them():
    found = stage_name_uses("x = s == 'stage1b'\ny = s in ('stage5', 'x')\nz = {'stage2': 1}\nw = dict(stage3=1)\n"
                            "b = Batcher(d, stage='stage4')\ndef f(stage='stage2b'): pass")
    assert sorted(w for _, w in found) == ['stage1b', 'stage2', 'stage2b', 'stage3', 'stage4', 'stage5']
    assert stage_name_uses("x = get_stage('stage1')\nhelp = 'e.g. stage1,stage2'") == []   # naming a stage is not deciding by it

@pytest.mark.parametrize('module', [m for m in MODULES if m != 'config'])
def test_only_the_stage_table_decides_by_stage_name(module):
    uses = stage_name_uses((PKG/f'{module}.py').read_text())
    assert not uses, (f"fsi_nb/{module}.py compares or keys on stage names {uses}: a stage is one row of fsi_nb.config.STAGES. "
                      "Fix: put what differs into the row (a field of Stage) and read it from there.")
