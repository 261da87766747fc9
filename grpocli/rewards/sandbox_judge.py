"""The judge of a case whose tests are code grpo cannot take apart (HumanEval's ``check(candidate)``,
loops, helpers); stdlib only, run by ``sandbox_harness`` in a sandboxed process of its own.

The solution never runs here. The judge's process holds the test code and runs it; each name the tests
use but do not define (``candidate``'s function, say) is a stand-in that asks the solution's process,
over a pipe, to call the function with these arguments, and gets back what it returned as plain data
(``case_values``): the tests compare the judge's own builtin objects. What the solution raised is
raised here (a builtin exception by name, else ``RemoteError``). The judge writes its token to the
verdict descriptor only when the tests ran through; the solution's process has neither. The
judge's process is not dumpable: its memory and descriptors are closed to ptrace and /proc even for
a process of the same uid.

What cannot cross: objects that are not plain data (an instance of the solution's class, a generator),
mutation of an argument in place. A test that needs them fails.
"""

import builtins
import json
import os
import traceback

from grpocli.rewards import case_values

FAILED, CRASHED = 3, 4
REPLY_CAP = 16 << 20  # bytes of one answer from the solution's process


class Gone(Exception):
    """The solution's process ended, or answered what is not an answer."""


class RemoteError(Exception):
    """An exception the solution raised whose type is not a builtin one."""


class _Link:
    def __init__(self, out_fd, in_fd):
        self.out = out_fd
        self.replies = os.fdopen(in_fd, "rb")

    def ask(self, request):
        data = (json.dumps(request, separators=(",", ":")) + "\n").encode()
        try:
            while data:
                data = data[os.write(self.out, data):]
        except OSError as exc:
            raise Gone(f"the solution's process is gone ({exc})") from None
        line = self.replies.readline(REPLY_CAP + 1)
        if not line.endswith(b"\n"):
            raise Gone("the solution's process ended" if not line else "an answer longer than 16 MiB")
        try:
            reply = case_values.loads(line)
        except ValueError as exc:
            raise Gone(f"an answer that does not parse: {exc}") from None
        if not isinstance(reply, list) or not reply:
            raise Gone("an answer that is not a message")
        if reply[0] in ("exit", "fatal"):
            raise Gone(f"the solution ended before its tests ran: {reply}")
        return reply


def _raised(name, message):
    kind = getattr(builtins, str(name), None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        return kind(message)
    return RemoteError(f"{name}: {message}")


class _Function:
    """Stands in for a function of the solution: calls it in the solution's process."""

    def __init__(self, link, name):
        self.link, self.name = link, name

    def __repr__(self):
        return f"<the solution's {self.name}>"

    def __call__(self, *args, **kwargs):
        reply = self.link.ask(["call", self.name, case_values.encode(list(args)), case_values.encode(kwargs)])
        if reply[0] == "ok":
            return reply[1]
        if reply[0] == "raised":
            raise _raised(reply[1], reply[2])
        if reply[0] == "opaque":
            raise TypeError(f"{self.name} returned what is not plain data: {reply[1]}")
        raise Gone(f"an answer of unknown kind {str(reply[0])[:40]!r}")


def _scope(link, names):
    scope = {"__name__": "__main__", "__builtins__": builtins}
    if not names:
        return scope
    reply = link.ask(["names", names])
    if reply[0] != "names" or not isinstance(reply[1], list):
        raise Gone("an answer to 'names' that is not one")
    for name, kind, *value in reply[1]:
        if name not in names:
            continue
        if kind == "callable":
            scope[name] = _Function(link, name)
        elif kind == "value" and value:
            scope[name] = value[0]
    return scope


def judge(payload, fds):
    link = _Link(fds["requests"], fds["replies"])
    try:
        scope = _scope(link, payload["names"])
        exec(compile(payload["tests"], "tests.py", "exec"), scope)  # noqa: S102 - the row's own tests
    except Gone as exc:
        print(f"grpo judge: {exc}", flush=True)
        os._exit(FAILED)
    except AssertionError:
        traceback.print_exc()
        os._exit(FAILED)
    except BaseException:  # noqa: BLE001 - the tests raised (or what the solution raised reached them)
        traceback.print_exc()
        os._exit(CRASHED)
    os.write(fds["verdict"], payload["token"].encode())
    os._exit(0)
