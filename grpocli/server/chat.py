"""Chat requests before they reach the engine: who may bring a template, rendering the conversation
off the engine thread in bounded time, and the bound on any prompt text the engine tokenizes.

A chat template is code that runs on the server: one that loops (``{% for i in range(100000) %}
{% for j in range(100000) %}``) runs for hours. As vLLM's own server does, a request that brings
its own (``chat_template``, or ``chat_template`` inside ``chat_template_kwargs``) is refused with
a 400 unless the server was started with ``--trust-request-chat-template``. Whatever template
renders (the model's own, or a trusted request's) renders on the request's thread, never the
engine's, through vLLM's renderer (transformers' sandboxed jinja environment), and is stopped
after ``RENDER_TIMEOUT`` s: a trace function on that thread watches the template's own code (jinja
compiles a template to Python whose file is "<template>") and raises once the time is up. The
text that comes out is bounded before the engine thread tokenizes it (``check_text_length``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from grpocli.serving.access import ServerError

#: Longest one conversation may take to render (s); a template still running then is stopped (400).
RENDER_TIMEOUT = 5.0
#: The file name jinja gives the Python code of a template compiled from a string.
TEMPLATE_FILE = "<template>"
TRUST_FLAG = "--trust-request-chat-template"


class RenderTimeout(BaseException):
    """Raised inside a template's code when its time is up (a BaseException: the renderers' own
    ``except Exception`` must not turn it into an ordinary template error)."""


def template_fields(req: Any) -> list[tuple[str, str]]:
    """The templates a chat request brings: (field, template) pairs."""
    kwargs = req.chat_template_kwargs or {}
    found = [("chat_template", req.chat_template), ("chat_template_kwargs.chat_template", kwargs.get("chat_template"))]
    return [(name, t) for name, t in found if t is not None]


def check_templates(req: Any, *, trusted: bool) -> None:
    """400 for a request's own template unless the server trusts them; a trusted one must parse."""
    for name, template in template_fields(req):
        if not trusted:
            raise ServerError(400, f"{name}: this server does not run chat templates sent with a request (a "
                                   "template is code that runs on the server); leave the field out to use the "
                                   f"model's own template, or start grpo vllm-serve with {TRUST_FLAG}")
        if not isinstance(template, str):
            raise ServerError(400, f"{name}: a chat template is a string, not {type(template).__name__}")
        import jinja2

        try:
            _compile(template)
        except jinja2.TemplateSyntaxError as exc:
            raise ServerError(400, f"{name}: the template does not parse (line {exc.lineno}: {exc.message}); "
                                   "send a valid jinja template, or leave the field out") from None


def _compile(template: str) -> None:
    """Compile ``template`` as transformers will render it (its sandboxed environment and extensions:
    loop controls, {% generation %}); jinja2.TemplateSyntaxError if it does not parse."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # another transformers: the sandbox with jinja's loop controls
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        ImmutableSandboxedEnvironment(extensions=[jinja2.ext.loopcontrols]).parse(template)
        return
    _compile_jinja_template(template)


async def render_off_engine(llm: Any, req: Any, *, text_limit: int) -> list[dict[str, Any]]:
    """``render_chat`` on a worker thread (never the engine's); a server that stops meanwhile answers
    503 and leaves the thread, which ends by its own deadline."""
    import asyncio

    import anyio.to_thread

    try:
        return await anyio.to_thread.run_sync(lambda: render_chat(llm, req, text_limit=text_limit),
                                              abandon_on_cancel=True)
    except asyncio.CancelledError:
        raise ServerError(503, "the server is shutting down; this request was dropped before it reached "
                               "the engine") from None


def render_chat(llm: Any, req: Any, *, text_limit: int, timeout: float = RENDER_TIMEOUT) -> list[dict[str, Any]]:
    """The engine's prompt for the conversation, rendered by vLLM's renderer as ``LLM.chat`` would (its template, the request's tools and kwargs) but on the calling
    thread, in at most ``timeout`` s; the text bounded by ``text_limit`` characters."""
    from vllm.renderers import ChatParams, merge_kwargs
    from vllm.utils.mistral import is_mistral_tokenizer

    renderer = llm.renderer
    tokenize = is_mistral_tokenizer(renderer.tokenizer) or llm.model_config.enable_prompt_embeds
    options = {"add_generation_prompt": req.add_generation_prompt, "tools": req.tools, "tokenize": tokenize,
               "continue_final_message": req.continue_final_message}
    params = ChatParams(chat_template=req.chat_template if req.chat_template is not None else llm.chat_template,
                        chat_template_content_format="auto",
                        chat_template_kwargs=merge_kwargs(req.chat_template_kwargs, options))
    where = template_fields(req)[0][0] if template_fields(req) else "messages"
    try:
        with bounded(timeout):
            _, prompt = renderer.render_messages(req.messages, params)
    except RenderTimeout:
        raise ServerError(400, f"{where}: rendering the conversation with the chat template took more than "
                               f"{timeout:g} s and was stopped (a template that loops?); nothing reached the "
                               "engine") from None
    except RecursionError:
        raise ServerError(400, f"{where}: the chat template recursed too deep and was stopped") from None
    except Exception as exc:
        raise _template_error(exc, where) from None
    text = prompt.get("prompt")
    if isinstance(text, str):
        check_text_length([text], text_limit, where=f"{where} (rendered)")
    return [prompt]


def _template_error(exc: Exception, where: str) -> Exception:
    """A rendering error as a 400 naming the field (the template's own errors, bad messages), or as it is."""
    import jinja2

    from grpocli.server.host import is_bad_input

    if isinstance(exc, (jinja2.TemplateError, AttributeError)) or is_bad_input(exc):
        return ServerError(400, f"{where}: the chat template could not render this conversation: "
                                f"{type(exc).__name__}: {exc}")
    return exc


@contextmanager
def bounded(seconds: float) -> Iterator[None]:
    """Within the block, template code on this thread raises RenderTimeout once ``seconds`` have
    passed (checked at each line it runs: a loop cannot escape it); other code runs untraced."""
    deadline = time.monotonic() + seconds

    def in_template(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise RenderTimeout()
        return in_template

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        return in_template if frame.f_code.co_filename == TEMPLATE_FILE else None

    before = sys.gettrace()
    sys.settrace(on_call)
    try:
        yield
    finally:
        sys.settrace(before)


def check_text_length(texts: list[str], limit: int, *, where: str) -> None:
    """400 for a prompt text too long to fit the engine's context whatever its tokens: its
    tokenization on the engine thread would hold every other request for nothing."""
    for i, text in enumerate(texts):
        if len(text) > limit:
            at = f"{where}[{i}]" if len(texts) > 1 else where
            raise ServerError(400, f"{at}: {len(text)} characters cannot fit the engine's context (at most "
                                   f"{limit} characters: max_model_len tokens of the longest token's length); "
                                   "send a shorter prompt")


__all__ = ["RENDER_TIMEOUT", "TRUST_FLAG", "RenderTimeout", "bounded", "check_templates", "check_text_length",
           "render_chat", "render_off_engine", "template_fields"]
