"""pystack's output of a real deadlock, as the stack tests read it."""

from __future__ import annotations

import textwrap


DEADLOCK = textwrap.dedent('''
    import threading, time
    compile_lock = threading.Lock()
    started = threading.Event()

    def compile_step():
        time.sleep(600)                # a "compile" that never ends

    def first():
        with compile_lock:
            started.set()
            compile_step()

    def others():
        started.wait(30)
        with compile_lock:
            pass

    threads = [threading.Thread(target=first, name="drafter-0")]
    threads += [threading.Thread(target=others, name=f"drafter-{n}") for n in (1, 2)]
    for t in threads: t.start()
    print("ready", flush=True)
    for t in threads: t.join()
''')
