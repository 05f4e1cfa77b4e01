"""The one mechanism behind every fx patch state (payloads/_fx_threadlocal.py), on small
sources: a spec's globals become a thread-local holder with accessors, every use in the
module and in other files goes through them, and any shape it does not know is refused."""

from __future__ import annotations

import textwrap
import threading
import types

import pytest

from tests.support.fx_patch import FX_PATCH

SPEC = FX_PATCH.SharedState(
    "demo", "demo state", "pkg.state", ["meta", "_on"], holder="_demo_tls",
    module_class="_DemoModule", comment="demo", required=["meta"], exists_if="scope")

HOME = textwrap.dedent('''\
    import contextlib
    import threading

    meta: dict = {}
    _on = False


    @contextlib.contextmanager
    def scope(value):
        global meta, _on
        saved, saved_on = meta.copy(), _on
        try:
            _on = True
            meta["k"] = value
            yield
        finally:
            meta, _on = saved, saved_on
    ''')


def rewritten(spec, relpath, text, transform):
    src = FX_PATCH.Source(relpath, text.encode())
    transform(spec, src)
    return src.edited().decode()


def load(text, name="pkg.state"):
    import sys
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(text, name, "exec"), module.__dict__)
    return sys.modules[name]


def test_a_tuple_write_is_refused_untouched():
    with pytest.raises(FX_PATCH.UnknownShape, match="declares more globals|changes meta"):
        rewritten(SPEC, "pkg/state.py", HOME, FX_PATCH.rewrite_home)


HOME_SIMPLE = HOME.replace("    global meta, _on\n", "    global meta\n    global _on\n") \
    .replace("        meta, _on = saved, saved_on\n", "        meta = saved\n        _on = saved_on\n")
assert HOME_SIMPLE.count("global") == 2 and "meta = saved\n" in HOME_SIMPLE


def test_the_home_module_gets_a_holder_and_each_thread_its_own_values():
    text = rewritten(SPEC, "pkg/state.py", HOME_SIMPLE, FX_PATCH.rewrite_home)
    assert "global" not in text and "_demo_tls = threading.local()" in text
    module = load(text)
    seen = {}
    with module.scope(1):
        assert module.meta == {"k": 1} and module._on is True
        worker = threading.Thread(target=lambda: seen.update(meta=dict(module.meta),
                                                             on=module._on))
        worker.start()
        worker.join()
    assert seen == {"meta": {}, "on": False}        # another thread: a fresh {} and False
    assert module.meta == {} and module._on is False  # the scope restored this thread's
    module.meta = {"set": "as an attribute"}
    assert module._orch_tls_get_meta() == {"set": "as an attribute"}


@pytest.mark.parametrize("edit, reason", [
    (("meta: dict = {}", "meta: dict = dict()"), "not a literal"),
    (("        meta[\"k\"] = value", "        meta |= {}"), "changes meta"),
    (("        meta[\"k\"] = value", "        del meta"), "changes meta"),
    (("def scope(value):", "def scope(meta):"), "a parameter named meta"),
    (("_on = False\n", "_on = False\n_on = True\n"), "exactly one"),
])
def test_shapes_it_does_not_know_are_refused(edit, reason):
    text = HOME_SIMPLE.replace(*edit)
    assert text != HOME_SIMPLE
    with pytest.raises(FX_PATCH.UnknownShape, match=reason):
        rewritten(SPEC, "pkg/state.py", text, FX_PATCH.rewrite_home)


def test_users_through_the_module_an_alias_a_relative_import_or_by_name():
    user = textwrap.dedent('''\
        import pkg.state
        import pkg.state as st
        from pkg import state as other
        from . import state
        from .state import meta, _on as on
        from unrelated import meta_holder

        def f(x):
            pkg.state.meta["a"] = st.meta.get("b")
            other._on = True
            return state.meta, meta.get("c"), on, x.meta, meta_holder.meta
        ''')
    text = rewritten(SPEC, "pkg/user.py", user, FX_PATCH.rewrite_user)
    assert 'pkg.state._orch_tls_get_meta()["a"] = st._orch_tls_get_meta().get("b")' in text
    assert "other._orch_tls_set__on(True)" in text
    assert "from .state import _orch_tls_get_meta, _orch_tls_get__on as on" in text
    assert 'return state._orch_tls_get_meta(), _orch_tls_get_meta().get("c"), on(), x.meta, ' \
        "meta_holder.meta" in text  # other objects' attributes of that name stay


def test_a_user_that_rebinds_a_name_it_imported_is_refused():
    user = "from pkg.state import meta\n\ndef f():\n    meta = {}\n    return meta\n"
    with pytest.raises(FX_PATCH.UnknownShape, match="rebinds meta"):
        rewritten(SPEC, "pkg/user.py", user, FX_PATCH.rewrite_user)


def test_classify_says_where_and_whether_the_release_has_the_state():
    assert FX_PATCH.classify(SPEC, HOME_SIMPLE.encode())[:2] == ("global", 4)
    assert FX_PATCH.classify(SPEC, b"x = 1\n")[0] == "absent"      # no scope(): not here
    assert FX_PATCH.classify(SPEC, b"def scope(): pass\n")[0] == "unknown"
    assert FX_PATCH.classify(SPEC, None)[0] == "absent"
