"""The FX states that concurrent compiles share, one SharedState spec each, and the patch
sets made of them. Adding a state is a spec here (and its tests), not a new engine.

- fx-tracing-flag: ``_is_fx_tracing_flag`` of torch/fx/_symbolic_trace.py (2.1 to 2.13;
  thread-local upstream since 2.14, pytorch PR 168999). One thread's symbolic_trace/make_fx
  makes every other thread's torch.compile'd call fail "Detected that you are using FX to
  symbolically trace a dynamo-optimized function". The accessors keep torch 2.14's names,
  so code written for 2.14 works on a patched release.
- node-meta: torch/fx/traceback.py's ``current_meta``, ``current_replay_node``,
  ``should_preserve_node_meta``, ``_should_preserve_node_meta`` (each release its own
  subset; still global in 2.14.1, pytorch issue 184917). ``preserve_node_meta()`` rebinds
  ``current_meta`` on exit and ``annotate()`` deletes ``current_meta["custom"]`` on exit:
  interleaved in two threads, ``KeyError: 'custom'``, and one thread's annotations and stack
  traces land in another thread's graph nodes.
- trace-patching: while a trace runs, torch/fx/_symbolic_trace.py's ``_Patcher`` replaces
  ``nn.Module.__call__``/``__getattr__``, ``math.*`` and ``torch.fx.wrap``'d functions for
  the whole process, and (2.5 on) the active patcher is the module global
  ``CURRENT_PATCHER``: another thread's modules go through the tracer ("module is not
  installed as a submodule") and its Dynamo reverts this thread's patches. The patch makes
  ``CURRENT_PATCHER`` thread-local and guards each patch to act only in the tracing thread
  (upstream PR 187589 does the same; not in 2.14.1).

Inlined when shipped, like _protocol.py; standard library only.
"""

import ast

from _protocol import *  # orch: inlined when shipped
from _fx_source import *  # orch: inlined when shipped
from _fx_threadlocal import *  # orch: inlined when shipped

FLAG = "_is_fx_tracing_flag"
FLAG_TLS = "_is_fx_tracing_tls"
FLAG_HELPERS = ("_get_is_fx_tracing", "_set_is_fx_tracing", "_is_fx_tracing_context")
GUARDS = ("is_fx_tracing", "is_fx_symbolic_tracing")  # the second only since torch 2.9
CHECKPOINT = "torch/utils/checkpoint.py"


def flag_upstream(tree):
    """torch >= 2.14: the holder and the three helpers, no module-level flag."""
    names = module_level_names(tree)
    if FLAG_TLS in names and FLAG not in names and all(module_function(tree, h)
                                                        for h in FLAG_HELPERS):
        return min(n.lineno for n in tree.body if single_name_assignment(n, FLAG_TLS))
    return None


def is_flag_name(node):
    return isinstance(node, ast.Name) and node.id == FLAG


def expect_symbolic_trace_shape(src):
    """Refuse unless the module has the pieces docs/design/torch-releases.md describes."""
    relpath, tree = src.relpath, src.tree
    taken = module_level_names(tree) & set(FLAG_HELPERS)
    if taken:
        raise UnknownShape(relpath, "already defines %s" % ", ".join(sorted(taken)))
    declared = [n for n in tree.body if single_name_assignment(n, FLAG)]
    if len(declared) != 1 or not (isinstance(declared[0].value, ast.Constant)
                                  and declared[0].value.value is False):
        raise UnknownShape(relpath, "expected exactly one module-level `%s = False`" % FLAG)
    # Dynamo's guard calls is_fx_tracing() before 2.9 and is_fx_symbolic_tracing() (which
    # 2.9 added) since; both read the same global, so each that exists must read it.
    guards = [module_function(tree, name) for name in GUARDS]
    if guards[0] is None:
        raise UnknownShape(relpath, "no module-level is_fx_tracing()")
    for name, function in zip(GUARDS, guards):
        if function is not None and not any(is_flag_name(n) for n in ast.walk(function)):
            raise UnknownShape(relpath, "%s() does not read %s" % (name, FLAG))
    tracer = module_class(tree, "Tracer")
    trace = tracer and next((n for n in tracer.body if isinstance(n, ast.FunctionDef)
                             and n.name == "trace"), None)
    if trace is None or not declares_global(trace, FLAG):
        raise UnknownShape(relpath, "no Tracer.trace() with `global %s`" % FLAG)
    sets_true = any(single_name_assignment(n, FLAG) and isinstance(n.value, ast.Constant)
                    and n.value.value is True for n in ast.walk(trace))
    restores = any(isinstance(n, ast.Try) and any(single_name_assignment(s, FLAG)
                                                  for s in n.finalbody)
                   for n in ast.walk(trace))
    if not (sets_true and restores):
        raise UnknownShape(relpath, "Tracer.trace() does not set %s to True and restore it "
                           "in a finally block" % FLAG)


def propagate_flag_into_recompute(src):
    """As upstream 2.14: the non-reentrant checkpoint captures the forward thread's flag
    and restores it around the recompute (which may run on an autograd worker thread)."""
    relpath = src.relpath
    outer = module_function(src.tree, "_checkpoint_without_reentrant_generator")
    recompute = outer and [n for n in outer.body
                           if isinstance(n, ast.FunctionDef) and n.name == "recompute_fn"]
    if not recompute or len(recompute) != 1:
        raise UnknownShape(relpath, "no _checkpoint_without_reentrant_generator() with one "
                           "nested recompute_fn()")
    recompute = recompute[0]
    capture = "is_fx_tracing"
    if any(isinstance(n, ast.Name) and n.id == capture or isinstance(n, ast.arg)
           and n.arg == capture for n in ast.walk(outer)):
        raise UnknownShape(relpath, "_checkpoint_without_reentrant_generator() already uses "
                           "the name %s" % capture)
    if not any(isinstance(n, ast.Import) and any(a.name == "torch" and a.asname is None
                                                 for a in n.names) for n in src.tree.body):
        raise UnknownShape(relpath, "does not `import torch` at module level")
    calls_fn = [w for w in ast.walk(recompute) if isinstance(w, ast.With)
                and any(isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
                        and isinstance(s.value.func, ast.Name) and s.value.func.id == "fn"
                        for s in w.body)]
    if len(calls_fn) != 1:
        raise UnknownShape(relpath, "recompute_fn() has no single `with ...:` block that "
                           "calls fn(...)")
    add_with_item(src, calls_fn[0], b"torch.fx._symbolic_trace._is_fx_tracing_context(%s)"
                  % capture.encode())
    # The capture goes with the other forward-time captures: after the statement before
    # recompute_fn (or above it when it comes first).
    index = outer.body.index(recompute)
    at = (src.own_lines(outer.body[index - 1])[1] if index
          else src.offset(src.first_line(recompute), 0))
    src.insert(at, src.indentation(recompute) + capture.encode()
               + b" = torch.fx._symbolic_trace._get_is_fx_tracing()\n")
    return True




FLAG_CONTEXT = b'''@contextlib.contextmanager
def _is_fx_tracing_context(value):
    previous = _get_is_fx_tracing()
    _set_is_fx_tracing(value)
    try:
        yield
    finally:
        _set_is_fx_tracing(previous)


'''

WHY_CHECKPOINT = ("never names the flag, but its non-reentrant recompute may run on an autograd "
                  "worker thread, which with a per-thread flag would no longer see the forward "
                  "thread's; backport of torch 2.14's recompute handling: the flag is captured "
                  "at forward time and restored around the recompute")

# After apply, in a fresh interpreter with the patched torch: threads see separate values.
FLAG_CHECK = r'''
import torch.fx._symbolic_trace as st
seen = {}


def flag_other_thread():
    seen["initial"] = st._get_is_fx_tracing()
    st._is_fx_tracing_flag = True  # written as a module attribute, as outside code does
    seen["attribute"] = st._is_fx_tracing_flag
    seen["is_fx_tracing"] = st.is_fx_tracing()


if st._get_is_fx_tracing() is not False:
    problems.append("the flag is not False after import")
with st._is_fx_tracing_context(True):
    in_thread(flag_other_thread)
    if not (st.is_fx_tracing() and st._is_fx_tracing_flag):
        problems.append("this thread does not see the flag it set")
if seen != {"initial": False, "attribute": True, "is_fx_tracing": True}:
    problems.append("another thread did not see its own flag: %r" % (seen,))
if st._get_is_fx_tracing() is not False:
    problems.append("another thread's write leaked here, or the context did not restore")
'''

FLAG_STATE = SharedState(
    "fx-tracing-flag", "FX tracing flag", "torch.fx._symbolic_trace", [FLAG],
    holder=FLAG_TLS, module_class="_ThreadLocalFxTracingFlagModule",
    comment="the FX tracing flag is per thread (backport of torch 2.14's helpers,\n"
            "pytorch PR 168999), so one thread's symbolic_trace no longer makes another\n"
            "thread's torch.compile'd calls fail.",
    required=[FLAG], accessor_names={FLAG: FLAG_HELPERS[:2]}, holder_attrs={FLAG: "flag"},
    extra_block=FLAG_CONTEXT, imports=("contextlib", "sys", "threading"), strict=True,
    upstream=flag_upstream, expect=expect_symbolic_trace_shape,
    extra={CHECKPOINT: (propagate_flag_into_recompute, WHY_CHECKPOINT)},
    why_home="holds the process-wide flag: it becomes thread-local, with torch 2.14's "
             "helpers, and every read and write in the file goes through them",
    import_check=FLAG_CHECK)


NODE_META_NAMES = ("current_meta", "current_replay_node", "should_preserve_node_meta",
                   "_should_preserve_node_meta")


def expect_traceback_shape(src):
    if not module_function(src.tree, "preserve_node_meta"):
        raise UnknownShape(src.relpath, "no module-level preserve_node_meta()")


NODE_META_CHECK = r'''
import torch.fx.traceback as tb
inside = {}


def node_meta_other_thread():
    inside["preserving"] = tb.has_preserved_node_meta()
    inside["meta"] = dict(tb.current_meta)
    tb.current_meta["orch-check"] = "other"


with tb.preserve_node_meta():
    tb.current_meta["orch-check"] = "main"
    in_thread(node_meta_other_thread)
    if not tb.has_preserved_node_meta() or tb.current_meta.get("orch-check") != "main":
        problems.append("node meta: this thread lost its own node meta to another thread")
    tb.current_meta.pop("orch-check", None)  # (before 2.2 the exit restores only the flag)
if inside != {"preserving": False, "meta": {}}:
    problems.append("node meta: another thread saw this thread's node meta: %r" % (inside,))
if tb.has_preserved_node_meta():
    problems.append("node meta: preserve_node_meta() did not restore this thread's flag")
'''

NODE_META_STATE = SharedState(
    "node-meta", "FX node-meta state", "torch.fx.traceback", NODE_META_NAMES,
    holder="_orch_node_meta_tls", module_class="_ThreadLocalNodeMetaModule",
    comment="FX's node-meta state is per thread (pytorch issue 184917): one thread's\n"
            "preserve_node_meta()/annotate() no longer rebinds or deletes another thread's\n"
            "current_meta (KeyError: 'custom') or leaks its annotations into that thread's "
            "graph.",
    required=("current_meta", "should_preserve_node_meta"), exists_if="preserve_node_meta",
    expect=expect_traceback_shape,
    why_home="holds FX's node-meta state as module globals: they become thread-local, and "
             "every read and write in the file goes through their accessors",
    import_check=NODE_META_CHECK)

SYMBOLIC_TRACE = "torch/fx/_symbolic_trace.py"
THREAD_GUARD = "_orch_thread_guard"
# What each _Patcher method replaces, as an expression over its own parameters: the guard
# calls it in every thread but the tracing one.
PATCHER_ORIGINALS = {
    "patch": ("frame_dict", "frame_dict.get(name, getattr(builtins, name, None))"),
    "patch_method": ("cls", "getattr(cls, name)"),
}
THREAD_GUARD_BLOCK = b'''# orch: FX's trace-time patches (nn.Module.__call__/__getattr__, math.*, torch.fx.wrap'd
# functions) act only in the thread that traces; other threads get the original (as
# upstream PR 187589 does), so another thread's modules no longer fail "module is not
# installed as a submodule".
def _orch_thread_guard(new_fn, orig_fn):
    owner = threading.get_ident()

    @functools.wraps(new_fn)
    def guarded(*args, **kwargs):
        if orig_fn is None or threading.get_ident() == owner:
            return new_fn(*args, **kwargs)
        return orig_fn(*args, **kwargs)

    return guarded


'''


def isolate_trace_patches(src):
    """Every patch a _Patcher makes goes through _orch_thread_guard: the first statement of
    _Patcher.patch and _Patcher.patch_method wraps new_fn."""
    patcher = module_class(src.tree, "_Patcher")
    if patcher is None:
        raise UnknownShape(src.relpath, "no module-level class _Patcher")
    if THREAD_GUARD in module_level_names(src.tree):
        raise UnknownShape(src.relpath, "already defines %s" % THREAD_GUARD)
    for name, (owner, original) in sorted(PATCHER_ORIGINALS.items()):
        method = next((n for n in patcher.body if isinstance(n, ast.FunctionDef)
                       and n.name == name), None)
        arguments = [a.arg for a in method.args.args] if method else []
        if arguments[:4] != ["self", owner, "name", "new_fn"]:
            raise UnknownShape(src.relpath, "_Patcher.%s(self, %s, name, new_fn, ...) not found"
                               % (name, owner))
        body = method.body
        first = body[1] if (len(body) > 1 and isinstance(body[0], ast.Expr)
                            and isinstance(body[0].value, ast.Constant)) else body[0]
        start = src.own_lines(first)[0]
        src.insert(start, src.indentation(first) + ("new_fn = %s(new_fn, %s)\n"
                                                    % (THREAD_GUARD, original)).encode())
    src.insert(src.offset(src.first_line(patcher), 0), THREAD_GUARD_BLOCK)
    for module in ("builtins", "functools", "threading"):
        ensure_module_import(src, module)
    return True


WHY_TRACE_PATCHES = ("its _Patcher patches nn.Module.__call__/__getattr__ and math.* for the whole "
                     "process while a trace runs: each patch now acts only in the tracing thread")

TRACE_PATCHING_CHECK = r'''
import torch.fx._symbolic_trace as st
import torch.nn as nn
called = {}
with st._Patcher() as patcher:
    patcher.patch_method(nn.Module, "__call__", lambda *a, **k: "patched", deduplicate=False)
    called["here"] = nn.Identity()(1)
    in_thread(lambda: called.__setitem__("there", nn.Identity()(2)))
if called != {"here": "patched", "there": 2}:
    problems.append("trace patching: a patch acted in another thread: %r" % (called,))
if hasattr(st, "_new_patcher"):
    seen = {}
    with st._new_patcher() as patcher:
        in_thread(lambda: seen.__setitem__("other", st.CURRENT_PATCHER))
        seen["own"] = st.CURRENT_PATCHER is patcher
    if seen != {"other": None, "own": True}:
        problems.append("trace patching: CURRENT_PATCHER is shared: %r" % (seen,))
'''

TRACE_PATCHING_STATE = SharedState(
    "trace-patching", "FX trace-time patching", "torch.fx._symbolic_trace", ["CURRENT_PATCHER"],
    holder="_orch_patcher_tls", module_class="_ThreadLocalPatcherModule",
    comment="the active trace's patcher is per thread: another thread's Dynamo no longer\n"
            "reverts and re-applies this thread's trace-time patches.",
    exists_if="_Patcher", names_optional=True,
    exists_why="_Patcher's trace-time patches (nn.Module.__call__/__getattr__, math.*) act in "
               "every thread while one traces",
    extra={SYMBOLIC_TRACE: (isolate_trace_patches, WHY_TRACE_PATCHES)},
    why_home="holds CURRENT_PATCHER, the active trace's patcher, as a module global: it becomes "
             "thread-local",
    import_check=TRACE_PATCHING_CHECK)

STATES = (FLAG_STATE, NODE_META_STATE, TRACE_PATCHING_STATE)
STATE_BY_KEY = dict((s.key, s) for s in STATES)
# fx-tls, the first patch set, is the flag alone: users' scripts and records keep working.
PATCH_SETS = {"fx-tls": (FLAG_STATE,), "fx-threads": STATES}
