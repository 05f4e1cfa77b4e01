"""The Invocation (orchestrator/ground/invocation.py): a command's streams, environment,
folder and interrupt token, current per thread and handed on to threads explicitly."""

from __future__ import annotations

import io
import os
import signal
import threading

import pytest

from orchestrator.ground import console, invocation
from orchestrator.ground.invocation import Interrupt, Invocation


def made(env=None, cwd="/srv/here", **kwargs) -> Invocation:
    return Invocation(io.StringIO(), io.StringIO(), io.StringIO(), env=env or {}, cwd=cwd, **kwargs)


@pytest.mark.parametrize("path", ["~", "~/", "~/.ssh/config", "~root/x", "~nosuchuser-x/y",
                                  "relative/~", "/abs/~/x", "~x~"])
@pytest.mark.parametrize("home", ["/home/someone", "/home/someone/", "/"])
def test_expanduser_is_pythons_with_the_commands_home(monkeypatch, path, home):
    monkeypatch.setenv("HOME", home)
    assert made({"HOME": home}).expanduser(path) == os.path.expanduser(path)


def test_expanduser_without_home_asks_the_password_database(monkeypatch):
    monkeypatch.delenv("HOME")
    assert made({}).expanduser("~/x") == os.path.expanduser("~/x")


def test_a_path_is_relative_to_the_commands_folder():
    command = made({"HOME": "/home/me"}, cwd="/srv/here")
    assert command.path("inventory.yaml") == "/srv/here/inventory.yaml"
    assert command.path("../there/x") == "/srv/there/x"
    assert command.path("~/inv.yaml") == "/home/me/inv.yaml"
    assert command.path("/etc/x") == "/etc/x"


class Closable:
    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


def test_setting_the_token_closes_what_is_filed_and_check_raises_the_signals_exception():
    token = Interrupt()
    filed, forgotten, after = Closable(), Closable(), Closable()
    called = []
    token.file(filed)
    with token.closing(forgotten):
        pass
    token.on_set(lambda: called.append(1))
    token.check()   # not set: nothing
    token.set(signal.SIGTERM)
    token.set(signal.SIGINT)   # the first signal counts, once
    assert (filed.closed, forgotten.closed, called) == (1, 0, [1])
    token.file(after)   # a channel opened after the interrupt is closed at once
    assert after.closed == 1
    with pytest.raises(SystemExit) as stopped:
        token.check()
    assert stopped.value.code == 128 + signal.SIGTERM


def test_sigint_raises_keyboard_interrupt_and_close_filed_does_not_set():
    token = Interrupt()
    channel = Closable()
    token.file(channel)
    token.close_filed()
    assert channel.closed == 1 and not token.is_set()
    token.set(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        token.check()


def test_a_detached_invocation_keeps_the_world_and_never_interrupts():
    command = made({"HOME": "/h"})
    detached = command.detached()
    assert (detached.env, detached.cwd, detached.stdout) == (command.env, command.cwd, command.stdout)
    session = Closable()
    detached.interrupt.file(session)
    command.interrupt.set(signal.SIGINT)
    detached.interrupt.set(signal.SIGINT)
    assert session.closed == 0
    detached.interrupt.check()


def test_current_is_per_thread_and_bind_hands_it_on():
    command = made()
    seen = {}

    def look(name):
        seen[name] = invocation.current()
    with invocation.using(command):
        plain = threading.Thread(target=look, args=("plain",))
        bound = threading.Thread(target=invocation.bind(look), args=("bound",))
        for thread in (plain, bound):
            thread.start()
            thread.join()
        assert invocation.current() is command
    assert seen == {"plain": invocation.from_process(), "bound": command}
    assert invocation.current() is invocation.from_process()


def test_two_commands_print_to_their_own_streams_at_once():
    commands = [made({"TERM": "dumb"}), made({"TERM": "dumb"})]
    barrier = threading.Barrier(2)

    def run(number):
        with invocation.using(commands[number]):
            barrier.wait()
            for _ in range(50):
                console.error(f"from {number}")
                console.print_json({"n": number})
    threads = [threading.Thread(target=run, args=(n,)) for n in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for number, command in enumerate(commands):
        assert command.stderr.getvalue() == f"orch: error: from {number}\n" * 50
        assert command.stdout.getvalue() == f'{{\n  "n": {number}\n}}\n' * 50


def test_only_a_command_that_owns_the_signals_installs_a_handler():
    handler = lambda number, frame: None  # noqa: E731
    before = signal.getsignal(signal.SIGUSR1)
    with made().signal_handler(signal.SIGUSR1, handler) as installed:
        assert not installed and signal.getsignal(signal.SIGUSR1) is before
    with invocation.from_process().signal_handler(signal.SIGUSR1, handler) as installed:
        assert installed and signal.getsignal(signal.SIGUSR1) is handler
    assert signal.getsignal(signal.SIGUSR1) is before


def _code_of(module_name: str):
    """A function whose frames belong to module `module_name`: it sends this process a
    Ctrl-C and gives the handler a few bytecodes to run in."""
    namespace = {"__name__": module_name, "os": os, "signal": signal}
    exec("def press_ctrl_c():\n"
         "    os.kill(os.getpid(), signal.SIGINT)\n"
         "    for _ in range(1000):\n"
         "        pass\n", namespace)
    return namespace["press_ctrl_c"]


def test_ctrl_c_inside_paramiko_sets_the_token_instead_of_raising_there():
    command = invocation.from_process()
    inside_paramiko = _code_of("paramiko.transport")
    with command.ctrl_c_outside_locks():
        inside_paramiko()                       # raised here, it could leave a lock held
        assert command.interrupt.is_set() and command.interrupt.signal == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            command.interrupt.check()           # what the transport does on its way out
        with pytest.raises(KeyboardInterrupt):
            inside_paramiko()                   # a second press raises wherever it lands
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_elsewhere_raises_as_python_does_and_each_command_gets_a_fresh_token():
    command = invocation.from_process()
    with command.ctrl_c_outside_locks():
        with pytest.raises(KeyboardInterrupt):
            _code_of("orchestrator.playbook.engine")()
        assert not command.interrupt.is_set()   # nothing closed: finally blocks clean up
        _code_of("paramiko.channel")()
    assert command.interrupt.is_set()
    assert not invocation.from_process().interrupt.is_set()


def test_a_command_of_the_agent_leaves_the_signals_alone():
    with made().ctrl_c_outside_locks():
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
