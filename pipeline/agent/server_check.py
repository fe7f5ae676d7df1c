"""Before a step's first attempt: does the model server answer, and does it serve the model the settings name?

Unasked, a batch whose server is down spends every attempt on the client's retries with backoff, stores each as an
infrastructure fault, retries it and goes on through the whole batch without saying the server is down. Asked once
up front (a GET of its model list: no tokens spent), the step stops in seconds, saying which URL, which model and
how to start it, before anything is written.
"""

from __future__ import annotations

CHECK_TIMEOUT = 10.0  # seconds for one request of the check
# where each role's server and model are set, for the messages
SETTINGS = {"policy": "policy.", "teacher": "guidance.teacher_", "evaluation": "training.evaluation."}


class ServerCheckError(ValueError):
    """The model server a step needs does not answer, refuses the key, or does not serve the model: nothing ran.
    Not an infrastructure fault to retry the step on (assets/resources.py): a person has to start or fix it. Raised
    `from None`: its message carries the cause, and `handhold run` prints a failed step's innermost cause."""


def check_server(client, role: str) -> None:
    """Ask `client`'s model server once (a policy, or an LLM teacher), for `role` ('policy' or 'teacher'); a client
    with no server (the heuristic, a local model, the rule teacher) has no `check_server` and passes."""
    check = getattr(client, "check_server", None)
    if check is not None:
        check(role)


def serve_hint(role: str, model: str, url: str, openai_compatible: bool = True) -> str:
    """How to start the server a role needs, or point the settings at the one that runs."""
    prefix = SETTINGS.get(role, f"{role}.")
    if not openai_compatible and not url:
        return (f"check {prefix}model (an Anthropic model id or alias, e.g. claude-sonnet-4-5) and the key "
                f"({prefix}api_key_env)")
    tools = " --enable-auto-tool-choice --tool-call-parser hermes" if role in ("policy", "evaluation") else ""
    where = (f"set {prefix}base_url to where it runs, serving each checkpoint under its stage's name"
             if role == "evaluation" else f"set {prefix}base_url to where it runs and {prefix}model to a model it serves")
    return (f"start it, e.g. `vllm serve {model}{tools}` ({'the tool-call parser your model needs; ' if tools else ''}"
            f"--served-model-name {model} to serve a local directory under this name; --port for another port), "
            f"or {where}")


def unanswered(role: str, model: str, url: str, error: Exception, openai_compatible: bool = True) -> str:
    """Why a request of the check failed, in words that say what to change."""
    where = f"the {role} server at {url or 'the client default'}"
    status = getattr(error, "status_code", None)
    key = SETTINGS.get(role, f"{role}.") + "api_key_env"
    if status is None:  # no HTTP answer: refused, unresolvable, timed out
        why = f"{where} does not answer ({type(error).__name__}: {error})"
    elif status in (401, 403):
        return (f"{where} refused the key ({status}: {error}); set the environment variable {key} names, or "
                f"start the server without --api-key; nothing ran")
    elif status == 404 and openai_compatible:
        why = f"{where} has no /models ({status}); {url} should be the server's root including /v1"
    else:
        why = f"{where} answered {status} ({error})"
    return f"{why}; it must serve {model}: {serve_hint(role, model, url, openai_compatible)}; nothing ran"


def not_served(role: str, model: str, url: str, listed: list[str], openai_compatible: bool = True) -> str:
    """A server that answers but does not list `model`, and what to do."""
    return (f"the {role} server at {url or 'the client default'} does not serve {model!r} (it lists "
            f"{listed or 'no model'}): {serve_hint(role, model, url, openai_compatible)}; nothing ran")


def listed_models(client, role: str, model: str, url: str) -> list[str]:
    """The model names an OpenAI-compatible server lists (GET /models), asked once with a short timeout; its
    failure is a ServerCheckError naming `url` and `model`."""
    import openai

    try:
        return sorted(m.id for m in client.with_options(timeout=CHECK_TIMEOUT, max_retries=0).models.list())
    except openai.APIError as exc:
        raise ServerCheckError(unanswered(role, model, url, exc)) from None
